#!/usr/bin/env python3
"""Time the peers of foxc on the inputs `foxc inputs` wrote (the standard workload, BENCHMARKS.md).

    python3 bench/peers.py in.safetensors [--variant fox|softcap|gqa|gate|rope] [--foxc-out out.safetensors]
                           [--log-eps -10] [--block 128]
    python3 bench/peers.py in4k.safetensors in8k.safetensors ... --grad [--foxc]

Reads q, k, v (bf16 [B, H, T, D]) and fgate (f32 gate logits [B, H, T]), and prints CSV rows
`peer,shape,ms,kept,rel_l2`:
- `sdpa`: torch scaled_dot_product_attention, dense causal, no gate (rel_l2 against an f32 causal
  reference without gate);
- `flex_fox_acp`: FlexAttention FoX (score_mod adds c[q] - c[kv]) under torch.compile with the
  ACP block mask (paper rule with QK-norm, 128x128 blocks), rel_l2 against an f32 dense FoX
  reference;
- `flex_fox_dense`: the same without the block mask;
- `foxc` (only with --foxc-out): foxc's output file compared with the same FoX reference (no time);
- `foxc_torch` (FoX, with --foxc): examples/fox.attn through torch.ops.foxc.attention (the plan
  compiled for the head dim, T at run time; threshold and block starts inside its timing).
Variants (the same score_mod foxc compiles from examples/fox_softcap.attn and examples/fox_gqa.attn):
- `softcap`: score_mod `20 tanh(score / 20) + c[q] - c[kv]`; the ACP block mask uses the static bound U = 20
  (delta = log_eps - 2 U - ln T), as foxc's interval analysis does;
- `gqa`: k and v have G < H heads (kv head = h / (H / G)), FlexAttention with enable_gqa=True; the block
  mask's U uses each query head's kv head.
- `gate` (bench/fox_gate.attn, input `g`): FoX times `sigmoid(g)`: `flex_gate_acp_eager` multiplies
  FlexAttention's output in eager torch, `flex_gate_acp_compiled` compiles attention and gate as one
  function (torch.compile may fuse the epilogue);
- `rope` (bench/fox_rope.attn, inputs `cos`, `sin` [T, D]): q and k rotated (rotate-half, f32, then
  bf16) before FlexAttention FoX, in one compiled function (`flex_rope_acp_compiled`); the block mask
  from the rotated q and k.
Times: triton.testing.do_bench(warmup=50, rep=300, return_mode="median"), in ms.

`--grad` (FoX only): forward + backward (out.backward(dout), dout fixed N(0, 1)), every gradient
of q, k, v and, where said, of the gate logits, CSV rows `peer,shape,ms,kept,agree,rerun_maxdiff`:
- `flex_fox_acp_gate`: FlexAttention + ACP block mask with the gate's gradient: the score_mod
  reads two copies of c (`c` and `c.clone()`; one tensor indexed twice raises
  NotImplementedError in PyTorch 2.11 when it requires grad);
- `flex_fox_acp_nogate`: the same with c detached (no gate gradient);
- `flex_fox_dense_gate`: dense causal block mask, with the gate's gradient;
- `foxc` (with --foxc): examples/fox.attn through torch.ops.foxc.attention and its autograd
  (every gradient, the gate's included; threshold and block starts computed inside, timed);
- `published_fox_acp`: the published FoX kernel + ACP, quoted from the standard workload's reference figures
  (D = 128 at the standard T; not runnable here).
`agree` is the largest relative L2 distance of the peer's gradients from flex_fox_dense_gate's
(q, k, v, and fgate where both have it); `rerun_maxdiff` the largest |difference| between the
gradients of two identical runs (0 = deterministic). The ACP block masks are built outside the
timed region (foxc's threshold and boundary are inside its timing).
"""

import argparse
import math
import sys

import pathlib

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from flex_acp import (  # noqa: E402  (bench/flex_acp.py: one definition of the peer)
    acp_block_mask,
    block_starts,
    causal_block_mask,
    fox_score_mod,
    gate_cumsum,
    kept_fraction,
)

