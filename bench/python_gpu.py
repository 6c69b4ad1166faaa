"""foxc's torch path on a GPU: outputs and gradients (autograd through foxc's backward) against
an eager torch f32 reference of the same math and its autograd, torch.compile(fullgraph=True) of
forward and backward, CUDA graph capture and replay, determinism (forward and gradients), no host
sync (forward and backward), validation errors.

    pip install --no-deps --target /tmp/site foxc-*.whl
    PYTHONPATH=/tmp/site python3 bench/python_gpu.py [--only prefill] [--json out.json]

Every check prints one line; the exit code is the number of failed checks.
"""

import argparse
import json
import math
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

import foxc
import foxc.torch  # noqa: F401  (registers torch.ops.foxc.attention)

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
results = []


def check(name, ok, **info):
    results.append({"check": name, "ok": bool(ok), **info})
    extra = " ".join(f"{k}={v}" for k, v in info.items())
    print(f"{'PASS' if ok else 'FAIL'} {name} {extra}", flush=True)


def inputs(attn, B, H, T, D, seed=0):
    """Random inputs in the declared dtypes; q, k RMS-normalized (|x| = sqrt(D)) as in the
    standard workload, gate logits spread over heads."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dims = {"B": B, "H": H, "T": T, "D": D}
    dt = {"bf16": torch.bfloat16, "f32": torch.float32}
    x = {}
    for name, dtype, decl in attn.signature:
        shape = [dims[d] for d in decl]
        a = torch.randn(shape, generator=g, device="cuda")
        if name in ("q", "k"):
            a = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True))
        elif name == "fgate":
            a = a + torch.linspace(-2.0, 8.0, H, device="cuda").view(1, H, 1)
        elif name == "slope":
            a = torch.exp2(-8.0 * torch.arange(1, H + 1, device="cuda") / H)
        elif name in ("wq", "wk"):
            a = 1.0 + 0.1 * a
        x[name] = a.to(dt[dtype]).contiguous()
    return x


def reference(name, x):
    """Eager torch f32 of each example's math (dense, causal)."""
    q, k, v = (x[n].float() for n in ("q", "k", "v"))
    T, D = q.shape[-2], q.shape[-1]
    if name == "fox_qknorm":
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * x["wq"].float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * x["wk"].float()
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(T, device=q.device)
    if name in ("fox", "fox_qknorm"):
        c = torch.cumsum(F.logsigmoid(x["fgate"].float()), -1)
        s = s + c[..., :, None] - c[..., None, :]
    elif name == "alibi":
        s = s - x["slope"].float().view(1, -1, 1, 1) * (i[:, None] - i[None, :]).float()
    mask = i[None, :] <= i[:, None]
    if name == "window":
        mask = mask & (i[:, None] - i[None, :] < 256)
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_accuracy(B, H, T, D):
    for ex in ("fox", "fox_qknorm", "alibi", "causal", "window"):
        for no_prune in (True, False):
            attn = foxc.load(EXAMPLES / f"{ex}.attn", no_prune=no_prune)
            x = inputs(attn, B, H, T, D)
            out = attn(**x)
            ref = reference(ex, x)
            err = rel_l2(out, ref)
            check(
                f"accuracy {ex} {'dense' if no_prune else 'acp'} D={D}",
                torch.isfinite(out).all().item() and err <= 1e-2,
                rel_l2=f"{err:.2e}",
                shape=f"{B}x{H}x{T}x{D}",
            )


def run_gradients(B, H, T, D):
    """Every gradient of the torch op's autograd against torch autograd of the eager f32
    reference (relative L2 <= 1e-2 each), and the same bits twice."""
    for ex in ("fox", "fox_qknorm", "alibi", "causal", "window"):
        for no_prune in (True, False):
            attn = foxc.load(EXAMPLES / f"{ex}.attn", no_prune=no_prune)
            x = inputs(attn, B, H, T, D, seed=3)
            dout = torch.randn(B, H, T, D, device="cuda", generator=torch.Generator(device="cuda").manual_seed(4))
            label = f"gradients {ex} {'dense' if no_prune else 'acp'} D={D}"
            try:
                g1 = foxc_grads(attn, x, dout.to(torch.bfloat16))
                g2 = foxc_grads(attn, x, dout.to(torch.bfloat16))
            except Exception as e:
                check(label, False, error=f"{type(e).__name__}: {str(e)[:300]}")
                continue
            xr = {n: t.detach().float().requires_grad_(True) for n, t in x.items()}
            reference(ex, xr).backward(dout.to(torch.bfloat16).float())
            errs = {n: rel_l2(g1[n], xr[n].grad) for n in g1}
            ok = all(torch.isfinite(g).all().item() for g in g1.values()) and all(e <= 1e-2 for e in errs.values())
            check(label, ok, **{f"rel_l2_{n}": f"{e:.2e}" for n, e in errs.items()}, shape=f"{B}x{H}x{T}x{D}")
            check(f"{label}: same bits twice", all(torch.equal(g1[n], g2[n]) for n in g1))


