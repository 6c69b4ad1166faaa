#!/usr/bin/env python3
"""Compare two safetensors files of foxc outputs tensor by tensor (numpy only: the device scripts
run it where torch may be missing, and it reads the format by hand).

    python3 bench/compare_outputs.py A.safetensors B.safetensors LABEL [--rel-tol X]

Prints one `cmp` line per tensor: bitwise equal or not, how many elements differ, the relative L2
distance of B from A and B's NaN count. Exit 0 when every tensor is bitwise equal, or, with
--rel-tol, when every tensor is within X relative L2 and free of NaN (two builds whose attention
kernels round bf16 differently); exit 1 otherwise (also when the tensor names differ).
"""

import argparse
import json
import struct
import sys

import numpy as np


def load(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    return {
        k: (v["dtype"], tuple(v["shape"]), body[v["data_offsets"][0] : v["data_offsets"][1]])
        for k, v in head.items()
        if k != "__metadata__"
    }


def as_f64(dtype, raw):
    if dtype == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.frombuffer(raw, {"F32": np.float32, "F16": np.float16, "I32": np.int32}[dtype]).astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("label")
    ap.add_argument("--rel-tol", type=float, help="accept a relative L2 distance below this instead of equal bits")
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    ok = set(a) == set(b)
    if not ok:
        print(f"cmp {args.label}: tensors differ: {sorted(a)} vs {sorted(b)}")
    for k in sorted(set(a) & set(b)):
        (da, sa, ra), (db, sb, rb) = a[k], b[k]
        same = (da, sa, ra) == (db, sb, rb)
        x, y = as_f64(da, ra), as_f64(db, rb)
        if x.shape == y.shape:
            rel = float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30))
            ndiff = int((x != y).sum())
        else:
            rel, ndiff = float("nan"), -1
        nan = int(np.isnan(y).sum())
        print(f"cmp {args.label} {k} {sb} {db}: bitwise {'equal' if same else 'DIFFERENT'} "
              f"({ndiff} elements differ), rel L2 {rel:.3e}, nan {nan}")
        ok = ok and (same if args.rel_tol is None else (rel < args.rel_tol and nan == 0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
