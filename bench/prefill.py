"""A prefill on the GPU: N new queries at the end of M keys, foxc against its peers in one run.

    PYTHONPATH=/tmp/site python3 bench/prefill.py [--N 4096] [--M 16384] [--json out.json]

Inputs follow the standard workload (BENCHMARKS.md): B = 1, H = 16, D = 128, q and k
RMS-normalized, v ~ N(0, 1), bf16; gate logits `logit(exp(-a_h)) + N(0, 1)` (decode.py's
`workload`). Contestants, forward and forward + backward (every gradient, the gate's included),
medians of `triton.testing.do_bench`:

- foxc prefill: bench/fox_prefill.attn through the torch op (pruned; `no_prune=True` dense);
- foxc square: examples/fox.attn at T = M, the same keys (the rate the prefill is held to);
- FlexAttention + ACP: `flex_attention` (torch.compile) with the FoX score_mod and a block mask of
  the kept key blocks of the paper rule at its 128 x 128 blocks, queries at key positions
  `i + M - N`; the cumsum and mask are built outside its time;
- SDPA FoX dense: `scaled_dot_product_attention` with the decay and the causal offset as a float
  mask `[B, H, N, M]` (forward only: its mask has no gradient path to the gates).

"kept pairs" counts the causal (query, key) pairs of each contestant's kept blocks at its forward
tiles (foxc's from its own IR, Flex's 128 x 128), over all causal pairs; TFLOP/s is 4 D flops per
kept pair forward, 10 D forward + backward (5 products of D per pair), per step time. The
prefill's outputs are checked against an f32 eager reference (rel err; the square run has its
own inputs and no reference here).
"""

import argparse
import json
import math
import pathlib
import re
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import flex_acp  # noqa: E402
from decode import workload  # noqa: E402  (the standard workload's distributions)

import foxc  # noqa: E402
import foxc.torch  # noqa: E402,F401

ROOT = pathlib.Path(__file__).resolve().parents[1]
PREFILL = ROOT / "bench" / "fox_prefill.attn"
SQUARE = ROOT / "examples" / "fox.attn"
LOG_EPS = -10.0