def attn_kernel(ptx):
    """The name of a plan's attention kernel (it names the kernel kind, D and the tiles)."""
    return next(w for line in ptx.splitlines() if ".entry" in line and "attn_fwd" in line for w in line.split() if "attn_fwd" in w)


def run_plan_choices():
    """What the torch op's plans are compiled for, as the CLI picks with every dim bound: a
    forward gets the forward's tiles at its head dim (64x128 at D = 64 and 128 on sm_90a, the
    warp-specialized kernel at 128); the training forward the tiles the backward shares (64x64);
    rows of more than one gate-scan segment (T > 8192) the joint prelude split over blocks
    (`threshold_with_split_scan`), rows of one segment the whole-row kernel. Each plan's kernels
    (from its PTX), its output against the reference, and the training plan's gradients."""
    attn = foxc.load(EXAMPLES / "fox.attn")
    dev = torch.cuda.current_device()
    key = lambda x: tuple(tuple(x[n].shape) for n in attn.params)  # noqa: E731
    for T, D, split, kernel in ((8192, 64, False, "bn128"), (8193, 64, True, "bn128"), (12000, 128, True, "ws_tma_d128_bm64_bn128")):
        x = inputs(attn, 1, 2, T, D, seed=5)
        out = attn(**x)
        ptx = attn._gpu_plans[("attention", dev, key(x))].ptx
        err = rel_l2(out, reference("fox", x))
        chosen, name = "threshold_with_split_scan" in ptx, attn_kernel(ptx)
        check(f"plan choice: forward T={T} D={D}", chosen == split and kernel in name and err <= 1e-2,
              split=chosen, kernel=name, rel_l2=f"{err:.2e}")
    x = inputs(attn, 1, 2, 9000, 128, seed=6)
    dout = torch.randn(1, 2, 9000, 128, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    g = foxc_grads(attn, x, dout.to(torch.bfloat16))
    ptx = attn._gpu_plans[("train", dev, key(x))].ptx
    xr = {n: t.detach().float().requires_grad_(True) for n, t in x.items()}
    reference("fox", xr).backward(dout.to(torch.bfloat16).float())
    errs = {n: rel_l2(g[n], xr[n].grad) for n in g}
    chosen, name = "threshold_with_split_scan" in ptx, attn_kernel(ptx)
    check("plan choice: training forward and gradients T=9000 D=128",
          chosen and "bm64_bn64" in name and all(e <= 1e-2 for e in errs.values()), split=chosen, kernel=name,
          **{f"rel_l2_{n}": f"{e:.2e}" for n, e in errs.items()})


def run_kept_workspace():
    """The pruned plan's zeroed workspace (the threshold's counters) is kept per stream
    (`foxc._workspace.KeptZeroed`): 20 calls on one stream, then 20 on two streams at once, all
    give the first call's bits (the kernels leave their counters zero; two streams never share
    them)."""
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = inputs(attn, 2, 4, 3000, 128, seed=8)
    first = attn(**x).clone()
    outs = [attn(**x) for _ in range(20)]
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    torch.cuda.synchronize()
    for _ in range(10):
        for s in streams:
            with torch.cuda.stream(s):
                outs.append(attn(**x))
    torch.cuda.synchronize()
    same = sum(torch.equal(o, first) for o in outs)
    err = rel_l2(first, reference("fox", x))
    check("kept zeroed workspace: 40 calls on one and two streams, the first call's bits",
          same == len(outs) and err <= 1e-2, same=f"{same}/{len(outs)}", rel_l2=f"{err:.2e}")


PREFILL = pathlib.Path(__file__).resolve().parent / "fox_prefill.attn"


def prefill_reference(x):
    """Eager torch f32 of bench/fox_prefill.attn: query i at key position i + M - N."""
    q, k, v = (x[n].float() for n in ("q", "k", "v"))
    N, M, D = q.shape[-2], k.shape[-2], q.shape[-1]
    c = torch.cumsum(F.logsigmoid(x["fgate"].float()), -1)
    pos = torch.arange(N, device=q.device) + (M - N)
    s = q @ k.transpose(-1, -2) / math.sqrt(D) + c[..., pos, None] - c[..., None, :]
    mask = torch.arange(M, device=q.device)[None, :] <= pos[:, None]
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


def run_prefill(dtype):
    """Queries fewer than keys through the torch op: output and every gradient (torch autograd
    through foxc's `_fq` backward) against autograd of the eager f32 reference, pruned and
    dense; shapes from a prefill (700 x 5000 at D = 128 on the warp-specialized forward) to a
    decode step past one gate-scan segment."""
    text = PREFILL.read_text().replace("bf16", dtype)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    for B, H, N, M, D in (
        (2, 4, 300, 1000, 64),
        (1, 4, 64, 2049, 128),
        (1, 2, 1, 20000, 128),
        (1, 3, 130, 3000, 96),
        (1, 4, 700, 5000, 128),
    ):
        for no_prune in (False, True):
            attn = foxc.load(text, no_prune=no_prune)
            g = torch.Generator(device="cuda").manual_seed(B * N + M)
            rms = lambda a: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True))  # noqa: E731
            x = {
                "q": rms(torch.randn(B, H, N, D, generator=g, device="cuda")).to(tdt),
                "k": rms(torch.randn(B, H, M, D, generator=g, device="cuda")).to(tdt),
                "v": torch.randn(B, H, M, D, generator=g, device="cuda").to(tdt),
                "fgate": (torch.randn(B, H, M, generator=g, device="cuda")
                          + torch.linspace(-2.0, 8.0, H, device="cuda").view(1, H, 1)).contiguous(),
            }
            dout = torch.randn(B, H, N, D, generator=g, device="cuda").to(tdt)
            label = f"prefill {dtype} {'dense' if no_prune else 'acp'} {B}x{H}x{N}x{M}x{D}"
            check_against_autograd(label, attn, x, dout, prefill_reference)


