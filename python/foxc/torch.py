"""foxc as a PyTorch op: ``torch.ops.foxc.attention(program_id, [tensors]) -> (out, lse)``.

The op is one ``torch.library.custom_op`` for every program: which compiled program runs is
its int argument (the process-wide id of ``foxc.load``'s result), so ``torch.compile`` sees one
opaque op with a fake (shape) implementation and no graph break. It runs the NVPTX kernels on
the tensors' device and torch's current stream: inputs are used in place, the output, the row
log-sum-exp ``lse`` and the workspace come from torch's allocator (so CUDA graph capture and
streams work as for any torch op; the threshold's counters, which the kernels leave zero, are
kept per plan and stream outside graph capture), and nothing waits for the GPU.

``lse`` (``[B, H, T]`` float32, the attention rows' log-sum-exp as the kernel writes it) is the
second output so that the backward can use it; ``attn(**tensors)`` returns only ``out``.

Autograd: ``attn(**tensors)`` with a tensor that requires grad runs ``foxc::attention_train``
(also returns the attention's unrounded f32 output, ``passes::grad::forward_for_saved``) and
saves the inputs, that output and ``lse`` (``foxc::attention`` called directly saves its bf16
``out``: close, but the decay gradients carry its rounding, and its forward may have kept wider
tiles than the backward does, each skipping only tiles under the eps bound); the backward is a
further op, ``torch.ops.foxc.attention_backward(program_id, inputs, out, lse, dout) -> [grad,
...]`` (one gradient per float input, in parameter order; None for the others), which runs the
saved-forward gradient program (``passes::grad::gradient_from_saved``: the attention is not
recomputed) on the same device and stream. Plans are compiled once per (program, device, head
dims, class of T: rows of one gate-scan segment or longer), for the tiles and prelude the CLI
picks at that shape; the training forward and the backward share the backward's tiles. Both
ops have fake implementations, so ``torch.compile(fullgraph=True)`` traces forward and backward
without graph breaks.

A program whose output is not an attention's own (an output gate or another epilogue after the
attention, a tokens-first layout's transposed copy; ``Program.output_is_attention``) runs through
``torch.ops.foxc.forward(program_id, [tensors]) -> out`` instead: the whole program's plan, no
``lse``; its autograd runs ``torch.ops.foxc.forward_backward(program_id, inputs, dout)``, the
gradient program that recomputes the forward (``passes::grad::gradient``).

torch CPU tensors run on foxc's CPU backend through a host copy (for tests and small runs; the
GPU path copies nothing).
"""

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import _foxc, _workspace
from .cache import KVCache, evictable  # noqa: F401  (the cache holds torch tensors as well)

_TORCH_DTYPES = {
    "f32": torch.float32,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "i32": torch.int32,
    "i64": torch.int64,
}
_INTEGERS = ("i32", "i64")
_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}
_KEPT_ZEROED = _workspace.KeptZeroed()


def _attention_of(program_id: int):
    from . import _attention_by_id

    return _attention_by_id(program_id)


def _bind(attn, shapes: Sequence[Sequence[int]]) -> Dict[str, int]:
    """Bind the symbolic dims of the signature to the sizes of every parameter's tensor, in
    order; a ValueError names the tensor."""
    return attn.bind_dims(dict(zip(attn.params, shapes)))


def _out_shapes(attn, shapes) -> Tuple[List[int], List[int]]:
    dims = _bind(attn, shapes)
    _, out_dims = attn.output
    out_shape = [dims[d] if d in dims else int(d) for d in out_dims]
    return out_shape, out_shape[:-1]


