"""Context-parallel FoX attention simulated on one GPU (issue 13, "what one GPU allows").

P virtual ranks in one process: the exchange runs as in ``foxc.distributed.simulate`` (threads,
the planned K/V tiles copied from rank to rank instead of sent), then every rank's partial
attentions run through the foxc torch op (``torch.ops.foxc.attention``) on this GPU, one rank
after another, and are merged through their log-sum-exp. Checked: the merged output and lse
against the single-GPU foxc output of the same pruned program (``examples/fox.attn``) on the
whole sequence, and, at a small size, against the f64 reference interpreter. Timed (CUDA
events, median of ``--reps``): the single-GPU forward, and each rank's partials + merge (on P
GPUs the ranks would run at the same time: the slowest rank bounds the step, communication
aside). Reported: bytes the plan sends against plain ring attention (``Plan.bytes``) and the
bytes the simulated exchange actually moved.

    PYTHONPATH=<foxc wheel> python3 bench/cp_sim.py [--T 131072 262144] [--P 2 4] [--json out.json]

Inputs follow WORKLOAD.md (B = 1, H = 16, D = 128; q and k RMS-normalized N(0, 1), v N(0, 1),
gate logits logit(exp(-a_h)) + N(0, 1)), drawn on the GPU with torch's generator (the same
distribution as ``foxc inputs`` and bench/cp_plan.py, other numbers). ``--cpu`` runs the same
code on NumPy arrays through the reference interpreter (small sizes; for testing the script).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

import foxc
from foxc import distributed as cp

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The GPU contract (DESIGN.md section 5): bf16 operands, f32 accumulation.
GPU_REL_L2 = 1e-2


def decays(H: int) -> np.ndarray:
    """Mean decay per token of each head (WORKLOAD.md)."""
    return 10.0 ** (-4.0 + 4.0 * np.arange(H) / (H - 1))


def inputs_torch(B, H, T, D, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def normed():
        x = torch.randn((B, H, T, D), generator=g, device="cuda")
        return (x * torch.rsqrt((x * x).mean(-1, keepdim=True))).to(torch.bfloat16)

    q, k = normed(), normed()
    v = torch.randn((B, H, T, D), generator=g, device="cuda").to(torch.bfloat16)
    a = torch.tensor(decays(H), device="cuda")
    logit = (torch.log(torch.exp(-a)) - torch.log1p(-torch.exp(-a))).float()
    fgate = logit.reshape(1, H, 1) + torch.randn((B, H, T), generator=g, device="cuda")
    return q, k, v, fgate.float().contiguous()


def inputs_numpy(B, H, T, D, seed):
    rng = np.random.default_rng(seed)

    def normed():
        x = rng.standard_normal((B, H, T, D))
        return x / np.sqrt((x * x).mean(-1, keepdims=True))

    q, k = normed(), normed()
    v = rng.standard_normal((B, H, T, D))
    a = decays(H)
    logit = np.log(np.exp(-a)) - np.log1p(-np.exp(-a))
    return q, k, v, (logit.reshape(1, H, 1) + rng.standard_normal((B, H, T))).astype(np.float32)


class Clock:
    """Median wall time of a callable: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, gpu: bool, reps: int):
        self.gpu, self.reps = gpu, reps

    def __call__(self, f) -> float:
        times = []
        for _ in range(self.reps):
            if self.gpu:
                import torch

                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                f()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                f()
                times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)


def as_f64(x) -> np.ndarray:
    if cp._is_torch(x):
        return x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def compare(out, lse, ref_out, ref_lse) -> dict:
    """Relative L2 and max abs differences of (out, lse) against a reference, in f64 (on the
    GPU for torch tensors); bf16 rounding of a bf16 reference is about 2^-9 relative."""
    if cp._is_torch(out) or cp._is_torch(ref_out):
        import torch

        dev = (out if cp._is_torch(out) else ref_out).device
        f = lambda x: torch.as_tensor(x, device=dev).double()  # noqa: E731
        o, r, lo, lr = f(out), f(ref_out), f(lse), f(ref_lse)
        finite = torch.isfinite(lr)
        return {
            "rel_l2": float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r)),
            "max_abs_over_max_ref": float((o - r).abs().max() / r.abs().max()),
            "lse_max_abs": float((lo[finite] - lr[finite]).abs().max()),
            "finite": bool(torch.isfinite(o).all() and (torch.isfinite(lo) == finite).all()),
        }
    o, r = as_f64(out), as_f64(ref_out)
    lo, lr = as_f64(lse), as_f64(ref_lse)
    finite = np.isfinite(lr)
    return {
        "rel_l2": float(np.linalg.norm(o - r) / np.linalg.norm(r)),
        "max_abs_over_max_ref": float(np.abs(o - r).max() / np.abs(r).max()),
        "lse_max_abs": float(np.abs(lo[finite] - lr[finite]).max()),
        "finite": bool(np.isfinite(o).all() and (np.isfinite(lo) == finite).all()),
    }


def single_device(attn, q, k, v, fgate, gpu: bool):
    """The whole sequence on one device: ``(out, lse)``."""
    if gpu:
        import torch

        from foxc import torch as _  # noqa: F401  (registers the op)

        return torch.ops.foxc.attention(attn.id, [q, k, v, fgate])
    return cp.reference_with_lse(attn, q=q, k=k, v=v, fgate=fgate)


