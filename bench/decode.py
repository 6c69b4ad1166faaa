"""A decode step on the GPU: one new query against M cached keys, foxc against its peers in one run.

    PYTHONPATH=/tmp/site python3 bench/decode.py [--M 32768 65536 131072] [--B 1 8] [--json out.json]

Inputs follow the standard workload (BENCHMARKS.md): H = 16, D = 128, q and k RMS-normalized
(|q| = |k| = sqrt(D)), v ~ N(0, 1), bf16; gate logits `logit(exp(-a_h)) + N(0, 1)` with
`a_h = 10^(-4 + 4h/(H-1))`, drawn here by torch's generator (same distribution as `foxc inputs`,
not the same numbers). Contestants, each a median of `triton.testing.do_bench`:

- foxc pruned / dense: bench/fox_prefill.attn at N = 1 through the torch op (`no_prune=True` for
  dense). Each call recomputes the gate cumsum and every key norm of the cache (its threshold):
  that prelude is inside its time.
- foxc pruned, norms bounded: what `foxc.KVCache` runs, the same program with the norm bounds
  the cache checks on every row (`|q|, |k| <= sqrt(D) (1 + 2^-6)`) as its threshold's static
  bound: no pass over the keys' norms; the gate cumsum is still recomputed each call.
- foxc cache keeping c: examples/fox_cache.attn (the decay cumsum `c` as a parameter, declared
  nonincreasing along the keys), norms bounded as above: what `foxc.KVCache` runs on a cache that
  keeps `c` (no gate scan, no norm pass; `c` is built outside its time, as the cache holds it).
- FlexAttention + ACP: `flex_attention` (torch.compile; its decode kernel at Q_LEN = 1) with the
  FoX score_mod and a block mask of the kept key blocks of the paper rule; the cumsum, norms and
  mask are built outside its time (as a cache that kept them would).
- FlexAttention dense: the same score_mod, no block mask.
- SDPA FoX dense: `scaled_dot_product_attention` with the decay as a float mask `[B, H, 1, M]`.
- SDPA no gate: plain attention (cuDNN / flash backends), the dense bandwidth reference.

"KV GB/s" counts the bf16 K and V bytes of the keys a contestant reads (all M, or those of kept
blocks: the paper rule's starts at the kernel's key block, computed here on the gate cumsum)
per step time, and "% of copy" that against a device-to-device copy of 4 GiB measured in the same
run (bytes read plus written: the card's reachable bandwidth, METHOD.md). Outputs are checked
against SDPA FoX dense.
"""

import argparse
import json
import pathlib
import re
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import flex_acp  # noqa: E402

import foxc  # noqa: E402
import foxc.torch  # noqa: E402,F401

PREFILL = pathlib.Path(__file__).resolve().parent / "fox_prefill.attn"
CACHE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "fox_cache.attn"
LOG_EPS = -10.0


def workload(B, H, M, D, seed=0, N=1):
    """q `[B, H, N, D]` (N queries, one for a decode step) and k, v, fgate of M keys."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))

    q = rms(torch.randn(B, H, N, D, generator=g, device="cuda")).bfloat16()
    k = rms(torch.randn(B, H, M, D, generator=g, device="cuda")).bfloat16()
    v = torch.randn(B, H, M, D, generator=g, device="cuda").bfloat16()
    a = 10.0 ** (-4.0 + 4.0 * torch.arange(H, device="cuda", dtype=torch.float64) / (H - 1))
    logit = -a - torch.log(-torch.expm1(-a))
    fgate = (logit.view(1, H, 1) + torch.randn(B, H, M, generator=g, device="cuda", dtype=torch.float64)).float()
    return q, k, v, fgate.contiguous()


def norm_bound(D):
    """A bound on |q| and |k| of the workload's rows (norm sqrt(D), RMS-normalized), after bf16
    rounding and with the cache's margin for it."""
    return D**0.5 * (1 + 2.0**-6)


def norms_bounded(attn, D):
    """What `foxc.KVCache` runs for `attn`: the threshold takes the checked norm bounds."""
    return foxc._assuming_norms(attn, norm_bound(D), norm_bound(D))


