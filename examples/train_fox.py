#!/usr/bin/env python3
"""Train a small FoX decoder language model three ways, from the same initialization on the same
data, and compare loss curves and training throughput (issue 10, item 5).

    python3 examples/train_fox.py [--steps 200] [--quick] [--out-dir DIR]
                                  [--methods foxc,flex_acp,flex_dense] [--device cuda|cpu]
    torchrun --nproc-per-node N examples/train_fox.py --ddp   (or --fsdp)

The ways differ only in the attention (everything from the q/k/v/gate projections to the
attention output, fwd + bwd):
- `foxc`:       foxc's compiled examples/fox_qknorm.attn (QK-norm, gate cumsum and ACP inside
                the program) through `torch.ops.foxc.attention` with autograd;
- `flex_acp`:   FlexAttention (torch.compile) with FoX's score_mod and the ACP block mask
                (bench/flex_acp.py; the gate's gradient through two copies of the cumsum);
- `flex_dense`: the same with the dense causal block mask;
- `reference`:  eager f32 dense FoX (O(T^2) memory: for --device cpu and small checks).

The model: token embedding, L pre-norm blocks (RMSNorm; attention with q/k/v projections, a
forget-gate projection to one logit per head, QK-norm with learned weights of the head dim;
GELU MLP of 4x width), final RMSNorm, output projection. The forget-gate biases are spread
over heads (mean decay 1e-4 .. 1e-1 per token), so that some heads forget within hundreds of
tokens: ACP has tiles to skip from the first step. Defaults: 12 layers, width 768, 12 heads of
64, context 8192, 1 sequence per step, 300 steps, AdamW, bf16 autocast (bf16 attention inputs).

The corpus is made here (no downloads): an order-2 Markov chain over a 1024-token vocabulary
(4 likely successors per context) interleaved with copies of earlier spans from up to 4096
tokens back, so that both local and long-range attention pay off.

Prints per method: tokens/s of the whole training step (forward, backward, optimizer; steps after
the warm-up), the attention's time per step (its fwd + bwd on each layer's real inputs, timed
alone) and its share of the step, and the losses; writes train_fox.json and train_fox.png (loss
curves) to --out-dir.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import flex_acp  # noqa: E402  (bench/flex_acp.py: the FlexAttention peer, one definition)

RMS_EPS = 1e-6  # foxc's rmsnorm eps (ir/src/lower.rs RMSNORM_EPS)
METHODS = ("foxc", "flex_acp", "flex_dense", "reference")


# ---------------------------------------------------------------- data


def make_corpus(n_tokens: int, vocab: int, seed: int) -> np.ndarray:
    """An order-2 Markov chain (4 likely successors per context) with copied spans."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, vocab, size=(vocab, vocab // 64, 4))  # context hashed to vocab x 16
    out = np.empty(n_tokens, dtype=np.int64)
    out[:2] = rng.integers(0, vocab, 2)
    choice = rng.integers(0, 4, n_tokens)
    noise = rng.random(n_tokens)
    rand_tok = rng.integers(0, vocab, n_tokens)
    t = 2
    while t < n_tokens:
        if noise[t] < 0.004 and t > 64:
            # Copy a span of 32..255 tokens from up to 4096 back.
            length = int(rng.integers(32, 256))
            dist = int(rng.integers(length, min(4096, t) + 1))
            n = min(length, n_tokens - t)
            out[t : t + n] = out[t - dist : t - dist + n]
            t += n
            continue
        if noise[t] > 0.97:
            out[t] = rand_tok[t]
        else:
            out[t] = succ[out[t - 1], out[t - 2] % (vocab // 64), choice[t]]
        t += 1
    return out


class Batches:
    """The global batch of `step` (B windows of T + 1 tokens at places fixed by the seed and the
    step); rank r of `world` takes rows [r B / world, (r + 1) B / world), so any number of
    processes sees the same data per step."""

    def __init__(self, corpus: np.ndarray, B: int, T: int, world: int, seed: int):
        self.corpus, self.B, self.T, self.world, self.seed = corpus, B, T, world, seed

    def get(self, step: int, rank: int, device):
        rng = np.random.default_rng((self.seed, step))
        starts = rng.integers(0, len(self.corpus) - self.T - 1, self.B)
        per = self.B // self.world
        starts = starts[rank * per : (rank + 1) * per]
        w = np.stack([self.corpus[s : s + self.T + 1] for s in starts])
        w = torch.from_numpy(w)
        if device.type == "cuda":
            w = w.pin_memory()  # an asynchronous copy: the host runs ahead of the GPU
        w = w.to(device, non_blocking=True)
        return w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------- attention, four ways


def rmsnorm(x, w):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w


def _flex_fox(q, k, v, fgate, wq, wk, block_mask):
    """QK-norm, gate cumsum and FlexAttention FoX (compiled as one function)."""
    from torch.nn.attention.flex_attention import flex_attention

    qn = rmsnorm(q, wq).to(q.dtype)
    kn = rmsnorm(k, wk).to(k.dtype)
    c = flex_acp.gate_cumsum(fgate)
    # Two copies of c: FlexAttention cannot differentiate one tensor indexed twice.
    return flex_attention(qn, kn, v, score_mod=flex_acp.fox_score_mod(c, c.clone()), block_mask=block_mask)


def reference_fox(q, k, v, fgate, wq, wk):
    """Dense causal FoX in f32, eager."""
    qn, kn = rmsnorm(q, wq), rmsnorm(k, wk)
    T, D = q.shape[-2], q.shape[-1]
    c = flex_acp.gate_cumsum(fgate)
    s = qn @ kn.transpose(-1, -2) / math.sqrt(D) + c[..., :, None] - c[..., None, :]
    i = torch.arange(T, device=q.device)
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(v.dtype)


class Attend:
    """`attend(q, k, v, fgate, wq, wk) -> out` for one method; q, k, v [B, H, T, D] in the
    attention dtype, fgate [B, H, T] f32 logits, wq, wk [D] f32."""

    def __init__(self, method: str, log_eps: float, block: int):
        self.method, self.log_eps, self.block = method, log_eps, block
        self.kept = []  # kept tile fraction of each ACP call (flex_acp), as tensors
        self._masks = {}
        if method == "foxc":
            import foxc
            import foxc.torch  # noqa: F401  (registers the op and its autograd)

            self.attn = foxc.load(ROOT / "examples" / "fox_qknorm.attn", log_eps=log_eps)
        elif method.startswith("flex"):
            torch._dynamo.config.recompile_limit = 1024
            torch._dynamo.config.cache_size_limit = 1024
            self.flex = torch.compile(_flex_fox, fullgraph=True, dynamic=False)

    def __call__(self, q, k, v, fgate, wq, wk):
        if self.method == "foxc":
            return self.attn(q=q, k=k, v=v, fgate=fgate, wq=wq, wk=wk)
        if self.method == "reference":
            return reference_fox(q, k, v, fgate, wq, wk)
        T = q.shape[-2]
        if self.method == "flex_dense":
            mask = self._masks.get(T)
            if mask is None:
                mask = self._masks[T] = flex_acp.causal_block_mask(T, q.device, self.block)
        else:
            with torch.no_grad():
                # The paper's rule with QK-norm: u = scale * max|qn| * max|kn| per (b, h).
                qn, kn = rmsnorm(q, wq), rmsnorm(k, wk)
                u = flex_acp.qk_bound(qn, kn)
                c = flex_acp.gate_cumsum(fgate)
                start, _ = flex_acp.block_starts(c, flex_acp.paper_delta(u, self.log_eps, T), self.block, self.block)
                mask = flex_acp.acp_block_mask(start, T, self.block, self.block)
        return self.flex(q, k, v, fgate, wq, wk, mask)


# ---------------------------------------------------------------- the model


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return (rmsnorm(x, self.w)).to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        W, H = cfg.width, cfg.heads
        self.H, self.D = H, W // H
        self.norm1 = RMSNorm(W)
        self.qkv = nn.Linear(W, 3 * W, bias=False)
        self.gate = nn.Linear(W, H, bias=True)
        self.wq = nn.Parameter(torch.ones(self.D))
        self.wk = nn.Parameter(torch.ones(self.D))
        self.proj = nn.Linear(W, W, bias=False)
        self.norm2 = RMSNorm(W)
        self.fc1 = nn.Linear(W, 4 * W, bias=False)
        self.fc2 = nn.Linear(4 * W, W, bias=False)
        with torch.no_grad():
            # Mean decay a_h per token from 1e-4 to 1e-1 over heads: bias = logit(exp(-a_h)).
            a = 10.0 ** torch.linspace(-4.0, -1.0, H)
            f = torch.exp(-a)
            self.gate.bias.copy_(torch.log(f) - torch.log1p(-f))
            self.gate.weight.mul_(0.1)
            for lin in (self.proj, self.fc2):
                lin.weight.mul_(1.0 / math.sqrt(2 * cfg.layers))
        self.attend = None  # set by the trainer (not a module: same for every layer)
        self.capture = None  # a list: record the attention's inputs (for timing it alone)

    def forward(self, x):
        B, T, W = x.shape
        h = self.norm1(x)
        q, k, v = self.qkv(h).view(B, T, 3, self.H, self.D).permute(2, 0, 3, 1, 4).unbind(0)
        # bf16 attention inputs on every device (what fox_qknorm.attn declares).
        q, k, v = (t.to(torch.bfloat16).contiguous() for t in (q, k, v))
        fgate = self.gate(h).float().transpose(1, 2).contiguous()
        if self.capture is not None:
            self.capture.append(tuple(t.detach().clone() for t in (q, k, v, fgate, self.wq, self.wk)))
        o = self.attend(q, k, v, fgate, self.wq, self.wk)
        x = x + self.proj(o.transpose(1, 2).reshape(B, T, W).to(x.dtype))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


class FoxLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        with torch.no_grad():
            self.emb.weight.normal_(0.0, 0.02)
            self.head.weight.normal_(0.0, 0.02)

    def set_attention(self, attend):
        for b in self.blocks:
            b.attend = attend

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


# ---------------------------------------------------------------- training


def setup_distributed(args):
    """(rank, world, device); --ddp / --fsdp under torchrun (one process per GPU)."""
    if not (args.ddp or args.fsdp):
        return 0, 1, torch.device(args.device)
    import torch.distributed as dist

    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def wrap(model, args, device):
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
        return model
    return model


def cuda_sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_attention(attend, captured, device, reps=5):
    """Median ms of the attention's fwd + bwd summed over the layers, on the captured inputs."""
    grads = [torch.randn(c[0].shape, device=device, dtype=c[2].dtype) for c in captured]

    def once():
        for c, g in zip(captured, grads):
            ins = [t.detach().clone().requires_grad_(True) for t in c]
            attend(*ins).backward(g)

    once()
    once()
    times = []
    for _ in range(reps):
        cuda_sync(device)
        t0 = time.perf_counter()
        once()
        cuda_sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def train(method, cfg, init_state, batches, args, rank, world, device):
    attend = Attend(method, args.log_eps, args.block)
    model = FoxLM(cfg).to(device)
    model.load_state_dict(init_state)
    model.set_attention(attend)
    net = wrap(model, args, device)
    fused = device.type == "cuda" and not args.fsdp
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    warm_lr = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm_lr))
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    losses = []
    warmup = min(args.warmup, args.steps - 1)
    t0 = None
    for step in range(args.steps):
        if step == warmup:
            cuda_sync(device)
            t0 = time.perf_counter()
        x, y = batches.get(step, rank, device)
        with amp:
            logits = net(x)
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    cuda_sync(device)
    elapsed = time.perf_counter() - t0
    timed = args.steps - warmup
    losses = torch.stack(losses)
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(losses)
        losses /= world
    step_ms = elapsed / timed * 1e3
    tokens = cfg.batch * cfg.ctx
    # The attention alone, on the inputs each layer sees for one more batch.
    for b in model.blocks:
        b.capture = []
    # With autograd on, as in training: the compiled FlexAttention graphs are reused (a no_grad
    # call would compile an inference graph first).
    with amp:
        model(batches.get(args.steps, rank, device)[0])
    captured = [b.capture[0] for b in model.blocks]
    for b in model.blocks:
        b.capture = None
    attn_ms = time_attention(attend, captured, device)
    kept = None
    if method == "flex_acp" or method == "foxc":
        kept = acp_kept(captured, args, device)
    res = {
        "method": method,
        "losses": [float(v) for v in losses.tolist()],
        "step_ms": step_ms,
        "tokens_per_s": tokens / step_ms * 1e3,
        "attention_ms": attn_ms,
        "attention_share": attn_ms / step_ms,
        "kept_fraction": kept,
        "timed_steps": timed,
    }
    del net, model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def acp_kept(captured, args, device):
    """Kept tile fraction of the ACP block rule (the paper's threshold, --block tiles) on the
    captured inputs: FlexAttention's kept set exactly; foxc's own tiles may differ in size."""
    fr = []
    for q, k, _v, fgate, wq, wk in captured:
        T = q.shape[-2]
        u = flex_acp.qk_bound(rmsnorm(q, wq), rmsnorm(k, wk))
        c = flex_acp.gate_cumsum(fgate)
        start, _ = flex_acp.block_starts(c, flex_acp.paper_delta(u, args.log_eps, T), args.block, args.block)
        fr.append(flex_acp.kept_fraction(start, args.block, args.block, T))
    return float(np.mean(fr))


