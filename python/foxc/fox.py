"""The Forgetting Transformer's attention in the layouts and with the options of the published
FoX kernel: foxc writes the DSL program for the choice and compiles it once.

    attn = foxc.fox.load(head_first=False, gate="log", sm_scale=0.1)
    out = attn(q=q, k=k, v=v, logf=logf)          # q, k, v [B, T, H, D], logf [B, T, H]
    out = foxc.fox.attention(q, k, v, logf, head_first=False, gate="log", sm_scale=0.1)

- ``head_first``: ``[B, H, T, D]`` tensors (and gates ``[B, H, T]``), else ``[B, T, H, D]``
  (gates ``[B, T, H]``); the program reads them in place (its fused attention works head-first,
  the other layout costs a copy in and out, as the IR shows). ``attention()`` on torch tensors
  in the tokens-first layout swaps the axes in torch around the head-first program instead: the
  same two copies, and the attention op's backward, which reads the saved forward (the
  tokens-first program's would recompute it).
- ``gate``: ``"logits"`` (parameter ``fgate``, ``log f = logsigmoid(fgate)``) or ``"log"``
  (parameter ``logf``, the log forget gate itself, declared in ``[-inf, 0]``: a gate in (0, 1]).
- ``sm_scale``: the score's scale (default ``1 / sqrt(D)``).
- ``fewer_queries``: N queries at the end of M keys (a prefill against a cache, N = 1 a decode
  step; ``bench/fox_prefill.attn``) instead of T queries against their own T keys.
- ``packed``: several sequences back to back in the T axis (FlashAttention's "varlen" batches),
  with the per-token first key ``first: i32[B, T]`` (the start of each token's sequence) as one
  more parameter: ``select(j >= first[b, i], s, -inf)`` under the causal mask, fused and pruned
  (the decay needs no reset: ``c_i - c_j`` within a sequence sums its own gates only).

Packed batches by cumulative offsets, as FlashAttention's varlen API takes them::

    cu = np.array([0, 5, 6, 300], dtype=np.int32)      # three sequences: 5, 1 and 294 tokens
    out = foxc.fox.attention(q, k, v, gate, cu_seqlens=cu)  # q, k, v [total, H, D], gate [total, H]

``cu_seqlens`` (int32 or int64, NumPy, torch or a list, ``[S + 1]``) must start at 0, never
decrease and end at ``total``; foxc turns it into the first keys (``first_keys(cu)``) and runs
the packed program on ``[1, total, H, D]`` views (``head_first=True``: ``[H, total, D]`` tensors
and ``[H, total]`` gates). It is read on the host: a CUDA tensor is copied (one sync), so pass it
as a CPU tensor or array to avoid that. Each token attends to the earlier tokens of its own
sequence only: the output equals running every sequence alone (within the numerics contract;
ACP prunes each run with its own tiles and ``ln T``).

Every other keyword goes to ``foxc.load`` (``prune_rule``, ``log_eps``, ``no_prune``, ``tiles``,
``thresholds``).
The program is plain DSL text (``program(...)``): what it computes is what it says.
"""

from __future__ import annotations

import math
from typing import Optional

from ._arrays import is_torch, swap_axes

__all__ = ["program", "load", "attention", "first_keys"]

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
    packed: bool = False,
) -> str:
    """The DSL text of FoX attention for these choices (see the module's doc)."""
    if gate not in _GATES:
        raise ValueError(f"gate must be one of {sorted(_GATES)}, got {gate!r}")
    if packed and fewer_queries:
        raise ValueError("packed sequences take their own keys: packed=True with fewer_queries=True is not supported")
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
    if fewer_queries:
        mask = "select(j <= i + M - N, s[b, h, i, j], -inf)"
    elif packed:
        # Keys before the token's own sequence are masked like padding (tests/packed.rs).
        mask = "causal(i, j, select(j >= first[b, i], s[b, h, i, j], -inf))"
    else:
        mask = "causal(i, j, s[b, h, i, j])"
    kind = "prefill" if fewer_queries else "packed attention" if packed else "attention"
    layout = "head_first" if head_first else "seq_first"
    suffix = "_packed" if packed else ""
    first = ", first: i32[B, T]" if packed else ""
    return (
        f"# FoX {kind}, {layout}, gate = {gate}, scale {scale} (written by foxc.fox.program)\n"
        f"attention fox_{layout}_{gate}{suffix}(q: {dtype}{shape(tq)}, k: {dtype}{shape(tk)}, v: {dtype}{shape(tk)}, "
        f"{name}: f32{gshape}{declared}{first}) -> {dtype}{shape(tq)} {{\n"
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
    packed: bool = False,
    **load_kwargs,
):
    """``foxc.load`` of :func:`program` (cached: the same choices give the same program)."""
    from . import load as load_program

    return load_program(program(head_first, gate, sm_scale, fewer_queries, dtype, packed), **load_kwargs)