def _launch(plan, tensors: Dict, dev, names: Optional[Sequence[str]] = None) -> List[torch.Tensor]:
    """Allocate the plan's outputs and workspace from torch, enqueue its kernels on torch's
    current stream with ``tensors[i]`` as the buffer of the program's parameter i (named
    ``names[i]`` in errors); return the outputs. (Temporaries freed after the launch are safe:
    torch's allocator reuses memory in stream order.)"""
    outs = [torch.empty(shape, dtype=_TORCH_DTYPES[dtype], device=dev) for _, dtype, shape in plan.outputs]
    # The workspaces: "scratch" buffers in one torch.empty, "zeroed" ones (counters the
    # kernels expect zero and leave zero) in one torch.zeros, kept per stream outside graph
    # capture (`_workspace.KeptZeroed`), only when the plan has some (a zero-byte buffer takes
    # any valid pointer).
    offsets, totals = _workspace.layout(plan.roles, plan.sizes)
    ws = {"scratch": torch.empty(max(totals["scratch"], 1), dtype=torch.uint8, device=dev)}
    stream = torch.cuda.current_stream(dev).cuda_stream
    z = totals["zeroed"]
    zeros = lambda n: torch.zeros(n, dtype=torch.uint8, device=dev)  # noqa: E731
    if not z:
        ws["zeroed"] = ws["scratch"]
    elif torch.cuda.is_current_stream_capturing():
        ws["zeroed"] = zeros(z)
    else:
        ws["zeroed"] = _KEPT_ZEROED.get(plan, stream, z, zeros)
    ptrs = []
    for (role, i), off, size in zip(plan.roles, offsets, plan.sizes):
        if role in ws:
            ptrs.append(ws[role].data_ptr() + off)
            continue
        t = tensors[i] if role == "input" else outs[i]
        if t.numel() * t.element_size() < size:
            raise RuntimeError(f"foxc: buffer {role} {i} holds {t.numel() * t.element_size()} bytes, the plan needs {size}")
        if role == "input":
            _workspace.check_tensor_address(names[i] if names else f"#{i}", t.data_ptr())
        ptrs.append(t.data_ptr())
    plan.launch(ptrs, stream)
    return outs


def _plan(cache: dict, kind: str, names: Sequence[str], tensors: Sequence[torch.Tensor], make):
    """The GPU plan of this kind for tensors `names` of these shapes on their device: made by
    `make(metas, device_index)` on first use, then kept in `cache` (one of the program's)."""
    dev = tensors[0].device
    key = (kind, dev.index, tuple(tuple(t.shape) for t in tensors))
    plan = cache.get(key)
    if plan is None:
        plan = cache[key] = make(_metas(names, tensors), dev.index)
    return plan


def _fused(attn, plan):
    """`plan` if its outputs start with the attention's `out` and `lse`, else a RuntimeError."""
    if [o[0] for o in plan.outputs][:2] != ["out", "lse"]:
        raise RuntimeError(f"foxc: `{attn.name}` has no fused attention on the GPU (no log-sum-exp)")
    return plan