# The published FoX kernel + ACP, forward + backward, median ms at 1x16xTx128 workloads
# (the standard workload's reference figures, H200, 2026-11-29): quoted, not runnable here.
PUBLISHED_FOX_ACP_FWD_BWD = {4096: 4.93, 8192: 7.77, 16384: 12.74, 32768: 20.99}


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
    ap.add_argument("inputs", nargs="+", help="safetensors files of `foxc inputs` (one row set each)")
    ap.add_argument("--foxc-out", help="foxc's output safetensors (tensor `out`) to check against the reference")
    ap.add_argument("--variant", choices=["fox", "softcap", "gqa", "gate", "rope"], default="fox")
    ap.add_argument("--log-eps", type=float, default=-10.0)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--no-dense-flex", action="store_true", help="skip FlexAttention without the block mask")
    ap.add_argument("--no-ref", action="store_true", help="skip the f32 references (no rel_l2)")
    ap.add_argument("--grad", action="store_true", help="forward + backward (FoX): see above")
    ap.add_argument("--foxc", action="store_true", help="FoX: also foxc through its torch op")
    args = ap.parse_args()
    if args.foxc_out and len(args.inputs) > 1:
        ap.error("--foxc-out takes one input file")
    if args.grad and args.variant != "fox":
        ap.error("--grad races FoX only")

    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.cache_size_limit = 1024
    if args.grad:
        print("peer,shape,ms,kept,agree,rerun_maxdiff", flush=True)
        for path in args.inputs:
            run_grad(path, args)
        return 0
    print("peer,shape,ms,kept,rel_l2", flush=True)
    for path in args.inputs:
        if args.variant in ("gate", "rope"):
            run_elementwise(path, args)
        else:
            run_forward(path, args)
    return 0


def rotate(x, cos, sin):
    """RoPE's rotate-half as bench/fox_rope.attn writes it: x cos + [-x2, x1] sin, in f32."""
    d = x.shape[-1] // 2
    xf = x.float()
    rot = torch.cat([-xf[..., d:], xf[..., :d]], dim=-1)
    return xf * cos + rot * sin


def run_elementwise(path, args):
    """FlexAttention FoX + ACP with an output gate or RoPE around it (see the variants above)."""
    import triton.testing
    from torch.nn.attention.flex_attention import flex_attention

    t = load_file(path, device="cuda")
    q, k, v, fgate = t["q"], t["k"], t["v"], t["fgate"]
    B, H, T, D = q.shape
    shape = f"{B}x{H}x{T}x{D}"
    c = gate_cumsum(fgate)
    flex = torch.compile(flex_attention, dynamic=False)
    mod = fox_score_mod(c, c)
    if args.variant == "gate":
        g = t["g"]
        start, kept = acp_starts(q, k, c, args)
        mask = acp_block_mask(start, T, args.block, args.block)

        def whole():
            return flex_attention(q, k, v, score_mod=mod, block_mask=mask) * torch.sigmoid(g)

        runs = {
            "flex_gate_acp_eager": lambda: flex(q, k, v, score_mod=mod, block_mask=mask) * torch.sigmoid(g),
            "flex_gate_acp_compiled": torch.compile(whole, dynamic=False),
        }
        ref = None if args.no_ref else reference(q, k, v, c) * torch.sigmoid(g.float())
    else:
        cos, sin = t["cos"], t["sin"]
        qr, kr = rotate(q, cos, sin).to(q.dtype), rotate(k, cos, sin).to(k.dtype)
        start, kept = acp_starts(qr, kr, c, args)
        mask = acp_block_mask(start, T, args.block, args.block)

        def whole():
            a, b = rotate(q, cos, sin).to(q.dtype), rotate(k, cos, sin).to(k.dtype)
            return flex_attention(a, b, v, score_mod=mod, block_mask=mask)

        runs = {"flex_rope_acp_compiled": torch.compile(whole, dynamic=False)}
        ref = None if args.no_ref else reference(rotate(q, cos, sin), rotate(k, cos, sin), v, c)
    for name, fn in runs.items():
        out = fn()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
        err = rel_l2(out, ref) if ref is not None else float("nan")
        print(f"{name},{shape},{ms:.4f},{kept:.4f},{err:.3e}", flush=True)