def first_keys(cu_seqlens, total: int):
    """The per-token first keys (int32 NumPy ``[total]``) of the cumulative sequence offsets
    ``cu_seqlens`` (``[S + 1]``, int32 or int64, NumPy, torch or a list): token ``t`` of sequence
    ``s`` (``cu[s] <= t < cu[s + 1]``) gets ``cu[s]``. A ValueError unless the offsets start at
    0, never decrease and end at ``total``."""
    import numpy as np

    if is_torch(cu_seqlens):  # read on the host
        cu_seqlens = cu_seqlens.detach().cpu().numpy()
    cu = np.asarray(cu_seqlens)
    if cu.dtype == object or not (np.issubdtype(cu.dtype, np.integer) or cu.size == 0):
        raise ValueError(f"cu_seqlens must hold integers (int32 or int64), got dtype {cu.dtype}")
    if cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"cu_seqlens must be 1-D with S + 1 >= 2 offsets, got shape {cu.shape}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
    steps = np.diff(cu)
    if (steps < 0).any():
        s = int(np.argmax(steps < 0))
        raise ValueError(f"cu_seqlens must not decrease: cu_seqlens[{s + 1}] = {cu[s + 1]} < cu_seqlens[{s}] = {cu[s]}")
    if cu[-1] != total:
        raise ValueError(f"cu_seqlens must end at the number of tokens {total}, got {cu[-1]}")
    if total >= 2**31:
        raise ValueError(f"{total} tokens do not fit int32 first keys")
    return np.repeat(cu[:-1], steps).astype(np.int32)


def _packed(q, k, v, gate, cu_seqlens, head_first, gate_kind, sm_scale, load_kwargs):
    """:func:`attention` of tensors without a batch axis, packed by ``cu_seqlens``."""
    axis = 1 if head_first else 0
    for name, x, rank in (("q", q, 3), ("k", k, 3), ("v", v, 3), ("gate", gate, 2)):
        if len(x.shape) != rank:
            want = "[H, total, D]" if head_first else "[total, H, D]"
            want = want if rank == 3 else ("[H, total]" if head_first else "[total, H]")
            raise ValueError(f"with cu_seqlens, {name} must be {want} (no batch axis), got shape {tuple(x.shape)}")
    total = q.shape[axis]
    for name, x in (("k", k), ("v", v), ("gate", gate)):
        if x.shape[axis] != total:
            raise ValueError(f"with cu_seqlens, {name} has {x.shape[axis]} tokens but q has {total} (queries take their own keys)")
    first = first_keys(cu_seqlens, total).reshape(1, total)
    if is_torch(q):  # the first keys beside q
        import torch

        first = torch.from_numpy(first).to(q.device)
    # torch tensors run the head-first program on tokens-first inputs swapped in torch (see
    # attention()).
    swap = is_torch(q) and not head_first
    if swap:
        q, k, v, gate = (swap_axes(t, 0, 1) for t in (q, k, v, gate))
    attn = load(head_first or swap, gate_kind, sm_scale, False, packed=True, **load_kwargs)
    # A batch of one: views, no copy.
    x = {n: t.reshape((1,) + tuple(t.shape)) for n, t in (("q", q), ("k", k), ("v", v))}
    out = attn(first=first, **x, **{_GATES[gate_kind][0]: gate.reshape((1,) + tuple(gate.shape))})
    out = out.reshape(tuple(out.shape[1:]))
    return swap_axes(out, 0, 1) if swap else out


def attention(
    q, k, v, gate, head_first: Optional[bool] = None, gate_kind: str = "logits", sm_scale=None, cu_seqlens=None, **load_kwargs
):
    """FoX attention of NumPy arrays or torch tensors: ``q`` ``[B, H, N, D]`` (or ``[B, N, H, D]``
    with ``head_first=False``), ``k``, ``v`` with M >= N rows and the gates of the keys (``gate_kind``
    "logits" or "log"); N < M puts the queries at the end of the keys (a prefill or decode step
    against a cache). With ``cu_seqlens`` the sequences are packed: ``q``, ``k``, ``v``
    ``[total, H, D]`` and the gates ``[total, H]`` (``[H, total, D]`` and ``[H, total]`` with
    ``head_first=True``), see the module's doc. The program is compiled once per choice and reused."""
    if cu_seqlens is not None:
        return _packed(q, k, v, gate, cu_seqlens, bool(head_first), gate_kind, sm_scale, load_kwargs)
    head_first = True if head_first is None else head_first
    axis = 2 if head_first else 1
    fewer = q.shape[axis] != k.shape[axis]
    if is_torch(q) and not head_first:
        # The tokens-first program's output is a transposed copy of its attention's, which the
        # torch path runs as a whole program whose backward recomputes the forward
        # (`foxc::forward`). Swapping the axes in torch around the head-first program (the same
        # two copies the IR would make) keeps the attention op, whose backward reads the saved
        # forward instead.
        q, k, v = (swap_axes(t, 1, 2) for t in (q, k, v))
        attn = load(True, gate_kind, sm_scale, fewer, **load_kwargs)
        return swap_axes(attn(q=q, k=k, v=v, **{_GATES[gate_kind][0]: swap_axes(gate, 1, 2)}), 1, 2)
    attn = load(head_first, gate_kind, sm_scale, fewer, **load_kwargs)
    return attn(q=q, k=k, v=v, **{_GATES[gate_kind][0]: gate})
