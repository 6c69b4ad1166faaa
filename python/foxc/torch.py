"""foxc as a PyTorch op: ``torch.ops.foxc.attention(program_id, [tensors]) -> (out, lse)``.

The op is one ``torch.library.custom_op`` for every program: which compiled program runs is
its int argument (the process-wide id of ``foxc.load``'s result), so ``torch.compile`` sees one
opaque op with a fake (shape) implementation and no graph break. It runs the NVPTX kernels on
the tensors' device and torch's current stream: inputs are used in place, the output, the row
log-sum-exp ``lse`` and the workspace come from torch's allocator (so CUDA graph capture and
streams work as for any torch op), and nothing waits for the GPU.

``lse`` (``[B, H, T]`` float32, the attention rows' log-sum-exp as the kernel writes it) is the
second output so that the backward can use it; ``attn(**tensors)`` returns only ``out``.

Backward: ``register_backward(fn)`` plugs it in (``fn(program_id, inputs, out, lse, grad_out)``
returns one gradient or None per input); until then ``out.backward()`` raises a clear error.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import _foxc

_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}
# Device buffers of a plan start at this alignment inside the one workspace allocation.
_ALIGN = 256

_backward_impl: Optional[Callable] = None


def _attention_of(program_id: int):
    from . import _attention_by_id

    return _attention_by_id(program_id)


def _bind(attn, shapes: Sequence[Sequence[int]]) -> Dict[str, int]:
    """Bind the symbolic dims of the signature to sizes; a ValueError names the tensor."""
    dims: Dict[str, Tuple[int, str, int]] = {}
    for (name, _, decl), shape in zip(attn.signature, shapes):
        if len(decl) != len(shape):
            raise ValueError(
                f"input `{name}` has rank {len(shape)} (shape {tuple(shape)}), "
                f"but `{attn.name}` declares [{', '.join(decl)}]"
            )
        for axis, (d, size) in enumerate(zip(decl, shape)):
            if d.isdigit():
                if int(d) != size:
                    raise ValueError(f"input `{name}` axis {axis} has size {size}, but it is declared {d}")
                continue
            if d in dims and dims[d][0] != size:
                bound, by, by_axis = dims[d]
                raise ValueError(
                    f"input `{name}` axis {axis} ({d}) has size {size}, but {d} = {bound} "
                    f"was fixed by `{by}` axis {by_axis}"
                )
            dims.setdefault(d, (size, name, axis))
    return {d: v[0] for d, v in dims.items()}


def _out_shapes(attn, shapes) -> Tuple[List[int], List[int]]:
    dims = _bind(attn, shapes)
    _, out_dims = attn.output
    out_shape = [dims[d] if d in dims else int(d) for d in out_dims]
    return out_shape, out_shape[:-1]


@torch.library.custom_op("foxc::attention", mutates_args=(), device_types="cuda")
def attention_op(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Run compiled program ``program`` on ``inputs`` (the DSL parameters in order)."""
    attn = _attention_of(program)
    _check(attn, inputs)
    dev = inputs[0].device
    key = (dev.index, tuple(tuple(t.shape) for t in inputs))
    plan = attn._gpu_plans.get(key)
    if plan is None:
        metas = {n: (_NAMES.get(t.dtype, str(t.dtype)), list(t.shape)) for n, t in zip(attn.params, inputs)}
        plan = attn._program.cuda_plan(metas, dev.index)
        if plan.lse_shape is None:
            raise RuntimeError(f"foxc: the GPU plan of `{attn.name}` has no log-sum-exp buffer")
        attn._gpu_plans[key] = plan
    out = torch.empty(plan.out_shape, dtype=_TORCH_DTYPES[plan.out_dtype], device=dev)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=dev)
    offsets, total = [], 0
    for (role, _), size in zip(plan.roles, plan.sizes):
        offsets.append(total)
        if role == "scratch":
            total += (size + _ALIGN - 1) // _ALIGN * _ALIGN
    ws = torch.empty(max(total, 1), dtype=torch.uint8, device=dev)
    ptrs = []
    for (role, i), off, size in zip(plan.roles, offsets, plan.sizes):
        t = {"input": lambda: inputs[i], "output": lambda: out, "lse": lambda: lse}.get(role)
        if t is None:
            ptrs.append(ws.data_ptr() + off)
            continue
        t = t()
        if t.numel() * t.element_size() < size:
            raise RuntimeError(f"foxc: buffer {role} {i} holds {t.numel() * t.element_size()} bytes, the plan needs {size}")
        ptrs.append(t.data_ptr())
    plan.launch(ptrs, torch.cuda.current_stream(dev).cuda_stream)
    return out, lse


@attention_op.register_fake
def _attention_fake(program: int, inputs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    attn = _attention_of(program)
    _check(attn, inputs)
    out_shape, lse_shape = _out_shapes(attn, [t.shape for t in inputs])
    out_dtype = _TORCH_DTYPES[attn.output[0]]
    return inputs[0].new_empty(out_shape, dtype=out_dtype), inputs[0].new_empty(lse_shape, dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    program, tensors = inputs
    out, lse = output
    ctx.program = program
    ctx.save_for_backward(*tensors, out, lse)


def _backward(ctx, grad_out, grad_lse):
    attn = _attention_of(ctx.program)
    if _backward_impl is None:
        raise RuntimeError(f"foxc: backward not available yet for this program (`{attn.name}`)")
    *tensors, out, lse = ctx.saved_tensors
    return None, list(_backward_impl(ctx.program, tensors, out, lse, grad_out))


attention_op.register_autograd(_backward, setup_context=_setup_context)


def register_backward(fn: Callable) -> None:
    """Plug in the backward: ``fn(program_id, inputs, out, lse, grad_out) -> [grad or None]``."""
    global _backward_impl
    _backward_impl = fn


def _check(attn, inputs: Sequence[torch.Tensor]) -> None:
    """Dtype, device and contiguity of every input (a ValueError naming the tensor); shapes are
    bound by the caller (fake: `_out_shapes`; eager: the plan, checked in Rust)."""
    if len(inputs) != len(attn.params):
        raise ValueError(f"`{attn.name}` takes {len(attn.params)} tensors ({', '.join(attn.params)}), got {len(inputs)}")
    dev = inputs[0].device
    for (name, dtype, _), t in zip(attn.signature, inputs):
        if not t.is_cuda:
            raise ValueError(
                f"input `{name}` is on {t.device}: foxc runs torch tensors on CUDA devices "
                "(NumPy arrays run on the CPU backend)"
            )
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
    return attention_op(attn.id, inputs)[0]


def _register() -> None:
    import foxc  # the package (initialized before any of its submodules)

    foxc._TORCH = torch
    foxc._torch_attention = attention


_register()
