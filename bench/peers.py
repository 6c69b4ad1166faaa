#!/usr/bin/env python3
"""Time the peers of foxc on the inputs `foxc inputs` wrote (shared/bench/WORKLOAD.md).

    python3 bench/peers.py in.safetensors [--variant fox|softcap|gqa] [--foxc-out out.safetensors]
                           [--log-eps -10] [--block 128]

Reads q, k, v (bf16 [B, H, T, D]) and fgate (f32 gate logits [B, H, T]), and prints CSV rows
`peer,shape,ms,kept,rel_l2`:
- `sdpa`: torch scaled_dot_product_attention, dense causal, no gate (rel_l2 against an f32 causal
  reference without gate);
- `flex_fox_acp`: FlexAttention FoX (score_mod adds c[q] - c[kv]) under torch.compile with the
  ACP block mask (paper rule with QK-norm, 128x128 blocks), rel_l2 against an f32 dense FoX
  reference;
- `flex_fox_dense`: the same without the block mask;
- `foxc` (only with --foxc-out): foxc's output file compared with the same FoX reference (no time).
Variants (the same score_mod foxc compiles from examples/fox_softcap.attn and examples/fox_gqa.attn):
- `softcap`: score_mod `20 tanh(score / 20) + c[q] - c[kv]`; the ACP block mask uses the static bound U = 20
  (delta = log_eps - 2 U - ln T), as foxc's interval analysis does;
- `gqa`: k and v have G < H heads (kv head = h / (H / G)), FlexAttention with enable_gqa=True; the block
  mask's U uses each query head's kv head.
Times: triton.testing.do_bench(warmup=50, rep=300, return_mode="median"), in ms.
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

LOG_F_FLOOR = -100.0


def gate_cumsum(fgate):
    """c[t] = sum_{l <= t} max(logsigmoid(z_l), -100), in f32 (SEMANTICS.md gate_cumsum Logits)."""
    return torch.cumsum(F.logsigmoid(fgate.float()).clamp_min(LOG_F_FLOOR), dim=-1)


def block_starts(c, delta, bm, bn):
    """start[b, h, m] of the block rule (SEMANTICS.md block_boundary) for a per-(b, h) delta."""
    B, H, T = c.shape
    mt = (T + bm - 1) // bm
    nt = (T + bn - 1) // bn
    i0 = torch.arange(mt, device=c.device) * bm
    jend = torch.clamp(torch.arange(nt, device=c.device) * bn + bn - 1, max=T - 1)
    ci = c[:, :, i0]  # [B, H, Mt]
    cj = c[:, :, jend]  # [B, H, Nt]
    keep = (ci[..., :, None] - cj[..., None, :]) >= delta[..., None, None]  # [B, H, Mt, Nt]
    # first kept n (keep is monotone in n); none kept -> nt
    idx = torch.arange(nt, device=c.device).expand_as(keep)
    first = torch.where(keep, idx, torch.full_like(idx, nt)).min(dim=-1).values
    diag = i0 // bn
    return torch.minimum(first, diag.expand_as(first)), diag


def kept_fraction(start, bm, bn, T):
    i0 = torch.arange(start.shape[-1], device=start.device) * bm
    diag = torch.clamp(i0 + bm - 1, max=T - 1) // bn
    kept = (diag - start + 1).sum().item()
    total = ((diag + 1).sum() * start.shape[0] * start.shape[1]).item()
    return kept / total


SOFTCAP = 20.0


def reference(q, k, v, c, chunk=2048, softcap=None):
    """Dense causal attention with bias c_i - c_j (or none if c is None), f32, one head at a time.
    k and v may have fewer heads than q (grouped-query: kv head = h // (H // G)); `softcap` caps the
    scaled scores as `a tanh(s / a)` before the bias is added."""
    B, H, T, D = q.shape
    group = H // k.shape[1]
    scale = 1.0 / math.sqrt(D)
    out = torch.empty(B, H, T, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        for h in range(H):
            qf, kf, vf = q[b, h].float(), k[b, h // group].float(), v[b, h // group].float()
            for s in range(0, T, chunk):
                e = min(s + chunk, T)
                sc = (qf[s:e] @ kf[:e].T) * scale
                if softcap is not None:
                    sc = softcap * torch.tanh(sc / softcap)
                if c is not None:
                    sc = sc + (c[b, h, s:e, None] - c[b, h, None, :e])
                i = torch.arange(s, e, device=q.device)[:, None]
                j = torch.arange(e, device=q.device)[None, :]
                sc = sc.masked_fill(j > i, float("-inf"))
                out[b, h, s:e] = torch.softmax(sc, dim=-1) @ vf[:e]
    return out


def rel_l2(x, ref):
    x = x.float()
    if torch.isnan(x).any():
        return float("nan")
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs")
    ap.add_argument("--foxc-out", help="foxc's output safetensors (tensor `out`) to check against the reference")
    ap.add_argument("--variant", choices=["fox", "softcap", "gqa"], default="fox")
    ap.add_argument("--log-eps", type=float, default=-10.0)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--no-dense-flex", action="store_true", help="skip FlexAttention without the block mask")
    ap.add_argument("--no-ref", action="store_true", help="skip the f32 references (no rel_l2)")
    args = ap.parse_args()

    import triton.testing
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.cache_size_limit = 1024

    dev = "cuda"
    t = load_file(args.inputs, device=dev)
    q, k, v, fgate = t["q"], t["k"], t["v"], t["fgate"]
    B, H, T, D = q.shape
    G = k.shape[1]
    group = H // G
    shape = f"{B}x{H}x{T}x{D}" + (f"_G{G}" if G != H else "")
    c = gate_cumsum(fgate)
    bm = bn = args.block
    softcap = SOFTCAP if args.variant == "softcap" else None
    scale = 1.0 / math.sqrt(D)
    if softcap is not None:
        # Static bound of the capped scores: |20 tanh(s / 20)| <= 20.
        u = torch.full((B, H), softcap, device=dev)
    else:
        # The paper's threshold with QK-norm (WORKLOAD.md): U = scale * max|q| * max|k| per (b, h),
        # k read at the query head's kv head.
        qmax = q.float().norm(dim=-1).amax(dim=-1)
        kmax = k.float().norm(dim=-1).amax(dim=-1).repeat_interleave(group, dim=1)
        u = scale * qmax * kmax
    delta = args.log_eps - 2.0 * u - math.log(T)
    start, _ = block_starts(c, delta, bm, bn)
    kept = kept_fraction(start, bm, bn, T)

    mt = start.shape[-1]
    nt = (T + bn - 1) // bn
    m_idx = torch.arange(mt, device=dev)
    diag = (m_idx * bm) // bn
    # Partial block: the diagonal (causal mask_mod). Full blocks: start .. diagonal - 1.
    kv_num = torch.ones(B, H, mt, dtype=torch.int32, device=dev)
    kv_idx = torch.zeros(B, H, mt, nt, dtype=torch.int32, device=dev)
    kv_idx[..., 0] = diag.to(torch.int32)
    full_num = (diag - start).clamp_min(0).to(torch.int32)
    ar = torch.arange(nt, device=dev)
    full_idx = torch.clamp(start[..., None] + ar, max=nt - 1).to(torch.int32)

    def causal(b, h, q_idx, kv_idx_):
        return q_idx >= kv_idx_

    block_mask = BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(bm, bn), mask_mod=causal, seq_lengths=(T, T)
    )

    if softcap is not None:

        def score_mod(score, b, h, q_idx, kv_idx_):
            return softcap * torch.tanh(score / softcap) + (c[b, h, q_idx] - c[b, h, kv_idx_])

    else:

        def score_mod(score, b, h, q_idx, kv_idx_):
            return score + (c[b, h, q_idx] - c[b, h, kv_idx_])

    gqa = G != H
    flex = torch.compile(flex_attention)
    runs = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa),
        f"flex_{args.variant}_acp": lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa),
    }
    if not args.no_dense_flex:
        from torch.nn.attention.flex_attention import create_block_mask

        dense_mask = create_block_mask(causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=dev)
        runs[f"flex_{args.variant}_dense"] = lambda: flex(
            q, k, v, score_mod=score_mod, block_mask=dense_mask, enable_gqa=gqa
        )

    ref_fox = ref_causal = None
    if not args.no_ref:
        ref_fox = reference(q, k, v, c, softcap=softcap)
        ref_causal = reference(q, k, v, None)

    print("peer,shape,ms,kept,rel_l2")
    for name, fn in runs.items():
        out = fn()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
        ref = ref_causal if name == "sdpa" else ref_fox
        err = rel_l2(out, ref) if ref is not None else float("nan")
        k_frac = kept if name.endswith("_acp") else 1.0
        print(f"{name},{shape},{ms:.4f},{k_frac:.4f},{err:.3e}", flush=True)
    if args.foxc_out:
        o = load_file(args.foxc_out, device=dev)["out"]
        err = rel_l2(o, ref_fox) if ref_fox is not None else float("nan")
        print(f"foxc,{shape},,{kept:.4f},{err:.3e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