def acp_starts(q, k, c, args, group=1, softcap=None):
    """The ACP block starts and kept fraction of the paper's rule (QK-norm bound, or the static
    softcap bound) for these inputs."""
    B, H, T, D = q.shape
    if softcap is not None:
        # Static bound of the capped scores: |20 tanh(s / 20)| <= 20.
        u = torch.full((B, H), softcap, device=q.device)
    else:
        # The paper's threshold with QK-norm (WORKLOAD.md): U = scale * max|q| * max|k| per (b, h),
        # k read at the query head's kv head.
        qmax = q.float().norm(dim=-1).amax(dim=-1)
        kmax = k.float().norm(dim=-1).amax(dim=-1).repeat_interleave(group, dim=1)
        u = qmax * kmax / math.sqrt(D)
    delta = args.log_eps - 2.0 * u - math.log(T)
    start, _ = block_starts(c, delta, args.block, args.block)
    return start, kept_fraction(start, args.block, args.block, T)


def run_forward(path, args):
    import triton.testing
    from torch.nn.attention.flex_attention import flex_attention

    dev = "cuda"
    t = load_file(path, device=dev)
    q, k, v, fgate = t["q"], t["k"], t["v"], t["fgate"]
    B, H, T, D = q.shape
    G = k.shape[1]
    group = H // G
    shape = f"{B}x{H}x{T}x{D}" + (f"_G{G}" if G != H else "")
    c = gate_cumsum(fgate)
    bm = bn = args.block
    softcap = SOFTCAP if args.variant == "softcap" else None
    start, kept = acp_starts(q, k, c, args, group, softcap)
    block_mask = acp_block_mask(start, T, bm, bn)

    if softcap is not None:

        def score_mod(score, b, h, q_idx, kv_idx_):
            return softcap * torch.tanh(score / softcap) + (c[b, h, q_idx] - c[b, h, kv_idx_])

    else:
        score_mod = fox_score_mod(c, c)

    gqa = G != H
    # dynamic=False: one static kernel per shape. With the default, the second shape in a process
    # recompiles with symbolic sizes and ran 6x slower (65.9 ms for 4x16x8192x128 fwd+bwd).
    flex = torch.compile(flex_attention, dynamic=False)
    runs = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa),
        f"flex_{args.variant}_acp": lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa),
    }
    if args.foxc and args.variant == "fox":
        import foxc
        import foxc.torch  # noqa: F401  (registers the op)

        attn = foxc.load(pathlib.Path(__file__).resolve().parents[1] / "examples" / "fox.attn", log_eps=args.log_eps)
        runs["foxc_torch"] = lambda: attn(q=q, k=k, v=v, fgate=fgate)
    if not args.no_dense_flex:
        dense_mask = causal_block_mask(T, dev, bm)
        runs[f"flex_{args.variant}_dense"] = lambda: flex(
            q, k, v, score_mod=score_mod, block_mask=dense_mask, enable_gqa=gqa
        )

    ref_fox = ref_causal = None
    if not args.no_ref:
        ref_fox = reference(q, k, v, c, softcap=softcap)
        ref_causal = reference(q, k, v, None)

    for name, fn in runs.items():
        out = fn()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
        ref = ref_causal if name == "sdpa" else ref_fox
        err = rel_l2(out, ref) if ref is not None else float("nan")
        k_frac = kept if name.endswith("_acp") else float("nan") if name == "foxc_torch" else 1.0
        print(f"{name},{shape},{ms:.4f},{k_frac:.4f},{err:.3e}", flush=True)
    if args.foxc_out:
        o = load_file(args.foxc_out, device=dev)["out"]
        err = rel_l2(o, ref_fox) if ref_fox is not None else float("nan")
        print(f"foxc,{shape},,{kept:.4f},{err:.3e}", flush=True)


