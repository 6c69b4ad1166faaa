#!/usr/bin/env python3
"""Device loop for foxc's attention kernel: load PTX emitted by
`cargo run -p foxc-codegen --example emit_attention -- D=128 ...` with ctypes over libcuda, run it on
torch tensors built by the standard workload (../shared/bench/WORKLOAD.md), check it against a
float32 torch reference and time it against SDPA and FlexAttention + ACP.

Usage (on the GPU machine): python3 bench/attn_harness.py --ptx-dir bench/ptx [--quick] [--flex]
PTX files are named attn_*.ptx; the configuration is read from the kernel name.
"""
import argparse
import ctypes
import glob
import math
import os
import re
import sys
import time

import torch

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class Cuda:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        torch.zeros(1, device="cuda")  # make torch's primary context current on this thread

    def check(self, rc, what):
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(s))
            raise RuntimeError(f"{what}: CUDA error {rc} {s.value}")

    def load(self, ptx_text, name, smem):
        mod = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(ptx_text.encode() + b"\0")
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), buf), f"cuModuleLoadData {name}")
        fn = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction")
        self.check(
            self.lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ctypes.c_int(smem)),
            "cuFuncSetAttribute",
        )
        return fn

    def launch(self, fn, grid, block, smem, args):
        vals = []
        for a in args:
            if isinstance(a, torch.Tensor):
                vals.append(ctypes.c_void_p(a.data_ptr()))
            else:
                vals.append(ctypes.c_int(a))
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.check(
            self.lib.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, ptrs, None),
            "cuLaunchKernel",
        )


class Kernel:
    def __init__(self, cuda, path):
        text = open(path).read()
        self.name = re.search(r"\.visible \.entry (\w+)\(", text).group(1)
        m = re.search(r"_d(\d+)_bm(\d+)_bn(\d+)", self.name)
        self.d, self.bm, self.bn = int(m.group(1)), int(m.group(2)), int(m.group(3))
        k = re.search(r"_k(\d+)_", self.name)  # block rows when they differ from the pruning tile bm
        self.bk = int(k.group(1)) if k else self.bm
        w = re.search(r"_w(\d+)_", self.name)
        self.window = int(w.group(1)) if w else None
        self.decay = "_decay" in self.name
        self.prune = "_prune" in self.name
        # Must match AttnKernelConfig::shared_bytes (Q, 2 x K, 2 x V, 2 x column bias when decaying).
        self.smem = (self.bk + 4 * self.bn) * self.d * 2 + (2 * self.bn * 4 if self.decay else 0)
        self.threads = self.bk // 16 * 32
        self.cuda = cuda
        self.fn = cuda.load(text, self.name, self.smem)

    def __call__(self, q, k, v, c, delta, out, lse):
        bh, t, d = q.shape
        mt = (t + self.bk - 1) // self.bk
        self.cuda.launch(self.fn, (mt, bh, 1), (self.threads, 1, 1), self.smem, [q, k, v, c, delta, out, lse, t])


def workload(b, h, t, d, seed, device="cuda"):
    """The standard workload (WORKLOAD.md), head-first, flattened to [B*H, T, D]."""
    g = torch.Generator(device=device).manual_seed(seed)
    def qk():
        x = torch.randn(b, h, t, d, device=device, generator=g)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x.to(torch.bfloat16)
    q, k = qk(), qk()
    v = torch.randn(b, h, t, d, device=device, generator=g).to(torch.bfloat16)
    hs = torch.arange(h, device=device, dtype=torch.float32)
    a = 10.0 ** (-4 + 4 * hs / max(h - 1, 1))
    p = torch.exp(-a)
    logit = torch.log(p) - torch.log1p(-p)
    fgate = logit.view(1, h, 1) + torch.randn(b, h, t, device=device, generator=g)
    logf = torch.nn.functional.logsigmoid(fgate).clamp_min(-100.0)
    c = torch.cumsum(logf, dim=-1)
    fl = lambda x: x.reshape(b * h, *x.shape[2:]).contiguous()
    return fl(q), fl(k), fl(v), fl(c).float()


def paper_delta(t, d, bh, bm, device="cuda"):
    mt = (t + bm - 1) // bm
    val = -(2 * math.sqrt(d) + math.log(t)) - 10.0
    return torch.full((bh, mt), val, device=device, dtype=torch.float32)