def _as_read(attn, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """The inputs as the program reads them: an ``i64`` parameter's tensor narrowed to int32,
    saturating as the extension narrows host tensors (``Param::stored``), on the tensor's device
    and torch's stream (the plans take the graph's i32)."""
    lo, hi = -(2**31), 2**31 - 1
    return [
        t.clamp(lo, hi).to(torch.int32) if dtype == "i64" else t
        for (_, dtype, _), t in zip(attn.signature, inputs)
    ]


def _metas(names, tensors) -> Dict:
    return {n: (_NAMES.get(t.dtype, str(t.dtype)), list(t.shape)) for n, t in zip(names, tensors)}


@torch.library.custom_op("foxc::attention", mutates_args=(), device_types="cuda")
def attention_op(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Run compiled program ``program`` on ``inputs`` (the DSL parameters in order)."""
    attn = _attention_of(program)
    _check(attn, inputs)
    inputs = _as_read(attn, inputs)
    make = lambda metas, dev: _fused(attn, attn._program.cuda_plan(metas, dev))  # noqa: E731
    plan = _plan(attn._gpu_plans, "attention", attn.params, inputs, make)
    out, lse = _launch(plan, inputs, inputs[0].device, attn.params)
    return out, lse


@attention_op.register_kernel("cpu")
def _attention_cpu(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch CPU tensors: the CPU backend (a host round trip through bytes)."""
    attn = _attention_of(program)
    _check(attn, inputs)
    r = attn._program.forward_cpu(_wires(attn.params, inputs))
    if "lse" not in r:
        raise RuntimeError(f"foxc: `{attn.name}` has no fused attention (no log-sum-exp)")
    return _from_wire(r["out"], _TORCH_DTYPES[attn.output[0]]), _from_wire(r["lse"], torch.float32)


@attention_op.register_fake
def _attention_fake(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    attn = _attention_of(program)
    _check(attn, inputs)
    out_shape, lse_shape = _out_shapes(attn, [t.shape for t in inputs])
    out_dtype = _TORCH_DTYPES[attn.output[0]]
    return inputs[0].new_empty(out_shape, dtype=out_dtype), inputs[0].new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("foxc::attention_train", mutates_args=(), device_types="cuda")
def attention_train_op(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``foxc::attention`` for training: also the attention's unrounded f32 output ``out_f32``
    (``passes::grad::forward_for_saved``), which the backward reads: the bf16 ``out`` would put
    its rounding into ``delta_i = dout_i . out_i`` and, amplified, into the decay gradients."""
    attn = _attention_of(program)
    _check(attn, inputs)
    inputs = _as_read(attn, inputs)
    make = lambda metas, dev: _fused(attn, attn._program.cuda_plan(metas, dev, True))  # noqa: E731
    plan = _plan(attn._gpu_plans, "train", attn.params, inputs, make)
    return _train_results(_launch(plan, inputs, inputs[0].device, attn.params))


def _train_results(outs) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, out_f32); an f32 output is its own unrounded value (a copy: outputs of a
    custom op must not alias each other)."""
    if len(outs) == 3:
        return outs[0], outs[1], outs[2]
    return outs[0], outs[1], outs[0].clone()


@attention_train_op.register_kernel("cpu")
def _attention_train_cpu(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    attn = _attention_of(program)
    _check(attn, inputs)
    r = attn._program.forward_cpu(_wires(attn.params, inputs), True)
    outs = [_from_wire(r["out"], _TORCH_DTYPES[attn.output[0]]), _from_wire(r["lse"], torch.float32)]
    if "out_f32" in r:
        outs.append(_from_wire(r["out_f32"], torch.float32))
    return _train_results(outs)


@attention_train_op.register_fake
def _attention_train_fake(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, lse = _attention_fake(program, inputs)
    return out, lse, out.new_empty(out.shape, dtype=torch.float32)


def _float_params(attn) -> List[int]:
    """Indices of the float parameters: the ones that get a gradient."""
    return [i for i, (_, dtype, _) in enumerate(attn.signature) if dtype not in _INTEGERS]


@torch.library.custom_op("foxc::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward_op(
    program: int, inputs: List[torch.Tensor], out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
) -> List[torch.Tensor]:
    """The gradient of every float input of ``foxc::attention`` (in parameter order) from the
    forward's inputs, its results ``out`` and ``lse`` and the upstream gradient ``dout``: the
    saved-forward gradient program (no forward recomputed), on torch's current stream."""
    attn = _attention_of(program)
    tensors = _as_read(attn, inputs) + [dout, out.float(), lse]
    plan = _plan(attn._grad_plans, "saved", _grad_names(attn), tensors, attn._program.cuda_grad_plan)
    return _launch(plan, tensors, tensors[0].device)


@attention_backward_op.register_kernel("cpu")
def _attention_backward_cpu(program, inputs, out, lse, dout):
    attn = _attention_of(program)
    tensors = list(inputs) + [dout, out.float(), lse]
    r = attn._program.grad_cpu(_wires(_grad_names(attn), tensors), saved=True)
    return [_from_wire(r[f"grad_{attn.params[i]}"], inputs[i].dtype) for i in _float_params(attn)]


@attention_backward_op.register_fake
def _attention_backward_fake(program, inputs, out, lse, dout):
    attn = _attention_of(program)
    return [torch.empty_like(inputs[i]) for i in _float_params(attn)]


def _grad_names(attn) -> List[str]:
    """The saved-forward gradient program's parameters, in order (passes::grad)."""
    return list(attn.params) + ["dout", "out", "lse"]


def _setup_context(ctx, inputs, output):
    program, tensors = inputs
    out, lse = output
    ctx.program = program
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(*tensors, out, lse)


def _setup_context_train(ctx, inputs, output):
    program, tensors = inputs
    _, lse, out_f32 = output
    ctx.program = program
    ctx.mark_non_differentiable(lse, out_f32)
    ctx.save_for_backward(*tensors, out_f32, lse)


def _grads(ctx, grad_out):
    """One gradient per input (None for the non-float ones) from the saved tensors."""
    attn = _attention_of(ctx.program)
    *tensors, out, lse = ctx.saved_tensors
    grads = attention_backward_op(ctx.program, tensors, out, lse, grad_out.contiguous())
    result: List[Optional[torch.Tensor]] = [None] * len(tensors)
    for i, g in zip(_float_params(attn), grads):
        result[i] = g
    return None, result


def _backward(ctx, grad_out, grad_lse):
    # Direct callers of foxc::attention: the backward reads the bf16 out (training goes through
    # foxc::attention_train, see there).
    return _grads(ctx, grad_out)


def _backward_train(ctx, grad_out, grad_lse, grad_out_f32):
    return _grads(ctx, grad_out)


attention_op.register_autograd(_backward, setup_context=_setup_context)
attention_train_op.register_autograd(_backward_train, setup_context=_setup_context_train)


def _wires(names, tensors) -> Dict:
    """torch CPU tensors as the extension's (dtype, shape, little-endian bytes) triples."""
    out = {}
    for n, t in zip(names, tensors):
        name = _NAMES.get(t.dtype)
        if name not in ("f32", "bf16", "f16", "i32", "i64"):
            raise ValueError(
                f"input `{n}` has dtype {t.dtype}: foxc takes float32, bfloat16, float16, int32 or int64 tensors"
            )
        t = t.detach().contiguous()
        out[n] = (name, list(t.shape), t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return out


def _from_wire(shape_bytes, dtype) -> torch.Tensor:
    shape, data = shape_bytes
    return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape).to(dtype)


def _check(attn, inputs: Sequence[torch.Tensor]) -> None:
    """Dtype, device and contiguity of every input (a ValueError naming the tensor); shapes are
    bound by the caller (fake: `_out_shapes`; eager: the plan, checked in Rust)."""
    if len(inputs) != len(attn.params):
        raise ValueError(f"`{attn.name}` takes {len(attn.params)} tensors ({', '.join(attn.params)}), got {len(inputs)}")
    dev = inputs[0].device
    for (name, dtype, _), t in zip(attn.signature, inputs):
        if t.device.type not in ("cuda", "cpu"):
            raise ValueError(f"input `{name}` is on {t.device}: foxc runs torch tensors on CUDA devices and the CPU")
        if t.device != dev:
            raise ValueError(f"input `{name}` is on {t.device}, but `{attn.params[0]}` is on {dev}")
        if t.dtype != _TORCH_DTYPES[dtype]:
            raise ValueError(f"input `{name}` has dtype {t.dtype}, but `{attn.name}` declares {dtype} (no conversion on the GPU)")
        if not t.is_contiguous():
            raise ValueError(f"input `{name}` is not contiguous (call .contiguous())")


def attention(attn, **tensors: torch.Tensor) -> torch.Tensor:
    """Run ``attn`` on torch CUDA tensors named by its parameters; returns ``out``.

    Everything is checked before any launch (a ValueError naming the tensor): names, dtypes,
    devices, contiguity and shapes (the op and its fake check again: direct op calls and
    torch.compile get the same errors)."""
    names = attn.params
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ValueError(f"missing input tensor(s) {', '.join(missing)}: `{attn.name}` takes {', '.join(names)}")
    for n in tensors:
        if n not in names:
            raise ValueError(f"unexpected input tensor `{n}`: `{attn.name}` takes {', '.join(names)}")
        if not isinstance(tensors[n], torch.Tensor):
            raise ValueError(f"input `{n}` is a {type(tensors[n]).__name__}, not a torch tensor")
    inputs = [tensors[n] for n in names]
    if not torch.compiler.is_compiling():
        # Eager: check here, before the dispatcher picks a device; traced, the fake does.
        _check(attn, inputs)
        _bind(attn, [t.shape for t in inputs])
    if not attn._program.output_is_attention:
        # An epilogue or a layout copy after the attention: the program as it is.
        return forward_op(attn.id, inputs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        # Training: the op that also keeps the attention's unrounded output for the backward.
        return attention_train_op(attn.id, inputs)[0]
    return attention_op(attn.id, inputs)[0]


# Programs whose output is not an attention's own (an epilogue such as an output gate, a layout
# copy): `foxc::forward` runs the program as it is and returns its output; its backward,
# `foxc::forward_backward`, runs the gradient program that recomputes the forward
# (`passes::grad::gradient`), on the same device and stream.


@torch.library.custom_op("foxc::forward", mutates_args=(), device_types="cuda")
def forward_op(program: int, inputs: List[torch.Tensor]) -> torch.Tensor:
    """Run compiled program ``program`` on ``inputs``; its output (no log-sum-exp)."""
    attn = _attention_of(program)
    _check(attn, inputs)
    inputs = _as_read(attn, inputs)
    plan = _plan(attn._gpu_plans, "program", attn.params, inputs, attn._program.cuda_plan)
    return _launch(plan, inputs, inputs[0].device, attn.params)[0]


@forward_op.register_kernel("cpu")
def _forward_cpu(program: int, inputs: List[torch.Tensor]) -> torch.Tensor:
    attn = _attention_of(program)
    _check(attn, inputs)
    r = attn._program.forward_cpu(_wires(attn.params, inputs))
    return _from_wire(r["out"], _TORCH_DTYPES[attn.output[0]])


@forward_op.register_fake
def _forward_fake(program: int, inputs: List[torch.Tensor]) -> torch.Tensor:
    attn = _attention_of(program)
    _check(attn, inputs)
    out_shape, _ = _out_shapes(attn, [t.shape for t in inputs])
    return inputs[0].new_empty(out_shape, dtype=_TORCH_DTYPES[attn.output[0]])


@torch.library.custom_op("foxc::forward_backward", mutates_args=(), device_types="cuda")
def forward_backward_op(program: int, inputs: List[torch.Tensor], dout: torch.Tensor) -> List[torch.Tensor]:
    """The gradient of every float input of ``foxc::forward`` (in parameter order) from its
    inputs and ``dout``: the gradient program that recomputes the forward."""
    attn = _attention_of(program)
    tensors = _as_read(attn, inputs) + [dout]
    make = lambda metas, dev: attn._program.cuda_grad_plan(metas, dev, False)  # noqa: E731
    plan = _plan(attn._grad_plans, "recomputed", list(attn.params) + ["dout"], tensors, make)
    outs = dict(zip([o[0] for o in plan.outputs], _launch(plan, tensors, tensors[0].device)))
    return [outs[f"grad_{attn.params[i]}"] for i in _float_params(attn)]


@forward_backward_op.register_kernel("cpu")
def _forward_backward_cpu(program, inputs, dout):
    attn = _attention_of(program)
    r = attn._program.grad_cpu(_wires(list(attn.params) + ["dout"], list(inputs) + [dout]), saved=False)
    return [_from_wire(r[f"grad_{attn.params[i]}"], inputs[i].dtype) for i in _float_params(attn)]


@forward_backward_op.register_fake
def _forward_backward_fake(program, inputs, dout):
    attn = _attention_of(program)
    return [torch.empty_like(inputs[i]) for i in _float_params(attn)]


def _setup_forward(ctx, inputs, output):
    program, tensors = inputs
    ctx.program = program
    ctx.save_for_backward(*tensors)


def _backward_forward(ctx, grad_out):
    attn = _attention_of(ctx.program)
    tensors = list(ctx.saved_tensors)
    grads = forward_backward_op(ctx.program, tensors, grad_out.contiguous().to(_TORCH_DTYPES[attn.output[0]]))
    result: List[Optional[torch.Tensor]] = [None] * len(tensors)
    for i, g in zip(_float_params(attn), grads):
        result[i] = g
    return None, result


forward_op.register_autograd(_backward_forward, setup_context=_setup_forward)


def _register() -> None:
    import foxc  # the package (initialized before any of its submodules)

    foxc._TORCH = torch
    foxc._torch_attention = attention


_register()