def _flex_fox_grad(q, k, v, fgate, block_mask, gate_grad: bool):
    """FlexAttention FoX whose gate cumsum is computed inside (so fgate gets its gradient when
    gate_grad); two copies of c for the gradient, one detached c without it."""
    from torch.nn.attention.flex_attention import flex_attention

    c = gate_cumsum(fgate)
    if gate_grad:
        mod = fox_score_mod(c, c.clone())
    else:
        c = c.detach()
        mod = fox_score_mod(c, c)
    return flex_attention(q, k, v, score_mod=mod, block_mask=block_mask)


def run_grad(path, args):
    """Forward + backward of FlexAttention (ACP with and without the gate's gradient, dense
    with it), foxc (--foxc) and the quoted published kernel, on the same inputs."""
    import triton.testing

    dev = "cuda"
    t = load_file(path, device=dev)
    q, k, v, fgate = t["q"], t["k"], t["v"], t["fgate"]
    B, H, T, D = q.shape
    shape = f"{B}x{H}x{T}x{D}"
    c = gate_cumsum(fgate)
    start, kept = acp_starts(q, k, c, args)
    acp_mask = acp_block_mask(start, T, args.block, args.block)
    dense_mask = causal_block_mask(T, dev, args.block)
    dout = torch.randn(q.shape, device=dev, generator=torch.Generator(device=dev).manual_seed(1)).to(q.dtype)
    leaves = {n: x.detach().clone().requires_grad_(True) for n, x in (("q", q), ("k", k), ("v", v), ("fgate", fgate))}
    flex = torch.compile(_flex_fox_grad, dynamic=False)  # static per shape: see run_forward

    def flex_run(mask, gate_grad):
        return lambda: flex(leaves["q"], leaves["k"], leaves["v"], leaves["fgate"], mask, gate_grad)

    runs = {
        "flex_fox_acp_gate": (flex_run(acp_mask, True), kept, True),
        "flex_fox_acp_nogate": (flex_run(acp_mask, False), kept, False),
        "flex_fox_dense_gate": (flex_run(dense_mask, True), 1.0, True),
    }
    if args.foxc:
        import foxc
        import foxc.torch  # noqa: F401  (registers the op and its autograd)

        attn = foxc.load(pathlib.Path(__file__).resolve().parents[1] / "examples" / "fox.attn", log_eps=args.log_eps)
        runs["foxc"] = (lambda: attn(**leaves), kept, True)

    def grads_of(fn, gate):
        for x in leaves.values():
            x.grad = None
        fn().backward(dout)
        names = ("q", "k", "v", "fgate") if gate else ("q", "k", "v")
        return {n: leaves[n].grad.detach().clone() for n in names}

    ref = grads_of(runs["flex_fox_dense_gate"][0], True)
    for name, (fn, k_frac, gate) in runs.items():
        try:
            g1 = grads_of(fn, gate)
            g2 = grads_of(fn, gate)
            torch.cuda.synchronize()
            rerun = max((g1[n].float() - g2[n].float()).abs().max().item() for n in g1)
            agree = max(rel_l2(g1[n], ref[n].float()) for n in g1)

            def step():
                fn().backward(dout)

            ms = triton.testing.do_bench(step, warmup=50, rep=300, grad_to_none=list(leaves.values()), return_mode="median")
        except Exception as e:  # one peer failing must not hide the others' rows
            print(f"{name},{shape},error: {type(e).__name__}: {str(e)[:200]!r},,,", flush=True)
            continue
        print(f"{name},{shape},{ms:.4f},{k_frac:.4f},{agree:.3e},{rerun:.3e}", flush=True)
    quoted = PUBLISHED_FOX_ACP_FWD_BWD.get(T) if D == 128 and B * T == 32768 and H == 16 else None
    if quoted is not None:
        print(f"published_fox_acp (quoted),{shape},{quoted:.2f},,,", flush=True)


if __name__ == "__main__":
    sys.exit(main())
