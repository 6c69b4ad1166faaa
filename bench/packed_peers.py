#!/usr/bin/env python3
"""FlexAttention peers of foxc on a packed batch (the program .../packed.attn of
tests/packed.rs: each token's first key `first[b, t]` is its sequence's start).

    python3 bench/packed_peers.py in.safetensors [--log-eps -10] [--block 128]

Reads q, k, v (bf16 [B, H, T, D]), fgate (f32 [B, H, T]) and first (i32 [B, T]) as `foxc inputs`
writes them (with `first` rewritten to whole sequences), and prints CSV rows `peer,pass,ms,kept`
(pass `forward`, or `forward+backward`: out.backward(dout), dout N(0, 1) seeded, the gate's
gradient included):
- `flex_doc_dense`: FlexAttention FoX (score_mod adds c[q] - c[kv]) under the document mask
  `first[b, q] <= kv <= q` (create_block_mask: the other sequences' blocks are skipped);
- `flex_doc_acp`: the same mask ANDed with ACP's (paper rule, QK-norm bound, the keys from
  each query block's start on), so both skips apply.
`kept` is the fraction of causal blocks the block mask holds. Block masks are built outside
the timed region. Times: triton.testing.do_bench(warmup=50, rep=300, median), ms.
"""

import argparse
import pathlib
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from flex_acp import block_starts, fox_score_mod, gate_cumsum, paper_delta, qk_bound  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs")
    ap.add_argument("--log-eps", type=float, default=-10.0)
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args()
    import triton.testing
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    t = load_file(args.inputs, device="cuda")
    q, k, v, fgate, first = t["q"], t["k"], t["v"], t["fgate"], t["first"].int()
    B, H, T, D = q.shape
    blk = args.block
    c = gate_cumsum(fgate)
    u = qk_bound(q, k)
    start, _ = block_starts(c, paper_delta(u, args.log_eps, T), blk, blk)
    start = start.int()

    def doc(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= first[b, q_idx])

    def doc_acp(b, h, q_idx, kv_idx):
        return doc(b, h, q_idx, kv_idx) & (kv_idx >= start[b, h, q_idx // blk] * blk)

    masks = {
        "flex_doc_dense": create_block_mask(doc, B=B, H=None, Q_LEN=T, KV_LEN=T, BLOCK_SIZE=blk),
        "flex_doc_acp": create_block_mask(doc_acp, B=B, H=H, Q_LEN=T, KV_LEN=T, BLOCK_SIZE=blk),
    }
    causal_blocks = (T // blk) * (T // blk + 1) // 2

    def attend(q, k, v, fgate, mask):
        c = gate_cumsum(fgate)
        return flex_attention(q, k, v, score_mod=fox_score_mod(c, c.clone()), block_mask=mask)

    flex = torch.compile(attend, dynamic=False)
    dout = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(q.dtype)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, fgate)]
    for name, mask in masks.items():
        # Blocks the mask holds (full or partial), over the causal blocks of every (b, h).
        full = mask.full_kv_num_blocks.sum() if mask.full_kv_num_blocks is not None else 0
        heads = mask.kv_num_blocks.shape[0] * mask.kv_num_blocks.shape[1]
        kept = (mask.kv_num_blocks.sum() + full).item() / (heads * causal_blocks)

        def step():
            flex(*leaves, mask).backward(dout)

        with torch.no_grad():
            ms = triton.testing.do_bench(lambda: flex(*leaves, mask), warmup=50, rep=300, return_mode="median")
        print(f"{name},forward,{ms:.4f},{kept:.4f}", flush=True)
        ms = triton.testing.do_bench(step, warmup=50, rep=300, grad_to_none=leaves, return_mode="median")
        print(f"{name},forward+backward,{ms:.4f},{kept:.4f}", flush=True)


if __name__ == "__main__":
    main()
