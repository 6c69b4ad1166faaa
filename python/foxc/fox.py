"""The Forgetting Transformer's attention in the layouts and with the options of the published
FoX kernel: foxc writes the DSL program for the choice and compiles it once.

    attn = foxc.fox.load(head_first=False, gate="log", sm_scale=0.1)
    out = attn(q=q, k=k, v=v, logf=logf)          # q, k, v [B, T, H, D], logf [B, T, H]
    out = foxc.fox.attention(q, k, v, logf, head_first=False, gate="log", sm_scale=0.1)

- ``head_first``: ``[B, H, T, D]`` tensors (and gates ``[B, H, T]``), else ``[B, T, H, D]``
  (gates ``[B, T, H]``); the program reads them in place (its fused attention works head-first,
  the other layout costs a copy in and out, as the IR shows).
- ``gate``: ``"logits"`` (parameter ``fgate``, ``log f = logsigmoid(fgate)``) or ``"log"``
  (parameter ``logf``, the log forget gate itself, declared in ``[-inf, 0]``: a gate in (0, 1]).
- ``sm_scale``: the score's scale (default ``1 / sqrt(D)``).
- ``fewer_queries``: N queries at the end of M keys (a prefill against a cache, N = 1 a decode
  step; ``bench/fox_prefill.attn``) instead of T queries against their own T keys.

Every other keyword goes to ``foxc.load`` (``prune_rule``, ``log_eps``, ``no_prune``, ``tiles``).
The program is plain DSL text (``program(...)``): what it computes is what it says.
"""

from __future__ import annotations

import math
from typing import Optional

__all__ = ["program", "load", "attention"]

_GATES = {
    # gate -> (parameter, its declared range, log f of one element)
    "logits": ("fgate", "", "logsigmoid(fgate[{g}])"),
    "log": ("logf", " in [-inf, 0]", "logf[{g}]"),
}


def program(
    head_first: bool = True,
    gate: str = "logits",
    sm_scale: Optional[float] = None,
    fewer_queries: bool = False,
    dtype: str = "bf16",
) -> str:
    """The DSL text of FoX attention for these choices (see the module's doc)."""
    if gate not in _GATES:
        raise ValueError(f"gate must be one of {sorted(_GATES)}, got {gate!r}")
    if sm_scale is None:
        scale = "/ sqrt(D)"
    else:
        s = float(sm_scale)
        if not math.isfinite(s) or s == 0.0:
            raise ValueError(f"sm_scale must be finite and non-zero, got {sm_scale!r}")
        scale = f"* {s!r}" if s > 0 else f"* ({s!r})"
    tq, tk = ("N", "M") if fewer_queries else ("T", "T")

    def shape(t):
        return f"[B, H, {t}, D]" if head_first else f"[B, {t}, H, D]"

    def at(row):
        return f"b, h, {row}, d" if head_first else f"b, {row}, h, d"

    name, declared, log_f = _GATES[gate]
    gshape = f"[B, H, {tk}]" if head_first else f"[B, {tk}, H]"
    g = "b, h, t" if head_first else "b, t, h"
    pos = "i + M - N" if fewer_queries else "i"
    mask = "select(j <= i + M - N, s[b, h, i, j], -inf)" if fewer_queries else "causal(i, j, s[b, h, i, j])"
    kind = "prefill" if fewer_queries else "attention"
    layout = "head_first" if head_first else "seq_first"
    return (
        f"# FoX {kind}, {layout}, gate = {gate}, scale {scale} (written by foxc.fox.program)\n"
        f"attention fox_{layout}_{gate}(q: {dtype}{shape(tq)}, k: {dtype}{shape(tk)}, v: {dtype}{shape(tk)}, "
        f"{name}: f32{gshape}{declared}) -> {dtype}{shape(tq)} {{\n"
        f"    c[b, h, t]      = cumsum(t, {log_f.format(g=g)})\n"
        f"    s[b, h, i, j]   = sum(d, q[{at('i')}] * k[{at('j')}]) {scale} + c[b, h, {pos}] - c[b, h, j]\n"
        f"    p[b, h, i, j]   = softmax(j, {mask})\n"
        f"    out[{at('i')}] = sum(j, p[b, h, i, j] * v[{at('j')}])\n"
        "    return out\n"
        "}\n"
    )


def load(
    head_first: bool = True,
    gate: str = "logits",
    sm_scale: Optional[float] = None,
    fewer_queries: bool = False,
    dtype: str = "bf16",
    **load_kwargs,
):
    """``foxc.load`` of :func:`program` (cached: the same choices give the same program)."""
    from . import load as load_program

    return load_program(program(head_first, gate, sm_scale, fewer_queries, dtype), **load_kwargs)


def attention(q, k, v, gate, head_first: bool = True, gate_kind: str = "logits", sm_scale=None, **load_kwargs):
    """FoX attention of NumPy arrays or torch tensors: ``q`` ``[B, H, N, D]`` (or ``[B, N, H, D]``
    with ``head_first=False``), ``k``, ``v`` with M >= N rows and the gates of the keys (``gate_kind``
    "logits" or "log"); N < M puts the queries at the end of the keys (a prefill or decode step
    against a cache). The program is compiled once per choice and reused."""
    axis = 2 if head_first else 1
    fewer = q.shape[axis] != k.shape[axis]
    attn = load(head_first, gate_kind, sm_scale, fewer, **load_kwargs)
    return attn(q=q, k=k, v=v, **{_GATES[gate_kind][0]: gate})
