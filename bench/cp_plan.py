"""Bytes a context-parallel FoX forward sends with foxc's plan, against plain ring attention,
on the standard workload (bench/WORKLOAD.md inputs, B = 1, H = 16, D = 128, bf16 K and V).

The kept set is foxc's own: the program's gate cumsum, threshold and block boundary
(``foxc.distributed``), on the whole sequence; the plan is what each of P contiguous chunks
needs from the earlier ones (``foxc.distributed.plan_from_starts``). No GPU: the plan is a
function of the gate and of q/k norms only.

    PYTHONPATH=<foxc wheel> python3 bench/cp_plan.py [--T 131072 262144] [--P 2 4 8]

The inputs follow WORKLOAD.md (per-head mean decay a_h = 10^(-4 + 4h/(H-1)), gate logits
logit(exp(-a_h)) + N(0, 1), q and k RMS-normalized N(0, 1)) drawn with NumPy's generator, not
`foxc inputs`' (same distribution, different numbers).
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

import foxc
from foxc import distributed as cp

ROOT = pathlib.Path(__file__).resolve().parents[1]


def rms_normed(rng, shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    return x / np.sqrt((x * x).mean(-1, keepdims=True))


def gate_logits(rng, H, T):
    a = 10.0 ** (-4.0 + 4.0 * np.arange(H) / (H - 1))
    logit = np.log(np.exp(-a)) - np.log1p(-np.exp(-a))
    return (logit.reshape(1, H, 1) + rng.standard_normal((1, H, T))).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[131072, 262144])
    ap.add_argument("--P", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--rule", default="paper")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    attn = foxc.load(str(ROOT / "examples" / "fox.attn"), prune_rule=a.rule)
    bm, bn = cp.tiles(attn)
    gib = 2.0**30
    print(f"fox.attn, rule {a.rule}, tiles {bm}x{bn}, B=1 H={a.H} D={a.D}, K and V bf16; GiB sent in total")
    print(
        "| T | P | plan (kept K/V tiles) | plan overhead (gate, thresholds, norms) | causal all-to-later | plain ring "
        "| plan / ring | plan+overhead / ring | busiest rank receives (plan / ring) | kept tiles |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for T in a.T:
        t0 = time.perf_counter()
        rng = np.random.default_rng(a.seed)
        fgate = gate_logits(rng, a.H, T)
        c = cp.decay_cumsum(attn, fgate=fgate)
        # The threshold per head (q and k of one head at a time: the interpreter works in f64).
        delta = np.concatenate(
            [cp.threshold(attn, rms_normed(rng, (1, 1, T, a.D)), rms_normed(rng, (1, 1, T, a.D))) for _ in range(a.H)],
            axis=1,
        )
        starts = cp.boundary(attn, c, delta)
        mt = starts.shape[2]
        diag = (np.minimum(np.arange(mt) * bm + bm - 1, T - 1) // bn).reshape(1, 1, mt)
        kept = float((diag - starts + 1).sum() / np.broadcast_to(diag + 1, starts.shape).sum())
        for P in a.P:
            b = cp.plan_from_starts(starts, bm, bn, P).bytes(d=a.D)
            print(
                f"| {T} | {P} | {b['plan'] / gib:.3f} | {b['plan_overhead'] / gib:.4f} | {b['causal'] / gib:.3f} | "
                f"{b['ring'] / gib:.3f} | {b['plan'] / b['ring']:.4f} | {(b['plan'] + b['plan_overhead']) / b['ring']:.4f} | "
                f"{b['plan_max_rank'] / gib:.3f} / {b['ring'] / P / gib:.3f} | {kept:.3f} |"
            )
        print(f"<!-- T = {T}: {time.perf_counter() - t0:.1f} s on this CPU (inputs, cumsum, threshold, boundary, plans) -->")


if __name__ == "__main__":
    main()
