"""A KV cache for decoding with a foxc attention, with provably safe eviction.

    attn = foxc.load("bench/fox_prefill.attn")       # N queries at the end of M keys
    cache = foxc.KVCache(attn, max_keys=8192, q_norm=..., k_norm=...)
    out = cache(q=q_new, k=k_new, v=v_new, fgate=f_new)  # append, attend, evict

Each call appends the new tokens' per-key tensors (those whose declared dims hold the key axis,
``M`` in fox_prefill: ``k``, ``v``, ``fgate``; with examples/fox_cache.attn ``k``, ``v`` and the
decay cumsum ``c``, declared ``nonincreasing along M``, which the caller continues from the last
key, ``c[t] = c[t - 1] + log f[t]``, so that no step rescans the gates) to the cache, runs the attention of the new
queries against everything cached (one fused, pruned call), and then drops the key blocks no
later query can need.

Why dropping is safe (docs/RULES.md, "Eviction"): ACP skips a key block whose decay makes every
weight in it negligible, and FoX's decay only grows with distance (every gate in (0, 1]). A
block below the threshold for the latest query is below it for every later query too, provided
the threshold of later queries cannot be lower: the cache evaluates the program's own rule at
the worst case of a *horizon* (at most ``max_keys`` keys per row, ``|q| <= q_norm``,
``|k| <= k_norm`` for every query and key, present and future; ``foxc_ir::evict`` proves the rule
monotone first). Then every later row gives the dropped keys less than ``eps`` of its softmax
weight, and outputs stay within ACP's bound of the run that keeps everything. The cache checks
the premises it can see: the norms of every query and key passed through it (when the score
reads them as given), and the number of keys (it refuses to grow past ``max_keys``). With
QK-norm the program bounds the norms itself and no bound need be given.

The cache is dense ``[B, H, L, ...]``: it drops the blocks that every head and sequence of the
batch can drop (``evictable(cache)`` reports each head's first kept block; a paged cache could
drop per head, ``held_per_head``). Tensors are NumPy arrays (CPU backend) or torch tensors; the
eviction decision reads the cached gates on the host through the extension (the interpreter's
decay cumsum), once every ``every`` appended tokens. By default that is one key block or a
sixteenth of the keys held, whichever is more: a decision reads the whole window, so deciding
every block would cost O(T) per block (66 ms at 16 heads of 128k keys in a debug build); at a
sixteenth of the window it is a constant per token, for at most 1/16 more keys held.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from . import _foxc
from ._arrays import cat, contiguous, is_torch, nbytes

__all__ = ["KVCache", "evictable"]


# The relative rounding error of each declared float dtype (half an ulp at 1).
_ROUNDING = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-24}


def _host_f32(x) -> np.ndarray:
    if is_torch(x):
        x = x.detach().float().cpu().numpy()
    return np.ascontiguousarray(x, dtype="<f4")


def _drop_front(x, axis: int, n: int):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(n, None)
    return contiguous(x[tuple(idx)])


def _max_row_norm(x) -> float:
    """The largest Euclidean norm of the last axis' rows, in float64."""
    if is_torch(x):
        return float(x.detach().double().norm(dim=-1).max().item()) if x.numel() else 0.0
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt((x * x).sum(-1)).max()) if x.size else 0.0


