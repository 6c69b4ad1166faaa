"""Issue 11 item 3 through the torch op: pruned against `no_prune=True` at one head, where little
is pruned and the prelude's gate scan is a visible share of the time. The CLI binds T and picks
the split prelude above one scan segment (T > 8192); the torch op compiles one plan per class of
T (`passes::fuse_out::split_rows_bounds`). Information, not a check: prints one line per shape.

    PYTHONPATH=<site with the foxc wheel> python3 bench/python_long_rows.py [B=1,H=1,T=65536,D=64 ...]

Each round times 20 back-to-back calls of each plan between two CUDA events (the calls are
asynchronous, so the host's work per call hides behind the GPU's at these sizes); the line
gives the median over ROUNDS rounds (alternating pruned and dense) and the plan's prelude kernel.
"""

import math
import pathlib
import statistics
import sys

import torch

import foxc
import foxc.torch  # noqa: F401  (registers torch.ops.foxc.attention)

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
ROUNDS = 7
CALLS = 20


def inputs(B, H, T, D):
    """The standard workload's inputs at one head (BENCHMARKS.md): q, k with
    |x| = sqrt(D); gate logits logit(exp(-1e-4)) + N(0, 1), head 0's mean decay of 1e-4 per
    token, under which little is pruned: the case item 3 is about."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", generator=g) for _ in range(3))
    q, k = (x * D**0.5 / x.norm(dim=-1, keepdim=True) for x in (q, k))
    fgate = -math.log(math.expm1(1e-4)) + torch.randn(B, H, T, device="cuda", generator=g)
    return {"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16(), "fgate": fgate}


def round_ms(fn):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(CALLS):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / CALLS


def main():
    shapes = sys.argv[1:] or ["B=1,H=1,T=8192,D=128", "B=1,H=1,T=32768,D=128", "B=1,H=1,T=65536,D=64"]
    pruned = foxc.load(EXAMPLES / "fox.attn")
    dense = foxc.load(EXAMPLES / "fox.attn", no_prune=True)
    dev = torch.cuda.current_device()
    for shape in shapes:
        d = dict(kv.split("=") for kv in shape.split(","))
        x = inputs(*(int(d[n]) for n in "BHTD"))
        times = {"pruned": [], "dense": []}
        for _ in range(3):  # compile, load, warm the clocks
            pruned(**x), dense(**x)
        for _ in range(ROUNDS):
            times["pruned"].append(round_ms(lambda: pruned(**x)))
            times["dense"].append(round_ms(lambda: dense(**x)))
        ptx = pruned._gpu_plans[("attention", dev, tuple(tuple(x[n].shape) for n in pruned.params))].ptx
        kernel = "split" if "threshold_with_split_scan" in ptx else "whole rows"
        p, q = (statistics.median(times[k]) for k in ("pruned", "dense"))
        print(f"torch op {shape}: pruned {p:.4f} ms, dense {q:.4f} ms ({1000 * (p - q):+.1f} us; prelude: {kernel})")


if __name__ == "__main__":
    main()