def starts(c, delta, t, bm, bn):
    """start[m] by the block rule (SEMANTICS.md), vectorised: [BH, Mt]."""
    bh = c.shape[0]
    mt = (t + bm - 1) // bm
    nt = (t + bn - 1) // bn
    i0 = torch.arange(mt, device=c.device) * bm
    jend = torch.clamp(torch.arange(nt, device=c.device) * bn + bn - 1, max=t - 1)
    diff = c[:, i0].unsqueeze(2) - c[:, jend].unsqueeze(1)  # [BH, Mt, Nt]
    keep = ~(diff < delta.unsqueeze(2))
    n = torch.arange(nt, device=c.device).view(1, 1, nt)
    first = torch.where(keep, n, torch.full_like(n, nt)).amin(dim=2)
    return torch.minimum(first, (i0 // bn).view(1, mt))


def kept_fraction(st, t, bm, bn):
    mt = st.shape[1]
    i0 = torch.arange(mt, device=st.device) * bm
    diag = torch.clamp(i0 + bm - 1, max=t - 1) // bn
    kept = (diag.view(1, mt) - st + 1).sum().item()
    total = (diag + 1).sum().item() * st.shape[0]
    return kept / total


def reference(q, k, v, c, scale, decay=True, window=None, start_cols=None, rows=2048):
    """float32 reference, [BH, T, D] out and lse. start_cols: [BH, T] first kept column per row (pruned)."""
    bh, t, d = q.shape
    out = torch.empty(bh, t, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(bh, t, device=q.device, dtype=torch.float32)
    for h in range(bh):
        qh, kh, vh = q[h].float(), k[h].float(), v[h].float()
        for r0 in range(0, t, rows):
            r1 = min(t, r0 + rows)
            s = (qh[r0:r1] @ kh[:r1].T) * scale
            if decay:
                s = s + (c[h, r0:r1].unsqueeze(1) - c[h, :r1].unsqueeze(0))
            i = torch.arange(r0, r1, device=q.device).unsqueeze(1)
            j = torch.arange(0, r1, device=q.device).unsqueeze(0)
            ok = j <= i
            if window is not None:
                ok = ok & (i - j < window)
            if start_cols is not None:
                ok = ok & (j >= start_cols[h, r0:r1].unsqueeze(1))
            s = s.masked_fill(~ok, float("-inf"))
            lse[h, r0:r1] = torch.logsumexp(s, dim=1)
            out[h, r0:r1] = torch.softmax(s, dim=1) @ vh[:r1]
    return out, lse


def rel_l2(a, b):
    return ((a - b).norm() / b.norm()).item()


def bench(fn):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def run_kernel(kern, q, k, v, c, delta):
    bh, t, d = q.shape
    out = torch.full((bh, t, d), float("nan"), device=q.device, dtype=torch.float32)
    lse = torch.full((bh, t), float("nan"), device=q.device, dtype=torch.float32)
    kern(q, k, v, c, delta, out, lse)
    torch.cuda.synchronize()
    return out, lse


def flex_fn(q, k, v, c, b, h, t, d, delta):
    """FlexAttention FoX with the ACP block mask (128 x 128 blocks), as in WORKLOAD.md."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    torch._dynamo.config.recompile_limit = 1000
    torch._dynamo.config.cache_size_limit = 1000
    blk = 128
    st = starts(c, delta if delta.shape[1] == (t + blk - 1) // blk else paper_delta(t, d, b * h, blk), t, blk, blk)
    mt = (t + blk - 1) // blk
    m = torch.arange(mt, device=q.device)
    kv_num = torch.ones(b * h, mt, device=q.device, dtype=torch.int32)
    kv_idx = torch.zeros(b * h, mt, mt, device=q.device, dtype=torch.int32)
    kv_idx[:, :, 0] = m.to(torch.int32)
    full_num = (m.view(1, mt) - st).to(torch.int32)
    ar = torch.arange(mt, device=q.device).view(1, 1, mt)
    full_idx = (st.unsqueeze(2) + ar).clamp(max=mt - 1).to(torch.int32)
    cc = c.view(b, h, t)

    def causal(bb, hh, qi, ki):
        return qi >= ki

    def score_mod(score, bb, hh, qi, ki):
        return score + (cc[bb, hh, qi] - cc[bb, hh, ki])

    bmask = BlockMask.from_kv_blocks(
        kv_num.view(b, h, mt), kv_idx.view(b, h, mt, mt), full_num.view(b, h, mt), full_idx.view(b, h, mt, mt),
        BLOCK_SIZE=blk, mask_mod=causal,
    )
    fa = torch.compile(flex_attention)
    q4, k4, v4 = (x.view(b, h, t, d) for x in (q, k, v))
    return lambda: fa(q4, k4, v4, score_mod=score_mod, block_mask=bmask)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx-dir", default="bench/ptx", help="comma-separated folders of attn_*.ptx")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--flex", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--sizes", default="4096,8192,16384,32768")
    ap.add_argument("--dims", default="128,64")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = Cuda()
    kernels = {}
    paths = [p for d in args.ptx_dir.split(",") for p in sorted(glob.glob(os.path.join(d, "attn_*.ptx")))]
    for p in paths:
        kname = os.path.basename(p)[5:-4]  # d128_prune
        try:
            kernels[kname] = Kernel(cuda, p)
        except Exception as e:  # report and go on: one bad PTX must not hide the others
            print(f"LOAD FAIL {kname}: {e}")
    print("kernels:", {k: v.name for k, v in kernels.items()})
    rows = []

    # ---- correctness: odd shapes and every variant ----
    checks = [(1, 2, 1000, 128), (1, 1, 1, 128), (1, 3, 777, 64), (2, 4, 4096, 128), (2, 4, 4096, 64)]
    if not args.quick:
        checks += [(1, 16, 16384, 128)]
    if args.no_check:
        checks = []
    for (b, h, t, d) in checks:
        q, k, v, c = workload(b, h, t, d, seed=t + d + h)
        scale = 1.0 / math.sqrt(d)
        dense = None
        for kn, kern in kernels.items():
            if kern.d != d:
                continue
            delta = paper_delta(t, d, b * h, kern.bm)
            st_cols = None
            if kern.prune:
                st = starts(c, delta, t, kern.bm, kern.bn)
                st_cols = (st * kern.bn).repeat_interleave(kern.bm, dim=1)[:, :t]
            try:
                out, lse = run_kernel(kern, q, k, v, c, delta)
            except Exception as e:
                print(f"RUN FAIL {kn} T={t}: {e}")
                continue
            ro, rl = reference(q, k, v, c, scale, decay=kern.decay, window=kern.window, start_cols=st_cols)
            nan = torch.isnan(out).sum().item() + torch.isnan(lse).sum().item()
            e = rel_l2(out, ro)
            fin = torch.isfinite(rl)
            el = (lse[fin] - rl[fin]).abs().max().item() if fin.any() else 0.0
            ok = nan == 0 and e <= 1e-2 and el < 1e-2
            extra = ""
            if kern.prune and kern.decay and kern.window is None:  # pruned vs dense: the eps bound
                if dense is None:
                    dense, _ = reference(q, k, v, c, scale, decay=True)
                extra = f" vs_dense={rel_l2(out, dense):.3e}"
            print(f"CHECK {kn:18s} B={b} H={h} T={t:6d} D={d}: rel_l2={e:.3e} lse_maxabs={el:.2e} nan={nan}{extra} {'OK' if ok else 'FAIL'}")
        del q, k, v, c, dense

    if args.no_bench:
        return
    # ---- timing on the standard workload ----
    print("\n| D | B x H x T | kernel | kept | ms | TFLOP/s on kept | SDPA ms | flex+ACP ms | err |")
    for d in [int(x) for x in args.dims.split(",")]:
        for t in [int(x) for x in args.sizes.split(",")]:
            h = 16
            b = max(1, 32768 // t)
            q, k, v, c = workload(b, h, t, d, seed=1)
            bh = b * h
            q4, k4, v4 = (x.view(b, h, t, d) for x in (q, k, v))
            sd = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=True))
            fl = float("nan")
            if args.flex and d == 128 and t >= 16384:
                try:
                    f = flex_fn(q, k, v, c, b, h, t, d, paper_delta(t, d, bh, 128))
                    f()
                    fl = bench(f)
                except Exception as e:
                    print(f"flex failed: {type(e).__name__}: {str(e)[:200]}")
            for kn, kern in kernels.items():
                if kern.d != d or not kern.decay or kern.window is not None:
                    continue
                delta = paper_delta(t, d, bh, kern.bm)
                st = starts(c, delta, t, kern.bm, kern.bn)
                kf = kept_fraction(st, t, kern.bm, kern.bn)
                out = torch.empty(bh, t, d, device="cuda")
                lse = torch.empty(bh, t, device="cuda")
                ms = bench(lambda: kern(q, k, v, c, delta, out, lse))
                err = float("nan")
                if t <= 8192:
                    ro, _ = reference(q[:2], k[:2], v[:2], c[:2], 1 / math.sqrt(d))
                    err = rel_l2(out[:2], ro)
                kw = 4.0 * bh * t * t / 2 * d * (kf if kern.prune else 1.0)
                print(f"| {d} | {b}x{h}x{t} | {kn} | {kf if kern.prune else 1.0:.3f} | {ms:.3f} | {kw / (ms * 1e-3) / 1e12:.0f} | {sd:.3f} | {fl:.3f} | {err:.2e} |", flush=True)
            del q, k, v, c

    # Small-problem check (DESIGN.md 6): prune must not be slower than no-prune.
    q, k, v, c = workload(1, 4, 4096, 128, seed=3)
    for kn, kern in kernels.items():
        if kern.d == 128 and kern.decay and kern.window is None:
            delta = paper_delta(4096, 128, 4, kern.bm)
            out = torch.empty(4, 4096, 128, device="cuda")
            lse = torch.empty(4, 4096, device="cuda")
            print(f"small 1x4x4096x128 {kn}: {bench(lambda: kern(q, k, v, c, delta, out, lse)):.3f} ms")


if __name__ == "__main__":
    main()