class KVCache:
    """The keys of a decode so far, for one program; calling it appends, attends and evicts.

    ``attn``: a program whose queries are the last N of M keys (``bench/fox_prefill.attn``).
    ``max_keys``: the longest sequence the decode may reach (the cache refuses more).
    ``q_norm``, ``k_norm``: bounds on every query's and key's norm, present and future (needed
    unless the program bounds them itself, QK-norm); ``evict=False`` keeps every key.
    ``every``: evict after this many appended tokens (default: the program's key block or a
    sixteenth of the keys held, whichever is more).
    """

    def __init__(
        self,
        attn,
        max_keys: int,
        q_norm: Optional[float] = None,
        k_norm: Optional[float] = None,
        evict: bool = True,
        every: Optional[int] = None,
    ):
        self.attn = attn
        self.evicting = evict
        self.max_keys = int(max_keys)
        if self.max_keys < 1:
            raise ValueError(f"max_keys is {max_keys}: at least 1")
        info = dict(_foxc.eviction_info(attn._program)) if evict else None
        sig = {name: dims for name, _, dims in attn.signature}
        self._dtypes = {name: dtype for name, dtype, _ in attn.signature}
        key_dim = info["key_dim"] if info else sig[attn.params[1]][-2]
        if info and (info["key_dim"] is None or info["key_dim"] == info["query_dim"]):
            raise ValueError(
                f"`{attn.name}` has the same query and key axis ({info['key_dim']}): a decode needs "
                "queries at the end of longer keys (bench/fox_prefill.attn)"
            )
        #: ``{param: axis}`` of the tensors the cache holds along the key axis.
        self.cached: Dict[str, int] = {n: d.index(key_dim) for n, d in sig.items() if key_dim in d}
        self.block = int(info["bn"]) if info else 1
        #: Tokens between eviction decisions (None: the default schedule, ``evict_every``).
        self.every = int(every) if every else None
        if info:
            static = info["static_norms"]
            if static is not None:
                q_norm = static[0] if q_norm is None else q_norm
                k_norm = static[1] if k_norm is None else k_norm
            if q_norm is None or k_norm is None:
                raise ValueError(
                    f"`{attn.name}` reads the norms of q and k from the data: give q_norm and k_norm, bounds "
                    "on every query's and key's norm (present and future), or evict=False"
                )
            # The premises the cache checks on what passes through it (None: the score
            # transforms the parameter, a static bound covers it or nothing can be checked).
            checks = ((info["q"], q_norm, "q_norm"), (info["k"], k_norm, "k_norm"))
            self._check = {n: (b, what) for n, b, what in checks if n and static is None}
        else:
            self._check = {}
        # The attention each call runs. Where the cache checks both norms, the program's
        # threshold takes the checked bounds instead of reading every cached key's norm per
        # call (the decode step's prelude would otherwise read all of K once more).
        self._run = attn
        if info and len(self._check) == 2:
            from . import _assuming_norms

            self._run = _assuming_norms(attn, q_norm, k_norm)
        self.q_norm, self.k_norm = q_norm, k_norm
        self._decay_params = list(info["decay_params"]) if info else []
        stray = [n for n in self._decay_params if n not in self.cached]
        if stray:
            raise ValueError(f"the decay of `{attn.name}` reads {stray}, which are not per-key tensors: cannot evict")
        self.tensors: Dict[str, Any] = {}
        #: Keys appended so far (positions), and keys dropped from the front.
        self.position = 0
        self.dropped = 0
        self._since_evict = 0
        self._kept_blocks = None
        #: The horizon's threshold of the last eviction decision (None before the first).
        self.delta: Optional[float] = None

    @property
    def length(self) -> int:
        """Keys held now."""
        return self.position - self.dropped

    def nbytes(self) -> int:
        """Bytes the cached tensors hold."""
        return sum(nbytes(t) for t in self.tensors.values())

    def _check_norms(self, tensors: Dict[str, Any]) -> None:
        for name, (bound, what) in self._check.items():
            if name in tensors:
                # The program rounds the row to its declared dtype first: that can lengthen it
                # by one relative rounding error.
                n = _max_row_norm(tensors[name]) * (1.0 + _ROUNDING.get(self._dtypes[name], 0.0))
                if not n <= bound:
                    raise ValueError(
                        f"`{name}` has a row of norm {n:.6g} > {what} = {bound:.6g}: eviction's premise fails "
                        "(give a larger bound, or evict=False)"
                    )

    def append(self, **tensors: Any) -> None:
        """Append the new tokens' per-key tensors (every cached parameter, the same count)."""
        missing = sorted(set(self.cached) - set(tensors))
        if missing:
            raise ValueError(f"append takes every per-key tensor of `{self.attn.name}`; missing {missing}")
        counts = {n: tensors[n].shape[a] for n, a in self.cached.items()}
        n_new = next(iter(counts.values()))
        if any(c != n_new for c in counts.values()):
            raise ValueError(f"the new tokens disagree on their count: {counts}")
        if self.evicting and self.position + n_new > self.max_keys:
            raise ValueError(
                f"{self.position} + {n_new} keys exceed max_keys = {self.max_keys}: eviction was proven for "
                "at most max_keys keys per row"
            )
        self._check_norms(tensors)
        for n, a in self.cached.items():
            x = tensors[n]
            self.tensors[n] = x if n not in self.tensors else cat([self.tensors[n], x], a)
        self.position += n_new
        self._since_evict += n_new
        self._kept_blocks = None

    def attend(self, **tensors: Any):
        """The attention of the given queries (and other non-cached parameters) against the cache."""
        self._check_norms(tensors)
        return self._run(**tensors, **self.tensors)

    def __call__(self, **tensors: Any):
        """Append the per-key tensors among ``tensors``, attend the rest against the cache, evict."""
        new = {n: tensors.pop(n) for n in list(tensors) if n in self.cached}
        self.append(**new)
        out = self.attend(**tensors)
        if self.evicting and self._since_evict >= self.evict_every():
            self.evict()
        return out

    def evict_every(self) -> int:
        """Tokens between eviction decisions now: ``every`` if given, else one key block or a
        sixteenth of the keys held, whichever is more."""
        return self.every if self.every else max(self.block, self.length // 16)

    def _dims(self) -> Dict[str, int]:
        return self.attn.bind_dims({name: tuple(t.shape) for name, t in self.tensors.items()})

    def kept_blocks(self) -> np.ndarray:
        """Each head's first kept block of ``block`` keys (int32, the gate cumsum's leading dims)."""
        if not self.evicting:
            raise ValueError("this cache does not evict (evict=False)")
        if self._kept_blocks is None:
            if not self.tensors:
                return np.zeros(0, np.int32)
            wires = {}
            for name in self._decay_params:
                a = _host_f32(self.tensors[name])
                wires[name] = ("f32", list(a.shape), a.tobytes())
            shape, data, self.delta = _foxc.first_kept_blocks(
                self.attn._program, wires, self._dims(), self.max_keys, float(self.q_norm), float(self.k_norm)
            )
            self._kept_blocks = np.frombuffer(data, dtype="<i4").reshape(shape).copy()
        return self._kept_blocks

    def held_per_head(self) -> np.ndarray:
        """Keys each head would hold if it dropped its own evictable blocks (a paged cache)."""
        return self.length - self.kept_blocks().astype(np.int64) * self.block

    def evict(self) -> int:
        """Drop the blocks no later query can need (those every head can drop); the count dropped."""
        self._since_evict = 0
        kb = self.kept_blocks()
        n = int(kb.min()) * self.block if kb.size else 0
        if n > 0:
            for name, a in self.cached.items():
                self.tensors[name] = _drop_front(self.tensors[name], a, n)
            self.dropped += n
            self._kept_blocks = kb - n // self.block
        return n


def evictable(cache: KVCache) -> np.ndarray:
    """The first kept block of each head of ``cache`` (``cache.block`` keys a block): every block
    before it is negligible for every later query within the cache's horizon."""
    return cache.kept_blocks()