def plot(results, path, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot ({path})")
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        label = f"{r['method']} ({r['tokens_per_s'] / 1e3:.1f}k tok/s)"
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=label, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


class Config:
    def __init__(self, args):
        self.layers, self.width, self.heads = args.layers, args.width, args.heads
        self.ctx, self.batch, self.vocab = args.ctx, args.batch, args.vocab

    def __repr__(self):
        return (
            f"{self.layers} layers, width {self.width}, {self.heads} heads of {self.width // self.heads}, "
            f"context {self.ctx}, batch {self.batch}, vocab {self.vocab}"
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="tiny model (2 layers, width 128, context 1024), 20 steps")
    ap.add_argument("--methods", default=None, help="comma list of " + ",".join(METHODS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1, help="sequences per step (all processes together)")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=10, help="untimed first steps (compilation)")
    ap.add_argument("--log-eps", type=float, default=-10.0)
    ap.add_argument("--block", type=int, default=128, help="FlexAttention's ACP tile size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--loss-log", help="write each method's per-step losses here (JSON {method: [loss, ...]}, rank 0)")
    ap.add_argument("--ddp", action="store_true", help="DistributedDataParallel (under torchrun)")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard per block (under torchrun)")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.heads, args.ctx = 2, 128, 2, 1024
        args.steps = min(args.steps, 20)
        args.warmup = min(args.warmup, 3)
    if args.ddp and args.fsdp:
        ap.error("--ddp and --fsdp exclude each other")
    if args.width % args.heads:
        ap.error("--width must be a multiple of --heads")
    if args.steps < 2:
        ap.error("--steps must be at least 2")
    default = ("foxc", "flex_acp", "flex_dense") if args.device == "cuda" else ("reference",)
    methods = args.methods.split(",") if args.methods else list(default)
    for m in methods:
        if m not in METHODS:
            ap.error(f"unknown method {m!r} (choose from {', '.join(METHODS)})")
    if args.device == "cpu" and any(m.startswith("flex") for m in methods):
        ap.error("FlexAttention has no backward on the CPU: use --methods foxc,reference there")

    rank, world, device = setup_distributed(args)
    if args.batch % world:
        ap.error(f"--batch {args.batch} does not split over {world} processes")
    cfg = Config(args)
    torch.manual_seed(args.seed)
    init_state = {k: v.clone() for k, v in FoxLM(cfg).state_dict().items()}
    n_params = sum(v.numel() for v in init_state.values())
    corpus = make_corpus(max(4 * args.ctx, 1 << 20), args.vocab, args.seed)
    batches = Batches(corpus, args.batch, args.ctx, world, args.seed)
    say = print if rank == 0 else (lambda *a, **k: None)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    say(f"# FoX LM: {cfg}, {n_params / 1e6:.1f}M parameters; {args.steps} steps; {world} x {dev_name}; torch {torch.__version__}")
    out = pathlib.Path(args.out_dir)
    meta = {"config": repr(cfg), "params": n_params, "world": world, "device": dev_name, "torch": torch.__version__,
            "argv": sys.argv[1:]}
    results, failed = [], {}
    for m in methods:
        t0 = time.perf_counter()
        try:
            r = train(m, cfg, init_state, batches, args, rank, world, device)
        except Exception as e:
            if world > 1:
                raise  # the other ranks would wait forever in a collective
            # One way failing must not lose the others' numbers (one device call runs them all).
            failed[m] = f"{type(e).__name__}: {e}"
            say(f"{m}: FAILED after {time.perf_counter() - t0:.0f} s: {failed[m][:500]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        r["wall_s"] = time.perf_counter() - t0
        results.append(r)
        kept = (
            f", the ACP block rule keeps {r['kept_fraction']:.2f} of the causal {args.block}x{args.block} tiles"
            if r["kept_fraction"] is not None
            else ""
        )
        say(
            f"{m}: {r['tokens_per_s']:.0f} tokens/s ({r['step_ms']:.1f} ms/step over {r['timed_steps']} steps), "
            f"attention fwd+bwd {r['attention_ms']:.1f} ms/step = {100 * r['attention_share']:.0f}% of the step{kept}; "
            f"loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f} (last 10: {np.mean(r['losses'][-10:]):.3f}); "
            f"{r['wall_s']:.0f} s wall",
            flush=True,
        )
        if rank == 0:
            # After every way: a run cut short still leaves the finished ways' numbers.
            out.mkdir(parents=True, exist_ok=True)
            (out / "train_fox.json").write_text(json.dumps({"meta": meta, "results": results, "failed": failed}, indent=1))
    if rank == 0:
        base = {r["method"]: r for r in results}
        for ref in ("flex_acp", "flex_dense"):
            if "foxc" in base and ref in base:
                say(f"foxc vs {ref}: {base['foxc']['tokens_per_s'] / base[ref]['tokens_per_s']:.3f}x tokens/s")
        if len(results) > 1:
            first = np.array(results[0]["losses"])
            for r in results[1:]:
                d = np.abs(np.array(r["losses"]) - first)
                say(f"loss |{r['method']} - {results[0]['method']}|: max {d.max():.4f}, mean {d.mean():.4f}")
        out.mkdir(parents=True, exist_ok=True)
        if args.loss_log:
            pathlib.Path(args.loss_log).write_text(json.dumps({r["method"]: r["losses"] for r in results}))
        (out / "train_fox.json").write_text(json.dumps({"meta": meta, "results": results, "failed": failed}, indent=1))
        if results and plot(results, out / "train_fox.png", f"FoX LM: {cfg}\n{world} x {dev_name}, same init and data"):
            say(f"wrote {out / 'train_fox.png'} and {out / 'train_fox.json'}")
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
