#!/usr/bin/env python3
"""foxc's GPU gradients of FoX against PyTorch autograd of an f32 reference (issue 9, item 6).

    python3 bench/grad_ref.py --foxc path/to/foxc IN.safetensors [IN2.safetensors ...] [--tol 1e-2]

For each input file of `foxc inputs examples/fox.attn` (q, k, v bf16 [B, H, T, D], fgate f32
[B, H, T]): draws `dout` ~ N(0, 1) in bf16 (seeded), runs
`foxc grad examples/fox.attn --backend cuda --inputs IN --dout DOUT -o GRADS` (pruned, as trained),
and computes the same math densely in f32 with torch autograd, one (b, h) at a time so the T x T
scores fit in memory: c = cumsum(max(logsigmoid(fgate), -100)), s = q k^T / sqrt(D) + c_i - c_j,
causal, softmax, out = P v. Prints `grad,shape,rel_l2` rows (relative L2 distance of foxc's `out`,
`grad_q`, `grad_k`, `grad_v`, `grad_fgate` from the reference) and exits 1 if any exceeds --tol
(the pruned tiles carry at most e^log_eps of each row's mass, far below the tolerance; bf16
operands dominate the distance).
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOG_F_FLOOR = -100.0


def reference_head(q, k, v, fgate, dout):
    """out and the gradients of q, k, v, fgate for one (b, h), f32 autograd."""
    q, k, v = (x.float().requires_grad_(True) for x in (q, k, v))
    fgate = fgate.float().requires_grad_(True)
    T, D = q.shape
    c = torch.cumsum(F.logsigmoid(fgate).clamp_min(LOG_F_FLOOR), dim=0)
    s = (q @ k.T) / D**0.5 + c[:, None] - c[None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    out = p @ v
    out.backward(dout.float())
    return out.detach(), q.grad, k.grad, v.grad, fgate.grad


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm()).item()


def check(foxc, path, tol, tmp):
    t = load_file(path, device="cuda")
    q, k, v, fgate = t["q"], t["k"], t["v"], t["fgate"]
    B, H, T, D = q.shape
    shape = f"{B}x{H}x{T}x{D}"
    gen = torch.Generator(device="cuda").manual_seed(7)
    dout = torch.randn(q.shape, device="cuda", generator=gen).to(torch.bfloat16)
    dpath, gpath = tmp / f"dout_{shape}.safetensors", tmp / f"grads_{shape}.safetensors"
    save_file({"dout": dout.cpu().contiguous()}, str(dpath))
    cmd = [foxc, "grad", str(ROOT / "examples" / "fox.attn"), "--backend", "cuda", "--inputs", str(path),
           "--dout", str(dpath), "-o", str(gpath)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    got = load_file(str(gpath), device="cuda")
    names = ("out", "grad_q", "grad_k", "grad_v", "grad_fgate")
    ref = {n: torch.empty(got[n].shape, dtype=torch.float32, device="cuda") for n in names}
    for b in range(B):
        for h in range(H):
            r = reference_head(q[b, h], k[b, h], v[b, h], fgate[b, h], dout[b, h])
            for n, x in zip(names, r):
                ref[n][b, h] = x
    worst = 0.0
    for n in names:
        e = rel_l2(got[n], ref[n])
        worst = max(worst, e)
        print(f"{n},{shape},{e:.3e}", flush=True)
    return worst <= tol


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--foxc", required=True, help="the foxc binary")
    ap.add_argument("--tol", type=float, default=1e-2)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # an f32 reference, not tf32
    print("grad,shape,rel_l2", flush=True)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        for path in args.inputs:
            ok &= check(args.foxc, path, args.tol, pathlib.Path(d))
    print("grad_ref: " + ("all within tolerance" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