def run_case(attn, T, P, H, args, gpu: bool, clock: Clock, ref=None) -> dict:
    B, D = 1, args.D
    make = inputs_torch if gpu else inputs_numpy
    q, k, v, fgate = make(B, H, T, D, args.seed + T)
    one = single_device(attn, q, k, v, fgate, gpu)
    row = {"T": T, "P": P, "B": B, "H": H, "D": D}
    row["single_ms"] = clock(lambda: single_device(attn, q, k, v, fgate, gpu))
    t0 = time.perf_counter()
    works, ex = cp.exchange_all(attn, P, q, k, v, fgate)
    row["exchange_host_s"] = time.perf_counter() - t0
    calls = [cp.rank_partials(w, cp.chunk(q, r, P), cp.chunk(k, r, P), cp.chunk(v, r, P)) for r, w in enumerate(works)]
    results = [cp.run_partials(c) for c in calls]
    out = cp._cat([o for o, _ in results], axis=2)
    lse = cp._cat([l for _, l in results], axis=2)
    row["vs_single"] = compare(out, lse, *one)
    if ref is not None:
        exact = ref(q, k, v, fgate)
        row["vs_f64"] = compare(out, lse, *exact)
        row["single_vs_f64"] = compare(one[0], one[1], *exact)
    # Each rank's partials + merge; the slowest rank is the step on P GPUs (communication aside).
    row["rank_ms"] = [clock(lambda c=c: cp.run_partials(c)) for c in calls]
    row["partials_per_rank"] = [len(c) for c in calls]
    plan = works[0].plan
    b = plan.bytes(d=D)
    row["bytes"] = {**b, "moved_in_sim": int(sum(ex.p2p)), "gathered_in_sim": int(sum(ex.gathered))}
    row["plan_over_ring"] = b["plan"] / b["ring"]
    # Remote key tiles the partial kernels visit (in the plan's tiles): from each query tile's
    # first kept key on (the kernel's keys_from bound), for every earlier chunk a rank received
    # anything of; against every tile of those chunks (no bound) and the tiles received.
    n, bm, L = plan.tiles_per_rank, plan.bm, T // P
    visited = every = 0
    for r, w in enumerate(works):
        st = w.starts[:, :, r * L // bm : (r + 1) * L // bm]  # [B, H, query tiles of rank r]
        for src in w.received:
            visited += int(np.clip((src + 1) * n - st, 0, n).sum())
            every += n * st.size
    row["remote_tiles_visited"] = visited
    row["remote_tiles_without_bound"] = every
    row["key_tiles_received"] = int(plan.tiles_sent())
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[131072, 262144])
    ap.add_argument("--P", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small-T", type=int, default=2048, help="the size also checked against f64 (0: skip)")
    ap.add_argument("--small-H", type=int, default=4, help="heads of that check")
    ap.add_argument("--cpu", action="store_true", help="NumPy arrays and the reference interpreter")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    gpu = not a.cpu
    # examples/fox.attn as is (bf16 output, the paper rule, the target's tiles) on the GPU; an
    # f32 output on the CPU (the reference interpreter's comparison is then sharper).
    text = (ROOT / "examples" / "fox.attn").read_text()
    if not gpu:
        text = text.replace("-> bf16[B, H, T, D]", "-> f32[B, H, T, D]")
    attn = foxc.load(text)
    clock = Clock(gpu, a.reps)

    def ref(q, k, v, fgate):
        return cp.reference_with_lse(attn, q=as_f64(q), k=as_f64(k), v=as_f64(v), fgate=as_f64(fgate).astype(np.float32))

    rows, failed = [], []
    small = [(a.small_T, P, a.small_H, ref) for P in a.P] if a.small_T else []
    for T, P, H, r in small + [(T, P, a.H, None) for T in a.T for P in a.P]:
        try:
            row = run_case(attn, T, P, H, a, gpu, clock, r)
        except Exception as e:  # noqa: BLE001  (one case's failure is reported, the others run)
            print(f"T={T} P={P}: FAILED: {type(e).__name__}: {e}", flush=True)
            failed.append((T, P))
            continue
        ok = row["vs_single"]["rel_l2"] <= GPU_REL_L2 and row["vs_single"]["finite"]
        if "vs_f64" in row:
            ok = ok and row["vs_f64"]["rel_l2"] <= GPU_REL_L2
        row["ok"] = ok
        if not ok:
            failed.append((T, P))
        rows.append(row)
        print(json.dumps(row), flush=True)
        if gpu:
            import torch

            torch.cuda.empty_cache()
    gib = 2.0**30
    print("\n| T | P | single GPU ms | slowest rank ms (partials + merge) | ranks ms | rel L2 vs single | lse max abs | plan GiB | ring GiB | plan / ring | moved in sim GiB | remote tiles visited / without the bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = r["bytes"]
        print(
            f"| {r['T']} | {r['P']} | {r['single_ms']:.2f} | {max(r['rank_ms']):.2f} | "
            f"{' / '.join(f'{x:.2f}' for x in r['rank_ms'])} | {r['vs_single']['rel_l2']:.2e} | "
            f"{r['vs_single']['lse_max_abs']:.2e} | {b['plan'] / gib:.3f} | {b['ring'] / gib:.3f} | "
            f"{r['plan_over_ring']:.4f} | {b['moved_in_sim'] / gib:.3f} | "
            f"{r['remote_tiles_visited']} / {r['remote_tiles_without_bound']} |"
        )
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    if failed:
        print(f"FAILED: {failed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
