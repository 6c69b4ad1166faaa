"""Context-parallel FoX attention: split the sequence over P ranks and send a rank only the
key/value blocks that one of its query tiles keeps.

The sequence of length ``T`` is cut into ``P`` contiguous chunks of ``L = T / P`` tokens; rank
``r`` holds the queries, keys, values and gates of chunk ``r``. With ACP, query tile ``m`` keeps
the key tiles ``[start[m], diag(m)]`` (docs/SEMANTICS.md, ``block_boundary``): every key before
``start[m] * bn`` is pruned. Rank ``r`` therefore needs, from an earlier rank ``s``, only the key
tiles of chunk ``s`` at or after ``min over its query tiles m of start[m]`` (the union over its
tiles of ``[start[m], diag(m)]``: each of these ranges reaches into chunk ``r``, so the union
restricted to earlier chunks is one suffix per head).

How a rank learns ``start`` (the plan): foxc's own values, never a formula re-derived here.

1. The gate is cheap to share (4 bytes per token and head, against ``4 D`` for bf16 K and V):
   ranks all-gather it and evaluate the program's ``gate_cumsum`` on the whole sequence
   (``foxc._foxc.decay_cumsum``: identical ``c`` on every rank, and identical to one device's).
2. The threshold of the local query tiles is the program's rule evaluated on the local rows
   with the statistics that span the sequence (``max |q|``, ``max |k|``, the causal prefix
   ``max |k|``) all-gathered per head (``foxc._foxc.threshold_local``); ranks all-gather the
   local thresholds (one float per query tile).
3. ``start`` is the program's ``block_boundary`` on ``c`` and the threshold
   (``foxc._foxc.boundary``): every rank knows every rank's kept tiles, so every rank knows
   what to send to whom without a further request.

The exchange is direct point to point (``torch.distributed.batch_isend_irecv``): rank ``s``
sends each later rank ``r`` the suffix of its K/V tiles that ``r`` needs, once, packed per head.
A plain ring (each chunk passed around ``P - 1`` hops, as ring attention does) sends ``P (P - 1)``
chunks; causal attention alone needs ``P (P - 1) / 2``; the plan sends the kept part of those.
The bytes of each are ``Plan.bytes``; bench/cp_plan.py reports them on the standard workload.

Each rank computes one partial attention per source chunk with a foxc program that returns the
rows' log-sum-exp: its own chunk causally (``DIAG_SOURCE``: the causal kernel, keys before the
row's start scored ``-inf``), each earlier chunk over the received tiles (``PARTIAL_SOURCE``: an
expression mask ``j >= lo[i]``). In both the tiles pass proves the key bound ``keys_from = lo``,
so the GPU kernel starts each query tile at its rows' lowest start: the tiles a rank did not
receive (and the own chunk's pruned ones) are skipped, not computed and masked. It merges the
partials through the log-sum-exp: ``lse = logsumexp_s lse_s``, ``out = sum_s exp(lse_s - lse)
out_s``. On the CPU the partials run on the f64 reference interpreter
(``_foxc.reference_with_lse``); on CUDA tensors on the foxc torch op, which returns ``(out, lse)``.
``simulate`` runs P ranks in one process (threads for the exchange, buffers copied instead of
sent), on NumPy arrays or on torch tensors of one GPU (bench/cp_sim.py).

Not done: a GPU rank computes its plan statistics on the host (its q and k chunk are copied once
per forward); grouped kv heads: planned, not run (refused).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _foxc
from ._arrays import cat, is_torch, nbytes

# One query chunk against one key chunk of the same length L, at their global positions:
# the decay `cq[i] - ck[j]` comes from the shared cumsum; key j of the chunk is kept for row i
# iff lo[i] <= j <= hi[i] (the pruning start and, on the diagonal chunk, causality). Masked
# keys are never read, so tiles that were not received may hold anything (``POISON``).
PARTIAL_SOURCE = """
attention fox_cp_partial(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], cq: f32[B, H, T], ck: f32[B, H, T], lo: f32[B, H, T], hi: f32[B, H, T]) -> f32[B, H, T, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + cq[b, h, i] - ck[b, h, j]
    p[b, h, i, j]   = softmax(j, select(j >= lo[b, h, i], select(j <= hi[b, h, i], s[b, h, i, j], -inf), -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
"""

# The own chunk: causal (its kernel visits key tiles up to the diagonal only), keys before
# lo[i] scored -inf (the tiles pass proves keys_from = lo from that: the kernel skips them).
DIAG_SOURCE = """
attention fox_cp_diag(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], c: f32[B, H, T], lo: f32[B, H, T]) -> f32[B, H, T, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, select(j <= i, select(j >= lo[b, h, i], s[b, h, i, j], -inf), -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
"""

# What K and V hold where a tile was not received (finite: foxc refuses NaN inputs; large: a
# score or value read from it would dominate its row).
POISON = 3.0e4

# Bytes of one token of one head of K plus V in bf16, per unit of head dim.
_KV_BYTES_PER_DIM = 2 * 2
# The dtype statistics and thresholds travel in (torch's float64; NumPy arrays stay f64).
_F64 = "float64"


# ---------------------------------------------------------------- foxc's kept tiles
def _wire(a: np.ndarray) -> tuple:
    a = np.ascontiguousarray(a, dtype="<f4")
    return ("f32", list(a.shape), a.tobytes())


def _f64(shape_bytes) -> np.ndarray:
    shape, data = shape_bytes
    return np.frombuffer(data, dtype="<f8").reshape(shape).copy()


def tiles(attn) -> Tuple[int, int]:
    """``(bm, bn)`` of the program's attention; ValueError when it does not prune."""
    t, pruned, _ = _foxc.prune_tiles(attn._program)
    if not pruned:
        raise ValueError(f"`{attn.name}` does not prune key tiles: nothing to plan")
    return tuple(t)


def decay_cumsum(attn, **gates: np.ndarray) -> np.ndarray:
    """The program's gate cumsum ``c [B, H, T]`` (f64 values of foxc's f32 result) from the
    parameters it reads (e.g. ``fgate=``)."""
    return _f64(_foxc.decay_cumsum(attn._program, {n: _wire(a) for n, a in gates.items()}))


def threshold(attn, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The program's threshold ``delta [B, H, T / bm]`` on a whole sequence (one device)."""
    names = attn.params
    return _f64(_foxc.threshold(attn._program, {names[0]: _wire(q), names[1]: _wire(k)}))


def boundary(attn, c: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """The program's ``block_boundary``: ``start [B, H, T / bm]`` (int32) from ``c`` and ``delta``."""
    c = np.ascontiguousarray(c, dtype="<f8")
    d = np.ascontiguousarray(delta, dtype="<f8")
    shape, data = _foxc.boundary(attn._program, (list(c.shape), c.tobytes()), (list(d.shape), d.tobytes()))
    return np.frombuffer(data, dtype="<i4").reshape(shape).copy()


def block_starts(attn, **inputs: np.ndarray) -> Tuple[np.ndarray, Tuple[int, int]]:
    """The CPU backend's own block starts on whole-sequence inputs, and ``(bm, bn)``."""
    r = _foxc.block_starts(attn._program, {n: _wire(a) for n, a in inputs.items()})
    if r is None:
        raise ValueError(f"`{attn.name}` does not prune key tiles")
    shape, data, t = r
    return np.frombuffer(data, dtype="<i4").reshape(shape).copy(), tuple(t)


# ---------------------------------------------------------------- the plan
@dataclass
class Plan:
    """Which key tiles each rank needs from earlier ranks.

    ``first[r, b, h]`` is the first (global) key tile rank ``r`` needs for head ``(b, h)``; it
    needs every tile from there to the end of chunk ``r - 1`` (``r * L / bn`` when it needs
    nothing remote). Heads are kv heads (a GQA group's needs are united)."""

    T: int
    P: int
    bm: int
    bn: int
    first: np.ndarray
    #: Query heads per kv head (``first`` is per kv head).
    kv_group: int = 1

    @property
    def L(self) -> int:
        return self.T // self.P

    @property
    def tiles_per_rank(self) -> int:
        return self.L // self.bn

    def range_from(self, r: int, s: int) -> Tuple[np.ndarray, np.ndarray]:
        """Global key tiles ``[lo, hi)`` per head that rank ``r`` needs from rank ``s < r``."""
        n = self.tiles_per_rank
        lo = np.clip(self.first[r], s * n, (s + 1) * n)
        return lo, np.full_like(lo, (s + 1) * n)

    def needed(self, r: int) -> np.ndarray:
        """bool ``[B, H, T / bn]``: key tiles of earlier ranks that rank ``r`` receives."""
        t = np.arange(self.T // self.bn)
        return (t >= self.first[r][..., None]) & (t < r * self.tiles_per_rank)

    def tiles_sent(self) -> int:
        """Key tiles sent, over all ranks and heads."""
        n = self.tiles_per_rank
        return int(sum((r * n - self.first[r]).sum() for r in range(self.P)))

    def tiles_received(self, r: int) -> int:
        """Key tiles rank ``r`` receives, over its heads."""
        return int((r * self.tiles_per_rank - self.first[r]).sum())

    def bytes(self, d: int, kv_bytes_per_dim: int = _KV_BYTES_PER_DIM) -> Dict[str, int]:
        """Bytes sent in total: ``plan`` (the kept K/V tiles; ``plan_max_rank`` what the busiest
        rank receives of them), ``plan_overhead`` (gate, threshold
        and statistics all-gathers), ``causal`` (every earlier chunk, whole) and ``ring`` (every
        chunk ``P - 1`` hops, plain ring attention). K and V in bf16 unless told."""
        b, hk = self.first.shape[1], self.first.shape[2]
        per_token = d * kv_bytes_per_dim
        chunk = b * hk * self.L * per_token
        p = self.P
        # Each rank receives the others' gates (f32 per token and head), thresholds (f32 per query
        # tile and head) and norm statistics (max |q| and |k| per head, max |k| per kv head).
        h = hk * self.kv_group
        gathered = h * b * (self.L * 4 + (self.L // self.bm) * 4 + 2 * 4) + hk * b * 4
        return {
            "plan": self.tiles_sent() * self.bn * per_token,
            # What the busiest rank receives (a plain ring moves (P - 1) chunks into every rank).
            "plan_max_rank": max(self.tiles_received(r) for r in range(p)) * self.bn * per_token,
            "plan_overhead": p * (p - 1) * gathered,
            "causal": p * (p - 1) // 2 * chunk,
            "ring": p * (p - 1) * chunk,
        }


def plan_from_starts(starts: np.ndarray, bm: int, bn: int, P: int, kv_group: int = 1) -> Plan:
    """The plan of ``P`` contiguous chunks from foxc's block starts ``[B, H, T / bm]``."""
    b, h, mt = starts.shape
    T = mt * bm
    if T % P or (T // P) % bm or (T // P) % bn:
        raise ValueError(f"T = {T} must split into {P} chunks of whole {bm}- and {bn}-token tiles")
    if h % kv_group:
        raise ValueError(f"{h} heads do not form groups of {kv_group}")
    L, n = T // P, T // P // bn
    first = np.empty((P, b, h // kv_group), dtype=np.int64)
    for r in range(P):
        own = starts[:, :, r * L // bm : (r + 1) * L // bm].min(axis=2)
        own = own.reshape(b, h // kv_group, kv_group).min(axis=2)
        first[r] = np.minimum(own, r * n)
    return Plan(T=T, P=P, bm=bm, bn=bn, first=first, kv_group=kv_group)


# ---------------------------------------------------------------- exchanges
class ThreadExchange:
    """P ranks as threads of one process: collectives through shared slots, point-to-point
    buffers copied (not sent). NumPy arrays (the CPU tests) or torch tensors (``simulate`` on
    one GPU: every rank's tensors on the same device)."""

    def __init__(self, size: int):
        self.size = size
        self._slots: List[Any] = [None] * size
        self._mail: Dict[Tuple[int, int], Any] = {}
        self._barrier = threading.Barrier(size)
        # Bytes each rank sent: by the all-gathers and by the point-to-point K/V exchange.
        self.gathered = [0] * size
        self.p2p = [0] * size

    def rank_view(self, rank: int) -> "_ThreadRank":
        return _ThreadRank(self, rank)


class _ThreadRank:
    def __init__(self, ex: ThreadExchange, rank: int):
        self.ex, self.rank, self.size = ex, rank, ex.size

    def all_gather(self, x, axis: int):
        self.ex._slots[self.rank] = x
        self.ex.gathered[self.rank] += nbytes(x) * (self.size - 1)
        self.ex._barrier.wait()
        out = cat(list(self.ex._slots), axis=axis)
        self.ex._barrier.wait()
        return out

    def exchange(self, sends: Dict[int, Any], recv_counts: Dict[int, int], like=None) -> Dict[int, Any]:
        for dst, buf in sends.items():
            self.ex._mail[(self.rank, dst)] = buf.clone() if is_torch(buf) else buf.copy()
            self.ex.p2p[self.rank] += nbytes(buf)
        self.ex._barrier.wait()
        got = {}
        for src, count in recv_counts.items():
            buf = self.ex._mail.pop((src, self.rank))
            size = buf.numel() if is_torch(buf) else buf.size
            if size != count:
                raise RuntimeError(f"rank {self.rank}: {size} values from rank {src}, expected {count}")
            got[src] = buf
        self.ex._barrier.wait()
        return got


class TorchExchange:
    """torch.distributed (gloo on the CPU, NCCL on GPUs): all_gather and point to point."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_gather(self, x, axis: int):
        import torch

        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=axis)

    def exchange(self, sends, recv_counts, like):
        """Send ``sends[dst]`` to each ``dst`` and receive ``recv_counts[src]`` values (of
        ``like``'s dtype and device) from each ``src``, all at once."""
        import torch

        dist = self.dist

        def peer(r):
            return dist.get_global_rank(self.group, r) if self.group is not None else r

        ops, got = [], {}
        for dst, buf in sends.items():
            ops.append(dist.P2POp(dist.isend, buf.contiguous(), peer(dst), self.group))
        for src, count in recv_counts.items():
            got[src] = torch.empty(count, dtype=like.dtype, device=like.device)
            ops.append(dist.P2POp(dist.irecv, got[src], peer(src), self.group))
        if ops:
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return got


# ---------------------------------------------------------------- array helpers (NumPy / torch)
def _np(x) -> np.ndarray:
    if is_torch(x):
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def _like(x, a: np.ndarray, dtype=None):
    """NumPy array ``a`` as the kind of ``x`` (a torch tensor on x's device, else NumPy)."""
    if is_torch(x):
        import torch

        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return torch.as_tensor(a, device=x.device, dtype=dtype or torch.float32)
    return a


# ---------------------------------------------------------------- one rank's forward
def local_threshold(attn, ex, q, k, T: int) -> np.ndarray:
    """The threshold of this rank's query tiles ``[B, H, L / bm]`` (f64): the program's rule on
    the local rows (``_foxc.threshold_local``), with the statistics that span the sequence
    (max |q_i| and max |k_j| of every rank, all-gathered per head) reduced here."""
    names = attn.params
    local = {names[0]: _wire(_np(q)), names[1]: _wire(_np(k))}
    qs, ks = (_f64(x) for x in _foxc.local_norm_stats(attn._program, local))
    all_q = _np(ex.all_gather(_like(q, qs[..., None], _F64), axis=2))  # [B, H, P]
    all_k = _np(ex.all_gather(_like(q, ks[..., None], _F64), axis=2))  # [B, Hk, P]
    k_before = all_k[..., : ex.rank].max(-1) if ex.rank else np.zeros_like(ks)

    def arg(a):
        return (list(a.shape), np.ascontiguousarray(a, "<f8").tobytes())

    shape, data = _foxc.threshold_local(
        attn._program, local, T, ex.rank * q.shape[2],
        arg(all_q.max(-1)), arg(all_k.max(-1)), arg(k_before)
    )
    return np.frombuffer(data, dtype="<f8").reshape(shape).copy()


def reference_with_lse(attn, **inputs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(out, lse)`` of the program after the CPU passes on the f64 reference interpreter."""
    o, l = _foxc.reference_with_lse(attn._program, {n: _wire(a) for n, a in inputs.items()})
    return _f64(o), _f64(l)


def _partial_program():
    from . import load

    # load caches the compilation (and its GPU plans) per text and options.
    return load(PARTIAL_SOURCE, no_prune=True)


def _diag_program():
    from . import load

    return load(DIAG_SOURCE, no_prune=True)


def _run(prog, q, k, v, *vectors):
    """``(out, lse)`` of a partial program on ``q, k, v`` and its f32 row/column vectors (NumPy
    f64): the foxc torch op on CUDA tensors, the f64 reference interpreter otherwise."""
    if is_torch(q) and q.is_cuda:
        import torch

        from . import torch as foxc_torch  # noqa: F401  (registers the op)

        f32 = lambda a: a if is_torch(a) else _like(q, a, torch.float32).contiguous()  # noqa: E731
        out, lse = torch.ops.foxc.attention(prog.id, [q, k, v, *(f32(a) for a in vectors)])
        return out.float(), lse
    names = prog.params
    arrays = dict(zip(names, [_np(q), _np(k), _np(v), *(_np(a) for a in vectors)]))
    (so, bo), (sl, bl) = _foxc.reference_with_lse(prog._program, {n: _wire(a) for n, a in arrays.items()})
    return _f64((so, bo)), _f64((sl, bl))


def _merge(parts):
    """Merge partial ``(out, lse)`` through the log-sum-exp (rows with -inf lse weigh 0)."""
    if is_torch(parts[0][0]):
        import torch

        lse = torch.logsumexp(torch.stack([l for _, l in parts]), dim=0)
        w = [torch.exp(l - lse).nan_to_num(0.0)[..., None] for _, l in parts]
        return sum(wi * o for wi, (o, _) in zip(w, parts)), lse
    ls = np.stack([l for _, l in parts])
    m = ls.max(0)
    lse = m + np.log(np.exp(ls - m).sum(0))
    out = sum(np.nan_to_num(np.exp(l - lse))[..., None] * o for o, l in parts)
    return out, lse


def _unpack(buf, lo, src: int, n: int, bn: int, shape):
    """A received buffer (the needed suffix of each head's chunk, heads in order) placed into
    ``[B, H, L, 2D]`` (on the buffer's device). Tiles that were not sent hold ``POISON`` (foxc
    refuses NaN inputs): the mask hides them, and a read of one would swamp its row."""
    B, H, L, D2 = shape
    if is_torch(buf):
        import torch

        full = torch.full(shape, POISON, dtype=buf.dtype, device=buf.device)
    else:
        full = np.full(shape, POISON, dtype=buf.dtype)
    at = 0
    for b in range(B):
        for h in range(H):
            first = int(lo[b, h] - src * n) * bn
            size = (L - first) * D2
            full[b, h, first:] = buf[at : at + size].reshape(L - first, D2)
            at += size
    return full


@dataclass
class RankWork:
    """What one rank holds after the exchange (steps 1-4 of ``rank_forward``): the gate cumsum
    ``c [B, H, T]`` of the whole sequence, foxc's block starts ``[B, H, T / bm]``, the plan and
    the K/V buffers received from earlier ranks (``{source rank: flat buffer}``)."""

    rank: int
    c: np.ndarray
    starts: np.ndarray
    plan: Plan
    received: Dict[int, Any]


@dataclass
class PartialCall:
    """One partial attention of a rank: the program and its inputs in parameter order."""

    program: Any
    args: Tuple


def rank_exchange(attn, ex, q, k, v, gate, *, gate_name: Optional[str] = None) -> RankWork:
    """Steps 1-4 of ``rank_forward`` on one rank: the shared gate cumsum, thresholds and block
    starts, the plan, and the point-to-point exchange of the needed K/V tiles."""
    P, r = ex.size, ex.rank
    B, H, L, D = q.shape
    if not _foxc.prune_tiles(attn._program)[2]:
        raise ValueError(
            f"`{attn.name}`: context-parallel attention runs plain FoX (q.k / sqrt(D) + c_i - c_j, causal, "
            "q and k as given, no grouped kv heads); score regions, other masks and GQA are not done (the plan is)"
        )
    T = L * P
    bm, bn = tiles(attn)
    gate_name = gate_name or attn.params[3]
    # 1. The whole gate (cheap), then foxc's cumsum of it: c of every position on every rank.
    c = decay_cumsum(attn, **{gate_name: _np(ex.all_gather(gate, axis=2))})
    # 2. The thresholds of the local tiles from shared statistics; everyone's thresholds.
    delta = _np(ex.all_gather(_like(q, local_threshold(attn, ex, q, k, T), _F64), axis=2))
    # 3. foxc's block starts of every query tile: every rank knows every rank's needs.
    starts = boundary(attn, c, delta)
    plan = plan_from_starts(starts, bm, bn, P)
    n = plan.tiles_per_rank
    # 4. Send each later rank the suffix of K/V tiles it needs, packed per head.
    kv = cat([k, v], axis=3)  # [B, H, L, 2D]
    sends = {}
    for dst in range(r + 1, P):
        lo, _ = plan.range_from(dst, r)
        if (lo < (r + 1) * n).any():
            sends[dst] = cat([kv[b, h, int(lo[b, h] - r * n) * bn :].reshape(-1) for b in range(B) for h in range(H)], 0)
    recv = {}
    for src in range(r):
        lo, hi = plan.range_from(r, src)
        if (hi - lo).sum():
            recv[src] = int((hi - lo).sum()) * bn * 2 * D
    got = ex.exchange(sends, recv, like=kv)
    return RankWork(rank=r, c=c, starts=starts, plan=plan, received=got)


def rank_partials(work: RankWork, q, k, v) -> List[PartialCall]:
    """Step 5's partial attentions of one rank: its own chunk causally (``DIAG_SOURCE``), and
    each earlier chunk it received tiles of over those tiles (``PARTIAL_SOURCE``; the tiles it
    did not receive hold ``POISON`` and are masked). Row i keeps keys from
    ``start[i // bm] * bn`` on (global positions)."""
    plan, r, c = work.plan, work.rank, work.c
    B, H, L, D = q.shape
    bm, bn, n = plan.bm, plan.bn, plan.tiles_per_rank
    row_start = np.repeat(work.starts[:, :, r * L // bm : (r + 1) * L // bm], bm, axis=2) * bn
    # c relative to the chunk's first row (the shift cancels in c_i - c_j, and in the lse): the
    # partials read it as f32, whose rounding grows with |c| (up to T per token of decay).
    c = c - c[:, :, r * L : r * L + 1]
    # On a GPU the row and column vectors go to the device once, as the op's f32 (the calls
    # are then pure device work, as a rank would repeat them).
    gpu = is_torch(q) and q.is_cuda
    vec = (lambda a: _like(q, a, "float32").contiguous()) if gpu else (lambda a: a)  # noqa: E731
    cq = vec(c[:, :, r * L : (r + 1) * L])
    calls = [PartialCall(_diag_program(), (q, k, v, cq, vec(np.maximum(row_start - r * L, 0.0))))]
    part = _partial_program()
    for src, buf in sorted(work.received.items()):
        full = _unpack(buf, plan.range_from(r, src)[0], src, n, bn, (B, H, L, 2 * D))
        ks, vs = full[..., :D], full[..., D:]
        if is_torch(ks):
            ks, vs = ks.contiguous(), vs.contiguous()
        lo_rows = vec(np.maximum(row_start - src * L, 0.0))
        ck = vec(c[:, :, src * L : (src + 1) * L])
        calls.append(PartialCall(part, (q, ks, vs, cq, ck, lo_rows, vec(np.full((B, H, L), L - 1.0)))))
    return calls


def run_partials(calls: Sequence[PartialCall]):
    """Each partial's ``(out, lse)``, then their merge through the log-sum-exp."""
    return _merge([_run(c.program, *c.args) for c in calls])


def rank_forward(attn, ex, q, k, v, gate, *, gate_name: Optional[str] = None):
    """Context-parallel attention on one rank: ``q, k, v [B, H, L, D]`` and ``gate [B, H, L]``
    of chunk ``ex.rank``; returns ``(out [B, H, L, D], lse [B, H, L], plan)``.

    ``ex``: a ``TorchExchange`` (torch.distributed) or a ``ThreadExchange`` rank view."""
    work = rank_exchange(attn, ex, q, k, v, gate, gate_name=gate_name)
    out, lse = run_partials(rank_partials(work, q, k, v))
    return out, lse, work.plan


def exchange_all(attn, P: int, q, k, v, gate, gate_name: Optional[str] = None):
    """Steps 1-4 (``rank_exchange``) of ``P`` ranks as threads of this process over the
    sequence's contiguous chunks: returns each rank's ``RankWork`` and the exchange (its byte
    counters). NumPy arrays, or torch tensors on one device (the one-GPU simulation)."""
    ex = ThreadExchange(P)
    L = q.shape[2] // P
    works: List[Any] = [None] * P
    errors: List[BaseException] = []

    def run(r):
        sl = slice(r * L, (r + 1) * L)
        try:
            works[r] = rank_exchange(
                attn, ex.rank_view(r), q[:, :, sl], k[:, :, sl], v[:, :, sl], gate[:, :, sl], gate_name=gate_name
            )
        except BaseException as e:  # noqa: BLE001  (re-raised below, after every thread ends)
            errors.append(e)
            ex._barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return works, ex


def chunk(x, r: int, P: int):
    """Rank ``r``'s chunk of ``x [B, H, T, ...]`` (contiguous for torch)."""
    L = x.shape[2] // P
    c = x[:, :, r * L : (r + 1) * L]
    return c.contiguous() if is_torch(c) else c


def simulate(attn, P: int, q, k, v, gate, gate_name: Optional[str] = None):
    """Context parallelism over ``P`` simulated ranks in this process: the exchange on threads
    (``exchange_all``), then each rank's partials and merge in turn. NumPy arrays run the
    reference path; torch CUDA tensors run the partials through the foxc torch op on their
    device. Returns ``(out [B, H, T, D], lse [B, H, T], plan, {"p2p": K/V bytes sent,
    "gathered": bytes of the all-gathers})``."""
    works, ex = exchange_all(attn, P, q, k, v, gate, gate_name)
    results = [run_partials(rank_partials(w, chunk(q, r, P), chunk(k, r, P), chunk(v, r, P))) for r, w in enumerate(works)]
    out = cat([o for o, _ in results], axis=2)
    lse = cat([l for _, l in results], axis=2)
    return out, lse, works[0].plan, {"p2p": sum(ex.p2p), "gathered": sum(ex.gathered)}