def starts(c, delta, off, N, bm, bn):
    """First kept key block of each query block (rows at key positions i + off) under the block
    rule, and the block of its diagonal (the last key block its rows can see)."""
    mt, M = (N + bm - 1) // bm, c.shape[-1]
    nt = (M + bn - 1) // bn
    p0 = torch.arange(mt, device=c.device) * bm + off
    jend = torch.clamp(torch.arange(nt, device=c.device) * bn + bn - 1, max=M - 1)
    keep = (c[:, :, p0][..., :, None] - c[:, :, jend][..., None, :]) >= delta[..., None, None]
    idx = torch.arange(nt, device=c.device).expand_as(keep)
    first = torch.where(keep, idx, torch.full_like(idx, nt)).min(dim=-1).values
    last = torch.clamp(p0 + bm - 1, max=M - 1) // bn
    return torch.minimum(first, (p0 // bn).expand_as(first)), last


def kept_pairs(first, off, N, bm, bn):
    """Causal (query, key) pairs in the kept blocks: row i sees keys first*bn ..= i + off."""
    rows = torch.arange(N, device=first.device)
    lo = (first[..., rows // bm] * bn).to(torch.float64)
    return float(((rows + off + 1).to(torch.float64) - lo).clamp_min(0).sum().item())


def flex_mask(first, last, off, N, M, bm, bn):
    """Partial blocks first-touching the diagonal (mask_mod), blocks first..below them full."""
    from torch.nn.attention.flex_attention import BlockMask

    B, H, mt = first.shape
    dev = first.device
    nt = (M + bn - 1) // bn
    p0 = torch.arange(mt, device=dev) * bm + off
    d0 = p0 // bn  # the first block a row of the tile reaches on the diagonal
    nd = (last - d0 + 1).to(torch.int32)  # partial blocks per query block
    kv_num = nd.view(1, 1, mt).expand(B, H, mt).contiguous()
    kv_idx = torch.clamp(d0[:, None] + torch.arange(nt, device=dev), max=nt - 1).to(torch.int32)
    kv_idx = kv_idx.view(1, 1, mt, nt).expand(B, H, mt, nt).contiguous()
    full_num = (d0 - first).clamp_min(0).to(torch.int32)
    full_idx = torch.clamp(first[..., None] + torch.arange(nt, device=dev), max=nt - 1).to(torch.int32)

    def causal(b, h, q_idx, kv_idx):
        return q_idx + off >= kv_idx

    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(bm, bn), mask_mod=causal, seq_lengths=(N, M)
    )


def reference(q, k, v, fgate, off):
    c = torch.cumsum(F.logsigmoid(fgate.float()), -1)
    N, M, D = q.shape[-2], k.shape[-2], q.shape[-1]
    pos = torch.arange(N, device=q.device) + off
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(D) + c[..., pos, None] - c[..., None, :]
    s = s.masked_fill(torch.arange(M, device=q.device)[None, :] > pos[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v.float()


def ms_of(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--M", type=int, default=16384)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--json")
    a = ap.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    B, H, N, M, D = 1, a.H, a.N, a.M, a.D
    off = M - N
    flex = torch.compile(flex_attention, dynamic=False)
    q, k, v, fgate = workload(B, H, M, D, N=N)
    c = flex_acp.gate_cumsum(fgate)
    delta = flex_acp.paper_delta(flex_acp.qk_bound(q, k), LOG_EPS, M)
    ref = reference(q, k, v, fgate, off)
    gen = torch.Generator(device="cuda").manual_seed(5)
    dout = torch.randn(B, H, N, D, device="cuda", generator=gen).bfloat16()
    # The square run: M queries against M keys of the same distributions (its own workload).
    qs, ks, vs, fs = workload(B, H, M, D, seed=1, N=M)
    dout_sq = torch.randn(B, H, M, D, device="cuda", generator=gen).bfloat16()

    pre, pre_dense, sq = foxc.load(PREFILL), foxc.load(PREFILL, no_prune=True), foxc.load(SQUARE)
    tiles = lambda attn, dims: tuple(  # noqa: E731  (the forward's tiles, from its own IR)
        int(x) for x in re.search(r"attention \{[^}]*bm = (\d+), bn = (\d+)", attn.ir("opt", "sm_90a", dims)).groups()
    )
    bm_f, bn_f = tiles(pre, {"D": D, "N": N, "M": M})
    bm_s, bn_s = tiles(sq, {"D": D, "T": M})
    first_f, _ = starts(c, delta, off, N, bm_f, bn_f)
    first_x, last_x = starts(c, delta, off, N, 128, 128)
    delta_s = flex_acp.paper_delta(flex_acp.qk_bound(qs, ks), LOG_EPS, M)
    first_s, _ = starts(flex_acp.gate_cumsum(fs), delta_s, 0, M, bm_s, bn_s)
    bmask = flex_mask(first_x, last_x, off, N, M, 128, 128)
    cq = c[:, :, off:].contiguous()
    dense_pairs = B * H * (N * (off + 1) + N * (N - 1) / 2)
    dense_sq = B * H * M * (M + 1) / 2
    mask = {}

    def sdpa():
        if "m" not in mask:
            pos = torch.arange(N, device="cuda") + off
            m = (cq[..., :, None] - c[..., None, :]).masked_fill(
                torch.arange(M, device="cuda")[None, :] > pos[:, None], float("-inf")
            )
            mask["m"] = m.to(torch.bfloat16)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask["m"])

    def fox(attn):
        return lambda q_, k_, v_, f_: attn(q=q_, k=k_, v=v_, fgate=f_)

    def flex_fb(q_, k_, v_, f_):
        cc = flex_acp.gate_cumsum(f_)  # the gate's gradient through the cumsum, as foxc's
        # Two tensors (a copy for the queries'): Flex refuses one captured tensor indexed twice.
        return flex(q_, k_, v_, score_mod=flex_acp.fox_score_mod(cc[:, :, off:].contiguous(), cc), block_mask=bmask)

    # (name, forward of the prefill's or the square's inputs, its pairs, dense pairs, inputs, dout)
    prefill_in = (q, k, v, fgate)
    contestants = [
        ("foxc prefill", fox(pre), kept_pairs(first_f, off, N, bm_f, bn_f), dense_pairs, prefill_in, dout),
        ("foxc prefill dense", fox(pre_dense), dense_pairs, dense_pairs, prefill_in, dout),
        ("foxc square (T = M)", fox(sq), kept_pairs(first_s, 0, M, bm_s, bn_s), dense_sq, (qs, ks, vs, fs), dout_sq),
        ("Flex + ACP", flex_fb, kept_pairs(first_x, off, N, 128, 128), dense_pairs, prefill_in, dout),
        ("SDPA FoX dense", None, dense_pairs, dense_pairs, prefill_in, None),
    ]
    rows = []
    print(f"device: {torch.cuda.get_device_name()}; B={B} H={H} N={N} M={M} D={D}; foxc tiles: prefill "
          f"{bm_f}x{bn_f}, square {bm_s}x{bn_s}")
    print("| contestant | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | kept pairs / causal | rel err |")
    print("|---|---|---|---|---|---|---|")
    for name, fn, pairs, dense, args, dy in contestants:
        try:
            if fn is None:
                fwd = sdpa
            else:
                fwd = lambda fn=fn, args=args: fn(*args)  # noqa: E731
            out = fwd()
            err = rel(out, ref) if out.shape == ref.shape else float("nan")
            ms_f = ms_of(fwd)
            ms_b = None
            if fn is not None:
                xs = [t.detach().clone().requires_grad_(True) for t in args]

                def run(fn=fn, xs=xs, dy=dy):
                    for x in xs:
                        x.grad = None
                    fn(*xs).backward(dy)

                run()
                ms_b = ms_of(run)
        except Exception as e:  # a contestant that cannot run this shape: say so, go on
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:160]} |", flush=True)
            continue
        tf_f = 4 * D * pairs / (ms_f * 1e-3) / 1e12
        tf_b = 10 * D * pairs / (ms_b * 1e-3) / 1e12 if ms_b else None
        fb_s = f"{ms_b:.3f} | {tf_b:.0f}" if ms_b else "n/a | n/a"
        err_s = f"{err:.1e}" if err == err else "n/a"
        print(f"| {name} | {ms_f:.3f} | {tf_f:.0f} | {fb_s} | {pairs / dense:.3f} | {err_s} |", flush=True)
        rows.append(dict(name=name, fwd_ms=ms_f, fwd_tflops=tf_f, fb_ms=ms_b, fb_tflops=tf_b, kept=pairs / dense, err=err))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
