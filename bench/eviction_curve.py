"""Keys a decode must hold against T under foxc's provably safe eviction (CPU, the foxc wheel).

    python3 bench/eviction_curve.py [--T 131072] [--H 16] [--D 128] [--seed 0] [--json out.json]

One sequence of the standard workload's gates (BENCHMARKS.md: head h decays by `a_h = 10^(-4 +
4h/(H-1))` per token on average, gate logits `logit(exp(-a_h)) + N(0, 1)`), drawn here by NumPy
(the same distribution as `foxc inputs`, not the same numbers); queries and keys of norm sqrt(D)
(QK-norm, the workload's), the horizon `max_keys = T`. At each length t the table gives the keys a
cache must hold after evicting everything `foxc.evictable` proves negligible for every later query:
a dense cache (`foxc.KVCache`: one length for all heads, so the head that remembers longest
decides) and a paged cache (each head drops its own blocks, `KVCache.held_per_head`). The
decisions are the extension's (`_foxc.first_kept_blocks`: the program's rule at the horizon's
worst corner, on the interpreter's decay cumsum), exactly what the cache runs.
"""

import argparse
import json
import math
import pathlib

import numpy as np

import foxc
from foxc import _foxc

PREFILL = pathlib.Path(__file__).resolve().parent / "fox_prefill.attn"


def gates(rng, H, T):
    a = 10.0 ** (-4.0 + 4.0 * np.arange(H) / (H - 1))
    logit = -a - np.log(-np.expm1(-a))
    return (logit[:, None] + rng.standard_normal((H, T))).astype(np.float32)[None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    attn = foxc.load(PREFILL)
    info = dict(_foxc.eviction_info(attn._program))
    bn = int(info["bn"])
    fgate = gates(np.random.default_rng(a.seed), a.H, a.T)
    norm = math.sqrt(a.D) * (1 + 2.0**-8)  # bf16 rounding of a row of norm sqrt(D)
    lengths = sorted({min(a.T, 1024 << s) for s in range(32) if (1024 << s) < 2 * a.T})
    rows = []
    print(f"fox_prefill, key block {bn}, H = {a.H}, D = {a.D}, horizon max_keys = {a.T}, |q|, |k| <= {norm:.4f}")
    print("| t | dense cache holds | dense / t | paged cache holds (all heads) | paged / (H t) | per head (keys held) |")
    print("|---|---|---|---|---|---|")
    for t in lengths:
        x = np.ascontiguousarray(fgate[..., :t])
        wires = {"fgate": ("f32", list(x.shape), x.tobytes())}
        dims = {"B": 1, "H": a.H, "M": t, "D": a.D, "N": 1}
        shape, data, delta = _foxc.first_kept_blocks(attn._program, wires, dims, a.T, norm, norm)
        first = np.frombuffer(data, dtype="<i4").reshape(shape)[0].astype(np.int64)
        per_head = t - first * bn
        dense = t - int(first.min()) * bn
        paged = int(per_head.sum())
        rows.append(dict(t=t, dense=dense, paged=paged, per_head=per_head.tolist(), delta=delta))
        print(
            f"| {t} | {dense} | {dense / t:.3f} | {paged} | {paged / (a.H * t):.3f} | "
            f"{' '.join(str(int(n)) for n in per_head)} |",
            flush=True,
        )
    print(f"threshold at the horizon: delta = {rows[-1]['delta']:.3f}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
