"""foxc: compiled decay-gated softmax attention (FoX, ALiBi, causal, windowed, ...) with
Adaptive Computation Pruning, for NumPy arrays (CPU backend) and torch CUDA tensors (NVPTX
kernels on torch's current stream).

    import foxc
    attn = foxc.load("examples/fox.attn")          # a path or DSL text; compiles once
    out = attn(q=q, k=k, v=v, fgate=fgate)           # keyword names are the DSL parameters

The compiler (LLVM inside) and the runtime live in the extension ``foxc._foxc``: no subprocess.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

from . import _foxc
from ._foxc import CompileError, cache_info
from .cache import KVCache, evictable

__all__ = [
    "load",
    "reference",
    "reference_grad",
    "Attention",
    "KVCache",
    "evictable",
    "CompileError",
    "cache_info",
    "fox",
    "__version__",
]
__version__ = _foxc.__version__


class Attention:
    """A compiled attention program; call it with the DSL parameters as keywords."""

    def __init__(self, program: "_foxc.Program"):
        self._program = program
        self._gpu_plans: dict = {}
        self._grad_plans: dict = {}
        # Plain Python copies of the metadata: torch.compile traces attribute reads of these
        # (a call into the extension would be a graph break).
        #: The process-wide id of the compiled program (what the torch op carries).
        self.id: int = program.id
        #: The attention's name in the DSL.
        self.name: str = program.name
        self.source: str = program.source
        #: ``[(name, dtype, [dims])]`` of the parameters, in declaration order.
        self.signature: list = [(n, t, list(d)) for n, t, d in program.params]
        #: The parameter names, in declaration order.
        self.params: list = [p[0] for p in self.signature]
        #: ``(dtype, [dims])`` of the output.
        self.output: Tuple[str, list] = tuple(program.output)
        #: ``(prune, log_eps, prune_rule)``.
        self.options: Tuple[bool, float, str] = tuple(program.options)

    def ir(self, stage: str = "opt", target: str = "cpu", dims: Optional[Dict[str, int]] = None) -> str:
        """The IR text: ``stage="ir"`` as lowered, ``"opt"`` after the passes for ``target``
        (with the sizes ``dims`` bound, e.g. ``{"D": 128, "N": 1}``: the tiles and kernel a call
        with tensors of those sizes gets)."""
        return self._program.ir(stage, target, dims)

    def explain(self) -> str:
        """Why attention was or was not recognized and pruned."""
        return "\n".join(self._program.explain())

    def __repr__(self) -> str:
        return repr(self._program)

    def bind_dims(self, shapes: Dict[str, Sequence[int]]) -> Dict[str, int]:
        """The sizes of the signature's symbolic dims that the shapes of the named tensors give
        (any subset of the parameters); a ValueError names the tensor and axis that disagree."""
        dims: Dict[str, Tuple[int, str, int]] = {}
        for name, _, decl in self.signature:
            if name not in shapes:
                continue
            shape = shapes[name]
            if len(decl) != len(shape):
                raise ValueError(
                    f"input `{name}` has rank {len(shape)} (shape {tuple(shape)}), "
                    f"but `{self.name}` declares [{', '.join(decl)}]"
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
                dims.setdefault(d, (int(size), name, axis))
        return {d: v[0] for d, v in dims.items()}

    # ---- running it
    def __call__(self, **tensors: Any):
        # `_TORCH` is torch once foxc.torch is imported (dynamo-friendly: a global and an
        # isinstance); torch tensors before that import it on the first call (eager).
        if _TORCH is not None:
            for v in tensors.values():
                if isinstance(v, _TORCH.Tensor):
                    return _torch_attention(self, **tensors)
        if any(type(v).__module__.split(".")[0] == "torch" for v in tensors.values()):
            from . import torch as foxc_torch

            return foxc_torch.attention(self, **tensors)
        from . import _numpy

        return _numpy.run(self._program, tensors)

    def grad(self, dout, **arrays) -> dict:
        """Forward and backward on NumPy arrays (CPU backend): ``{"out": ..., "grad_<p>": ...}``
        for the loss ``sum(out * dout)``, one gradient per float parameter, float32 NumPy.

        The gradient program recomputes the forward (``passes::grad::gradient``); torch tensors
        get their gradients through autograd instead (``out.backward()``)."""
        from . import _numpy

        return _numpy.grad(self._program, arrays, dout)


# Set by foxc.torch when it is imported.
_TORCH = None
_torch_attention = None


def _read_file(path: str) -> str:
    """The text of a source file; bytes that are not UTF-8 are a CompileError with their position
    (as the CLI reports them), not a bare UnicodeDecodeError."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise CompileError(
            f"error: invalid UTF-8 in the source\n --> {path}:{line}:{col}\n"
            f"  = hint: byte {e.start} starts an invalid UTF-8 sequence; is this a text file?"
        ) from None


