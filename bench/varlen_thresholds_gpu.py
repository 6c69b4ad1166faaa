"""Device check of two Python entry points on torch CUDA tensors (issue 25, items 5 and 9):

- ``foxc.load(path, thresholds=[...])``: per-head thresholds given by the user; the GPU's output
  against the CPU backend's (the same program, the same bf16 inputs; the CPU is checked against
  the f64 interpreter by python/tests/test_thresholds.py), and a call of another H refused with
  a ValueError before any launch;
- ``foxc.fox.attention(q, k, v, gate, cu_seqlens=cu)``: packed sequences of unequal lengths
  (1 token included) on the GPU against each sequence run alone on the GPU and against the CPU
  backend's packed run; ``cu_seqlens`` as a CUDA int32 and a CPU int64 tensor.

    PYTHONPATH=/tmp/site python3 bench/varlen_thresholds_gpu.py

Without torch or CUDA it runs the same comparisons on NumPy (CPU backend against itself: a
smoke test of the script). Exit 1 on any failure."""

import math
import pathlib
import sys

import numpy as np

import foxc

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOX = ROOT / "examples" / "fox.attn"
TOL = 1e-2  # GPU against CPU, relative L2 (DESIGN.md section 5: the GPU's contract)

try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:
    torch, CUDA = None, False


def dev(x, dtype):
    """`x` (NumPy f32) as the device's tensor of `dtype` ("bf16", "f32", "i32", "i64")."""
    if not CUDA:
        return x.astype(np.int64 if dtype == "i64" else np.int32) if dtype in ("i32", "i64") else x
    t = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32, "i64": torch.int64}[dtype]
    return torch.from_numpy(np.ascontiguousarray(x)).to("cuda", t)


def host(y):
    if CUDA:
        torch.cuda.synchronize()
        return y.float().cpu().numpy().astype(np.float64)
    return np.asarray(y, dtype=np.float64)


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


failures = []


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what} {detail}")
    if not ok:
        failures.append(what)


def bf16_round(x):
    """f32 NumPy rounded through bf16 (what the GPU sees), for the CPU run."""
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


rng = np.random.default_rng(7)

# ---- per-head thresholds
for D in (64, 128):
    B, H, T = 2, 4, 3000
    x = {n: bf16_round((rng.standard_normal((B, H, T, D)) * 1.5).astype(np.float32)) for n in ("q", "k")}
    x["v"] = bf16_round(rng.standard_normal((B, H, T, D)).astype(np.float32))
    x["fgate"] = (rng.standard_normal((B, H, T)) + np.linspace(-2.0, 4.0, H).reshape(1, H, 1)).astype(np.float32)
    for table in ([-30.0, -20.0, -math.inf, -40.0], [-12.0, -math.inf, -8.0, -16.0]):
        attn = foxc.load(FOX, thresholds=table)
        cpu = np.asarray(attn(**x), dtype=np.float64)
        gpu = host(attn(**{n: dev(a, "f32" if n == "fgate" else "bf16") for n, a in x.items()}))
        e = rel(gpu, cpu)
        check(f"thresholds {table} D={D}: GPU vs CPU", e <= TOL, f"rel L2 {e:.3g}")
    x3 = {n: a[:, :3] for n, a in x.items()}
    try:
        attn(**{n: dev(np.ascontiguousarray(a), "f32" if n == "fgate" else "bf16") for n, a in x3.items()})
        check(f"thresholds D={D}: H = 3 against 4 thresholds refused", False, "it ran")
    except ValueError as err:
        check(f"thresholds D={D}: H = 3 against 4 thresholds refused", "per-head thresholds" in str(err), str(err))

# ---- packed sequences by cumulative offsets
for D in (64, 128):
    lengths = [1, 700, 37, 1500, 1, 761]
    total, H = sum(lengths), 4
    q, k, v = (bf16_round(rng.standard_normal((total, H, D)).astype(np.float32)) for _ in range(3))
    g = (rng.standard_normal((total, H)) + np.linspace(-3.0, 4.0, H)[None, :]).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cpu = np.asarray(foxc.fox.attention(q, k, v, g, cu_seqlens=cu), dtype=np.float64)
    dq, dk, dv, dg = dev(q, "bf16"), dev(k, "bf16"), dev(v, "bf16"), dev(g, "f32")
    for cu_dev, name in ((dev(cu, "i32"), "int32 on the device"), (cu if not CUDA else torch.from_numpy(cu), "int64 on the host")):
        gpu = host(foxc.fox.attention(dq, dk, dv, dg, cu_seqlens=cu_dev))
        e = rel(gpu, cpu)
        check(f"packed D={D} cu_seqlens {name}: GPU vs CPU", e <= TOL, f"rel L2 {e:.3g}")
    for s, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        alone = host(foxc.fox.attention(dq[None, a:b], dk[None, a:b], dv[None, a:b], dg[None, a:b], head_first=False))[0]
        e = rel(gpu[a:b], alone)
        check(f"packed D={D} sequence {s} ({b - a} tokens): packed vs alone on the GPU", e <= TOL, f"rel L2 {e:.3g}")

print(f"{'CUDA' if CUDA else 'NumPy (no CUDA)'}: {'all passed' if not failures else f'{len(failures)} FAILED'}")
sys.exit(1 if failures else 0)