GATE = """attention fox_gate(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], g: bf16[B, H, T, D]) -> bf16[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    o[b, h, i, d]   = sum(j, p[b, h, i, j] * v[b, h, j, d])
    out[b, h, i, d] = o[b, h, i, d] * sigmoid(g[b, h, i, d])
    return out
}
"""


def run_programs():
    """Programs whose output is not an attention's own through the torch op (`foxc::forward`,
    its backward recomputing the forward): FoX with an output gate, and FoX in the tokens-first
    layout (`foxc.fox.load(head_first=False)` called directly), pruned and dense, output and
    every gradient against torch autograd of an eager f32 reference."""
    B, H, T, D = 2, 4, 1027, 64
    g = torch.Generator(device="cuda").manual_seed(11)
    rms = lambda a: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True))  # noqa: E731
    x = {
        "q": rms(torch.randn(B, H, T, D, generator=g, device="cuda")).bfloat16(),
        "k": rms(torch.randn(B, H, T, D, generator=g, device="cuda")).bfloat16(),
        "v": torch.randn(B, H, T, D, generator=g, device="cuda").bfloat16(),
        "fgate": (torch.randn(B, H, T, generator=g, device="cuda") + torch.linspace(-2.0, 6.0, H, device="cuda").view(1, H, 1)).contiguous(),
        "g": torch.randn(B, H, T, D, generator=g, device="cuda").bfloat16(),
    }
    dout = torch.randn(B, H, T, D, generator=g, device="cuda").bfloat16()

    def gate_ref(x):
        return reference("fox", x) * torch.sigmoid(x["g"].float())

    def tokens_first(x):  # the head-first reference on swapped axes
        xs = {n: x[n].transpose(1, 2) for n in ("q", "k", "v", "fgate")}
        return reference("fox", xs).transpose(1, 2)

    swapped = {n: x[n].transpose(1, 2).contiguous() for n in ("q", "k", "v", "fgate")}
    cases = [
        ("output gate", lambda np_: foxc.load(GATE, no_prune=np_), x, gate_ref, dout),
        ("tokens-first layout", lambda np_: foxc.fox.load(head_first=False, no_prune=np_), swapped, tokens_first, dout.transpose(1, 2).contiguous()),
    ]
    for name, load, inp, ref_fn, dy in cases:
        for no_prune in (False, True):
            attn = load(no_prune)
            label = f"program {name} {'dense' if no_prune else 'acp'}"
            if attn._program.output_is_attention:
                check(label, False, error="expected a program whose output is not the attention's")
                continue
            check_against_autograd(label, attn, inp, dy, ref_fn)


