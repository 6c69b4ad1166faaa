"""Where a GPU decode step's time goes: each foxc kernel of one step (torch profiler, mean of 10
steps) for foxc pruned, the KVCache's norms-bounded program and dense, at one M.

    PYTHONPATH=/tmp/site python3 bench/decode_profile.py [--M 131072] [--B 1 8] [--tiles 64 128]

Inputs are bench/decode.py's (the standard workload's distributions, H = 16, D = 128).
"""

import argparse
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import decode  # noqa: E402

import foxc  # noqa: E402
import foxc.torch  # noqa: E402,F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--M", type=int, default=131072)
    ap.add_argument("--B", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--tiles", type=int, nargs=2, help="BM BN (default: the tiles pass's)")
    a = ap.parse_args()
    tiles = tuple(a.tiles) if a.tiles else None
    pruned = foxc.load(decode.PREFILL, tiles=tiles)
    programs = {
        "pruned": pruned,
        "norms bounded": decode.norms_bounded(pruned, a.D),
        "dense": foxc.load(decode.PREFILL, no_prune=True, tiles=tiles),
    }
    for B in a.B:
        q, k, v, fgate = decode.workload(B, a.H, a.M, a.D)
        for name, attn in programs.items():
            step = lambda: attn(q=q, k=k, v=v, fgate=fgate)  # noqa: E731
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step()
                torch.cuda.synchronize()
            kernels = [(e.key, e.device_time_total / 10) for e in prof.key_averages() if e.key.startswith("foxc")]
            total = sum(t for _, t in kernels)
            print(f"M={a.M} B={B} {name}: {total:.1f} us of kernels per step")
            for key, us in sorted(kernels, key=lambda kv: -kv[1]):
                print(f"    {us:8.1f} us  {key}")


if __name__ == "__main__":
    main()