def kept_start(c, q, k, bn, M):
    """First kept key of the query at position M - 1 under the paper rule, per (b, h)."""
    delta = flex_acp.paper_delta(flex_acp.qk_bound(q, k), LOG_EPS, M)
    nt = (M + bn - 1) // bn
    jend = torch.clamp(torch.arange(nt, device=c.device) * bn + bn - 1, max=M - 1)
    keep = (c[:, :, M - 1 : M] - c[:, :, jend]) >= delta[..., None]
    idx = torch.arange(nt, device=c.device).expand_as(keep)
    first = torch.where(keep, idx, torch.full_like(idx, nt - 1)).min(dim=-1).values
    return torch.minimum(first, torch.full_like(first, (M - 1) // bn))


def flex_block_mask(first, M, bn):
    """Key blocks first..last (the last partial at M) for one query row."""
    from torch.nn.attention.flex_attention import BlockMask

    B, H = first.shape
    nt = (M + bn - 1) // bn
    num = (nt - first).to(torch.int32).view(B, H, 1)
    idx = torch.clamp(first[..., None] + torch.arange(nt, device=first.device), max=nt - 1).to(torch.int32)
    return BlockMask.from_kv_blocks(num, idx.view(B, H, 1, nt), BLOCK_SIZE=(128, bn), seq_lengths=(1, M))


def copy_gbs():
    """GB/s of a 4 GiB device-to-device copy (read plus write), median of do_bench."""
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = ms_of(lambda: y.copy_(x))
    del x, y
    return 2 * 4 * (1 << 30) / ms / 1e6


def ms_of(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def check_cache(pruned, steps=600, B=2, H=4, D=64):
    """foxc.KVCache on CUDA tensors, evicting and not, against the f32 reference of every row.

    The bound per output element: ACP's (and eviction's) 4 eps max|v|, plus the kernel's bf16
    roundings, each relative to the row's absolute sum sum_j p_j |v_j| (P is rounded to bf16 for
    the P @ V product, 2^-8, and the output is rounded to bf16, 2^-8 of |out| <= that sum)."""
    q, k, v, _ = workload(B, H, steps, D, seed=1)
    q = torch.cat([workload(B, H, 1, D, seed=2 + t)[0] for t in range(steps)], dim=2)
    fgate = torch.linspace(-3.0, 2.0, H, device="cuda").view(1, H, 1).expand(B, H, steps).contiguous()
    c = flex_acp.gate_cumsum(fgate)
    causal = torch.ones(steps, steps, dtype=torch.bool, device="cuda").tril()
    s = (q.float() @ k.float().transpose(-1, -2)) / D**0.5 + c[..., :, None] - c[..., None, :]
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    ref, abs_sum = p @ v.float(), p @ v.float().abs()
    allowed = 4 * torch.exp(torch.tensor(LOG_EPS)).item() * v.float().abs().max() + abs_sum * 2.0**-7
    bound = norm_bound(D)
    ok = True
    for evict in (False, True):
        cache = foxc.torch.KVCache(pruned, max_keys=steps, q_norm=bound, k_norm=bound, evict=evict, every=16)
        outs, held = [], []
        for t in range(steps):
            step = {n: x[:, :, t : t + 1].contiguous() for n, x in (("q", q), ("k", k), ("v", v), ("fgate", fgate))}
            outs.append(cache(**step))
            held.append(cache.length)
        got = torch.cat(outs, dim=2).float()
        err = (got - ref).abs()
        ratio = err / allowed
        worst = divmod(int(ratio.argmax()), steps * D)
        b_h, t_d = worst
        good = bool((ratio <= 1).all())
        ok &= good
        kept = f"keys held at the end {cache.length} (max {max(held)}), dropped {cache.dropped}, per head {cache.held_per_head().tolist()}" if evict else "no eviction"
        print(
            f"{'PASS' if good else 'FAIL'} KVCache on CUDA, evict={evict}: {steps} steps, B={B} H={H} D={D}: max |err| "
            f"{err.max().item():.2e}, max err / bound {ratio.max().item():.3f} (head {b_h % H}, step {t_d // D}); {kept}",
            flush=True,
        )
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--M", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--B", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--json")
    ap.add_argument("--check-only", action="store_true", help="only the KVCache check, no timings")
    ap.add_argument(
        "--foxc-tiles",
        nargs="*",
        default=[],
        metavar="BMxBN",
        help="more rows of the cache keeping c, each at these tiles (foxc.load(tiles=...))",
    )
    a = ap.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    # One compiled kernel per (M, B) shape and block mask: the default recompile limit (8) would
    # send the later shapes to the unfused fallback.
    torch._dynamo.config.recompile_limit = 64
    flex = torch.compile(flex_attention, dynamic=False)
    pruned, dense = foxc.load(PREFILL), foxc.load(PREFILL, no_prune=True)
    bounded = norms_bounded(pruned, a.D)
    kept_c = norms_bounded(foxc.load(CACHE), a.D)
    tiled = [tuple(int(x) for x in t.split("x")) for t in a.foxc_tiles]
    kept_c_at = {t: norms_bounded(foxc.load(CACHE, tiles=t), a.D) for t in tiled}
    cache_ok = check_cache(pruned)
    if a.check_only:
        sys.exit(0 if cache_ok else 1)
    # The key block of foxc's kernel at this D, from its own IR (`bn = 64` for a decode step).
    ir = pruned.ir("opt", "sm_90a", {"D": a.D, "N": 1})
    bn_foxc = int(re.search(r"\bbn = (\d+)", ir).group(1))
    print(f"foxc GPU attention: bn = {bn_foxc}")
    rows = []
    peak = copy_gbs()
    print(f"device: {torch.cuda.get_device_name()}, copy {peak:.0f} GB/s")
    print("| M | B | contestant | ms | keys read / M | KV GB/s | % of copy | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for M in a.M:
        for B in a.B:
            q, k, v, fgate = workload(B, a.H, M, a.D)
            c = flex_acp.gate_cumsum(fgate)
            cq = c[:, :, M - 1 :].contiguous()
            mask = (cq - c)[:, :, None, :].to(torch.bfloat16)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
            first128 = kept_start(c, q, k, 128, M)
            first_foxc = kept_start(c, q, k, bn_foxc, M)
            bm = flex_block_mask(first128, M, 128)
            score = flex_acp.fox_score_mod(cq, c)
            kv_bytes = B * a.H * a.D * 2 * 2

            def kept_keys(first, bn):
                return float((M - first * bn).clamp_min(0).sum().item()) / (B * a.H)

            cases = [
                ("foxc pruned", lambda: pruned(q=q, k=k, v=v, fgate=fgate), kept_keys(first_foxc, bn_foxc)),
                ("foxc pruned, norms bounded", lambda: bounded(q=q, k=k, v=v, fgate=fgate), kept_keys(first_foxc, bn_foxc)),
                ("foxc cache keeping c", lambda: kept_c(q=q, k=k, v=v, c=c), kept_keys(first_foxc, bn_foxc)),
                *[
                    (
                        f"foxc cache keeping c, tiles {t[0]}x{t[1]}",
                        lambda f=f: f(q=q, k=k, v=v, c=c),
                        kept_keys(kept_start(c, q, k, t[1], M), t[1]),
                    )
                    for t, f in kept_c_at.items()
                ],
                ("foxc dense", lambda: dense(q=q, k=k, v=v, fgate=fgate), M),
                ("Flex + ACP", lambda: flex(q, k, v, score_mod=score, block_mask=bm), kept_keys(first128, 128)),
                ("Flex dense", lambda: flex(q, k, v, score_mod=score), M),
                ("SDPA FoX dense", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), M),
                ("SDPA no gate", lambda: F.scaled_dot_product_attention(q, k, v), M),
            ]
            for name, fn, keys in cases:
                try:
                    out = fn()
                    err = rel(out, ref) if name != "SDPA no gate" else float("nan")
                    ms = ms_of(fn)
                except Exception as e:  # a peer that cannot run this shape: say so, go on
                    print(f"| {M} | {B} | {name} | failed: {type(e).__name__}: {str(e)[:120]} |")
                    continue
                gbs = kv_bytes * keys / (ms * 1e-3) / 1e9
                row = dict(M=M, B=B, name=name, ms=ms, keys_frac=keys / M, gbs=gbs, err=err)
                rows.append(row)
                print(
                    f"| {M} | {B} | {name} | {ms:.3f} | {keys / M:.3f} | {gbs:.0f} | {100 * gbs / peak:.1f} | {err:.1e} |",
                    flush=True,
                )
            del q, k, v, fgate, c, mask, ref
            torch.cuda.empty_cache()
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"cache_ok": cache_ok, "rows": rows}, indent=1))
    sys.exit(0 if cache_ok else 1)


if __name__ == "__main__":
    main()