def check_against_autograd(label, attn, x, dout, ref_fn):
    """`attn`'s output and every gradient (torch autograd through foxc's backward) against
    torch autograd of `ref_fn` in f32: relative L2 <= 1e-2 each, all finite."""
    try:
        out = attn(**x)
        grads = foxc_grads(attn, x, dout)
    except Exception as e:
        check(label, False, error=f"{type(e).__name__}: {str(e)[:300]}")
        return
    xr = {n: t.detach().float().requires_grad_(True) for n, t in x.items()}
    ref = ref_fn(xr)
    ref.backward(dout.float())
    errs = {"out": rel_l2(out, ref)}
    errs.update({n: rel_l2(grads[n], xr[n].grad) for n in grads})
    ok = all(torch.isfinite(t).all().item() for t in [out, *grads.values()]) and all(e <= 1e-2 for e in errs.values())
    check(label, ok, **{f"rel_l2_{n}": f"{e:.2e}" for n, e in errs.items()})


def foxc_grads(attn, x, dout):
    """Gradients of sum(out * dout) w.r.t. every float input, through torch autograd."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    attn(**leaves).backward(dout)
    torch.cuda.synchronize()
    return {n: t.grad for n, t in leaves.items()}


def run_torch_features():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = inputs(attn, 2, 8, 4096, 128, seed=1)
    out0 = attn(**x)
    torch.cuda.synchronize()
    out1 = attn(**x)
    torch.cuda.synchronize()
    check("determinism (same bits twice)", torch.equal(out0, out1))

    # The op's own outputs: out and the row log-sum-exp.
    out, lse = torch.ops.foxc.attention(attn.id, [x[n] for n in attn.params])
    check("op returns (out, lse)", torch.equal(out, out0) and tuple(lse.shape) == (2, 8, 4096) and lse.dtype == torch.float32)

    # No host synchronization: with the stream busy (a long sleep kernel), the call returns
    # while the GPU has not reached it.
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    t0 = time.perf_counter()
    attn(**x)
    call_ms = (time.perf_counter() - t0) * 1e3
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    check("no host sync (call returns while the stream is busy)", busy, call_ms=f"{call_ms:.3f}")
    torch.cuda.set_sync_debug_mode("error")
    try:
        attn(**x)
        check("no sync under torch.cuda.set_sync_debug_mode('error')", True)
    except RuntimeError as e:
        check("no sync under torch.cuda.set_sync_debug_mode('error')", False, error=str(e)[:200])
    finally:
        torch.cuda.set_sync_debug_mode("default")

    # torch's current stream is the one used.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out_s = attn(**x)
    s.synchronize()
    check("runs on a side stream (torch.cuda.stream)", torch.equal(out_s, out0))

    # torch.compile with no graph break.
    def f(q, k, v, fgate):
        return attn(q=q, k=k, v=v, fgate=fgate) * 2.0

    try:
        cf = torch.compile(f, fullgraph=True)
        out_c = cf(**x)
        check("torch.compile(fullgraph=True)", torch.equal(out_c, out0 * 2.0))
    except Exception as e:  # report, keep going
        check("torch.compile(fullgraph=True)", False, error=f"{type(e).__name__}: {str(e)[:300]}")

    # The op alone (isolates the wrapper if the check above fails).
    try:
        co = torch.compile(lambda q, k, v, fgate: torch.ops.foxc.attention(attn.id, [q, k, v, fgate])[0], fullgraph=True)
        check("torch.compile(fullgraph=True) of torch.ops.foxc.attention", torch.equal(co(**x), out0))
    except Exception as e:
        check("torch.compile(fullgraph=True) of torch.ops.foxc.attention", False, error=f"{type(e).__name__}: {str(e)[:300]}")

    # CUDA graph capture and replay.
    try:
        static = {n: t.clone() for n, t in x.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                attn(**static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out_g = attn(**static)
        x2 = inputs(attn, 2, 8, 4096, 128, seed=2)
        for n in static:
            static[n].copy_(x2[n])
        graph.replay()
        torch.cuda.synchronize()
        ref2 = attn(**x2)
        check("CUDA graph capture + replay on new inputs", torch.equal(out_g, ref2))
    except Exception as e:
        check("CUDA graph capture + replay on new inputs", False, error=f"{type(e).__name__}: {str(e)[:300]}")

    # Kernels cached per (program, options, head dim, device): another T reuses them.
    before = foxc.cache_info()
    attn(**inputs(attn, 1, 2, 1000, 128))
    after = foxc.cache_info()
    check("kernel cache hit for a new T, same D", after["kernel_builds"] == before["kernel_builds"], info=str(after))

    # Validation: ValueError naming the tensor, before any launch.
    def expect(label, tensors, pattern):
        try:
            attn(**tensors)
            check(f"error: {label}", False, error="no exception")
        except ValueError as e:
            check(f"error: {label}", pattern in str(e), message=str(e)[:160])

    expect("dtype", {**x, "q": x["q"].float()}, "`q`")
    expect("shape", {**x, "k": x["k"][:, :, :-1].contiguous()}, "`k`")
    expect("contiguity", {**x, "v": x["v"].transpose(2, 3).contiguous().transpose(2, 3)}, "`v`")
    expect("device", {**x, "fgate": x["fgate"].cpu()}, "`fgate`")
    expect("missing", {n: t for n, t in x.items() if n != "fgate"}, "fgate")
    expect("extra", {**x, "bias": x["fgate"]}, "`bias`")

    # Backward: no host sync, torch.compile of forward and backward, CUDA graph capture.
    dout = torch.randn(x["q"].shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5)).to(torch.bfloat16)
    eager = foxc_grads(attn, x, dout)
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    out = attn(**leaves)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out.backward(dout)
        check("backward: no sync under set_sync_debug_mode('error')", True)
    except RuntimeError as e:
        check("backward: no sync under set_sync_debug_mode('error')", False, error=str(e)[:200])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    check("backward: gradients of fgate and q, k, v exist", all(leaves[n].grad is not None for n in x))
    try:
        cf = torch.compile(lambda q, k, v, fgate: attn(q=q, k=k, v=v, fgate=fgate), fullgraph=True)
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
        cf(**leaves).backward(dout)
        torch.cuda.synchronize()
        same = all(torch.equal(leaves[n].grad, eager[n]) for n in x)
        check("torch.compile(fullgraph=True) forward + backward: eager's gradient bits", same)
    except Exception as e:
        check("torch.compile(fullgraph=True) forward + backward: eager's gradient bits", False, error=f"{type(e).__name__}: {str(e)[:300]}")
    try:
        static = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
        static_dout = dout.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                attn(**static).backward(static_dout)
        torch.cuda.current_stream().wait_stream(side)
        for t in static.values():
            t.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            attn(**static).backward(static_dout)
        graph.replay()
        torch.cuda.synchronize()
        check("CUDA graph capture + replay of forward + backward", all(torch.equal(static[n].grad, eager[n]) for n in x))
    except Exception as e:
        check("CUDA graph capture + replay of forward + backward", False, error=f"{type(e).__name__}: {str(e)[:300]}")

    # Speed (information): foxc (ACP) vs dense foxc vs torch SDPA causal without the decay.
    dense = foxc.load(EXAMPLES / "fox.attn", no_prune=True)
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    for label, fn in (
        ("foxc acp", lambda: attn(**x)),
        ("foxc dense", lambda: dense(**x)),
        ("sdpa causal (no decay)", lambda: F.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True)),
        ("foxc acp fwd+bwd", lambda: attn(**leaves).backward(dout)),
        ("foxc dense fwd+bwd", lambda: dense(**leaves).backward(dout)),
        ("sdpa causal (no decay) fwd+bwd", lambda: F.scaled_dot_product_attention(
            leaves["q"], leaves["k"], leaves["v"], is_causal=True).backward(dout)),
    ):
        try:
            for _ in range(3):
                fn()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20):
                fn()
            e1.record()
            torch.cuda.synchronize()
        except Exception as e:
            print(f"time {label}: failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        print(f"time {label}: {e0.elapsed_time(e1) / 20:.3f} ms (B=2,H=8,T=4096,D=128)")
        results.append({"time": label, "ms": e0.elapsed_time(e1) / 20})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--only", choices=["prefill", "programs"])
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, foxc {foxc.__version__}")
    if a.only is None:
        for D in (64, 128):
            run_accuracy(2, 4, 1027, D)
            run_gradients(2, 4, 1027, D)
        run_plan_choices()
        run_kept_workspace()
        run_torch_features()
    if a.only in (None, "prefill"):
        for dtype in ("bf16", "f16"):
            run_prefill(dtype)
    if a.only in (None, "programs"):
        run_programs()
    failed = [r for r in results if "check" in r and not r["ok"]]
    print(f"{len([r for r in results if 'check' in r]) - len(failed)} passed, {len(failed)} failed")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(results, indent=1))
    sys.exit(len(failed))


if __name__ == "__main__":
    main()