def _read_source(path_or_source) -> Tuple[str, str]:
    """(text, name for diagnostics) of a path or of DSL text."""
    if isinstance(path_or_source, os.PathLike):
        path = os.fspath(path_or_source)
        return _read_file(path), path
    if not isinstance(path_or_source, str):
        raise TypeError(f"foxc.load takes a path or DSL text, got {type(path_or_source).__name__}")
    s = path_or_source
    # DSL text always holds a brace; a path to an existing file never needs one.
    if "{" not in s and "\n" not in s:
        if not os.path.exists(s):
            raise FileNotFoundError(f"foxc.load: no such file: {s}")
        return _read_file(s), s
    return s, "<string>"


def load(
    path_or_source,
    prune_rule: Optional[str] = None,
    log_eps: float = _foxc.DEFAULT_LOG_EPS,
    no_prune: bool = False,
    tiles: Optional[Tuple[int, int]] = None,
    thresholds=None,
) -> Attention:
    """Compile an attention program (a ``.attn`` path or DSL text) once.

    ``prune_rule``: a rule name from ``foxc rules`` (ACP's safe threshold: "paper", "tight",
    "local", "tight-causal"; None: the first, "paper"); ``log_eps``: ln of the pruned
    attention mass bound per row; ``no_prune``: keep attention dense; ``tiles``: (BM, BN).
    ``thresholds``: instead of a rule, one threshold per query head ``[d_0, ..., d_{H-1}]``,
    each ``<= 0`` (``-inf``: never prune that head): key tile n of query tile m is skipped when
    ``c[i0] - c[jend(n)] < d_h``. The user's choice, NOT a safety proof (docs/RULES.md, "Given
    thresholds"); a call whose H differs from ``len(thresholds)`` raises a ValueError, and
    ``foxc.KVCache`` refuses to evict with it.
    Raises ``foxc.CompileError`` (a ``ValueError``) with foxc's diagnostic for a bad program.
    Loading the same text with the same options again returns the cached compilation.
    """
    text, name = _read_source(path_or_source)
    if thresholds is not None and prune_rule is not None:
        raise ValueError(
            f"thresholds replace the pruning rule: give thresholds or prune_rule={prune_rule!r}, not both"
        )
    prune_rule = _foxc.DEFAULT_PRUNE_RULE if prune_rule is None else prune_rule
    if thresholds is not None:
        try:
            thresholds = [float(d) for d in thresholds]
        except (TypeError, ValueError) as e:
            raise ValueError(f"thresholds: expected a sequence of numbers <= 0, got {thresholds!r}") from e
    prog = _foxc.load(text, name, prune_rule, float(log_eps), bool(no_prune), tiles, None, thresholds)
    # One Attention per compiled program, so its GPU plans are shared by every load.
    return _ATTENTIONS.setdefault(prog.id, Attention(prog))


_ATTENTIONS: dict = {}


def _assuming_norms(attn: Attention, q_max: float, k_max: float) -> Attention:
    """``attn`` compiled again with the promise that every query row has norm <= ``q_max`` and
    every key row <= ``k_max``: its pruning threshold takes them as a static bound and reads no
    norms from the data (no pass over the keys per call). Unchecked here: ``foxc.KVCache``,
    which checks every row it passes, is the caller."""
    rule, log_eps, no_prune, tiles, _, given = attn._program.load_args
    bounds = (float(q_max), float(k_max))
    prog = _foxc.load(attn.source, attn._program.file, rule, log_eps, no_prune, tiles, bounds, given)
    return _ATTENTIONS.setdefault(prog.id, Attention(prog))


def _attention_by_id(program_id: int) -> Attention:
    """The Attention of a program id (what the torch op receives)."""
    a = _ATTENTIONS.get(program_id)
    if a is None:
        a = _ATTENTIONS.setdefault(program_id, Attention(_foxc.by_id(program_id)))
    return a


def reference(attn: Attention, pruned: bool = False, **arrays):
    """The f64 reference interpreter (THE reference) on NumPy inputs, as float64 NumPy.

    Inputs are rounded to the declared dtypes first, as the backends see them. ``pruned=False``
    runs the program as written (dense); ``pruned=True`` the graph after the CPU passes.
    """
    from . import _numpy

    return _numpy.reference(attn._program, arrays, pruned)


def reference_grad(attn: Attention, dout, **arrays) -> dict:
    """``attn.grad``'s gradient program through the f64 interpreter: ``{"out": ..., "grad_<p>":
    ...}`` as float64 NumPy (inputs rounded to the declared dtypes first)."""
    from . import _numpy

    return _numpy.grad_reference(attn._program, arrays, dout)


# FoX in the published kernel's layouts and options (foxc writes the program).
from . import fox  # noqa: E402
