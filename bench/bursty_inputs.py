#!/usr/bin/env python3
"""Rewrite a standard-workload safetensors file (`foxc inputs`) into the no-QK-norm,
bursty-gate workload of the kept-tile table (BENCHMARKS.md, "Kept-tile fraction per rule").

- q, k: N(0, 1) rows scaled by a log-normal amplitude exp(0.5 z) per row (no QK-norm: the norms
  vary, so the global maxima are well above the typical row and tile maxima differ);
- fgate: mostly remembering (gate logit +8, log f = -3.4e-4 per token) with bursts of 16
  tokens of strong forgetting (logit -2, log f = -2.13); head h starts a burst at a token with
  probability 2^-(h mod 8 + 3) (from 1/8 to 1/1024), so some heads forget often, some rarely;
- everything else (v) is kept. Deterministic in --seed. Needs numpy.

usage: bursty_inputs.py IN.safetensors OUT.safetensors [--seed N]
"""
import json
import struct
import sys

import numpy as np


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def to_f32(meta, buf):
    a, b = meta["data_offsets"]
    raw = buf[a:b]
    if meta["dtype"] == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(meta["shape"]).copy()
    if meta["dtype"] == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view("<f4").reshape(meta["shape"]).copy()
    sys.exit(f"unsupported dtype {meta['dtype']}")


def from_f32(dtype, x):
    x = np.ascontiguousarray(x, dtype="<f4")
    if dtype == "F32":
        return x.tobytes()
    # bf16, round to nearest even (NaN does not occur here)
    bits = x.view("<u4").astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype("<u2").tobytes()


def main():
    args = sys.argv[1:]
    seed = 0
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    header, buf = read(args[0])
    rng = np.random.default_rng(seed)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        x = to_f32(meta, buf)
        if name in ("q", "k") and x.ndim == 4:
            amp = np.exp(0.5 * rng.standard_normal(x.shape[:3] + (1,)))
            x = (rng.standard_normal(x.shape) * amp).astype(np.float32)
        elif name == "fgate" and x.ndim == 3:
            b, h, t = x.shape
            x = np.full(x.shape, 8.0, dtype=np.float32)
            for hi in range(h):
                p = 2.0 ** -(hi % 8 + 3)
                starts = rng.random((b, t)) < p
                burst = np.zeros((b, t), dtype=bool)
                for s in range(16):
                    burst[:, s:] |= starts[:, : t - s]
                x[:, hi, :][burst] = -2.0
        out[name] = (meta["dtype"], list(x.shape), from_f32(meta["dtype"], x))
    offset, hdr, blobs = 0, {}, []
    for name, (dt, shape, blob) in out.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(args[1], "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for blob in blobs:
            f.write(blob)


if __name__ == "__main__":
    main()
