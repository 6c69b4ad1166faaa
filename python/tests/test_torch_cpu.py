"""The torch op on CPU tensors (foxc's CPU backend): outputs and autograd gradients against torch
autograd of an eager f32 reference, the saved-forward backward op, and tracing of forward and
backward by torch.compile (fullgraph, no graph break). Skipped where torch is not installed (CI
has none; bench/python_gpu.py checks the same on the GPU)."""

import math
import pathlib

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import foxc  # noqa: E402
import foxc.torch  # noqa: E402,F401

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def inputs(attn, B=1, H=3, T=130, D=16, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % (1 << 31))
    dims = {"B": B, "H": H, "T": T, "D": D}
    dt = {"bf16": torch.bfloat16, "f32": torch.float32}
    x = {}
    for name, dtype, decl in attn.signature:
        if dtype not in dt:
            continue  # integer parameters: the test sets them
        a = torch.randn([dims[d] for d in decl], generator=g)
        if name == "fgate":
            a = a + torch.linspace(-3.0, 4.0, H).view(1, H, 1)
        elif name == "slope":
            a = a.abs() * 0.3 + 0.05
        elif name in ("wq", "wk"):
            a = 1.0 + 0.1 * a
        x[name] = a.to(dt[dtype])
    return x


def reference(name, x):
    """Eager f32 of the example's math (dense, causal)."""
    q, k, v = (x[n].float() for n in ("q", "k", "v"))
    T, D = q.shape[-2], q.shape[-1]
    if name == "fox_qknorm":
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * x["wq"].float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * x["wk"].float()
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(T)
    if name in ("fox", "fox_qknorm"):
        c = torch.cumsum(F.logsigmoid(x["fgate"].float()), -1)
        s = s + c[..., :, None] - c[..., None, :]
    elif name == "alibi":
        s = s - x["slope"].float().view(1, -1, 1, 1) * (i[:, None] - i[None, :]).float()
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def grads(fn, x, dout):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    out = fn(leaves)
    out.backward(dout.to(out.dtype))
    return out.detach(), {n: t.grad for n, t in leaves.items()}


@pytest.mark.parametrize("name", ["fox", "fox_qknorm", "alibi", "causal"])
def test_autograd_matches_torch_autograd_of_the_reference(name):
    """Dense: an independent implementation of the same math (torch autograd of eager f32)."""
    attn = foxc.load(EXAMPLES / f"{name}.attn", no_prune=True)
    x = inputs(attn)
    dout = torch.randn(x["q"].shape).to(torch.bfloat16)
    out, g = grads(lambda t: attn(**t), x, dout)
    ref_out, ref_g = grads(lambda t: reference(name, t), {n: t.float() for n, t in x.items()}, dout.float())
    assert out.dtype == torch.bfloat16 and rel_l2(out, ref_out) <= 1e-2
    for n in x:
        assert g[n] is not None and g[n].dtype == x[n].dtype and g[n].shape == x[n].shape, n
        assert torch.isfinite(g[n].float()).all(), n
        assert rel_l2(g[n], ref_g[n]) <= 1e-2, (n, rel_l2(g[n], ref_g[n]))


@pytest.mark.parametrize("name", ["fox", "fox_qknorm", "alibi", "causal"])
def test_pruned_autograd_matches_the_interpreter(name):
    """ACP: the pruned gradients are those of the kept set, so the reference is foxc's f64
    interpreter on the same saved-forward gradient program, given the same saved out_f32 and
    lse."""
    np = pytest.importorskip("numpy")
    from foxc._numpy import _wires

    attn = foxc.load(EXAMPLES / f"{name}.attn")
    x = inputs(attn)
    dout = torch.randn(x["q"].shape).to(torch.bfloat16)
    _, g = grads(lambda t: attn(**t), x, dout)
    _, lse, out_f32 = torch.ops.foxc.attention_train(attn.id, [x[n] for n in attn.params])
    saved = {n: t.float().numpy() for n, t in x.items()}
    saved.update(dout=dout.float().numpy(), out=out_f32.numpy(), lse=lse.numpy())
    r = attn._program.grad_reference(_wires(saved), saved=True)
    for n in x:
        shape, data = r[f"grad_{n}"]
        w = torch.from_numpy(np.frombuffer(data, dtype="<f8").reshape(shape).copy())
        assert g[n].dtype == x[n].dtype and torch.isfinite(g[n].float()).all(), n
        assert rel_l2(g[n], w) <= 1e-2, (n, rel_l2(g[n], w))


def test_op_returns_out_and_lse():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = inputs(attn, seed=1)
    out, lse = torch.ops.foxc.attention(attn.id, [x[n] for n in attn.params])
    assert torch.equal(out, attn(**x))
    # lse_i = log sum_j exp(E_ij), E the scaled, decayed, masked scores.
    q, k = x["q"].float(), x["k"].float()
    T, D = q.shape[-2:]
    c = torch.cumsum(F.logsigmoid(x["fgate"]), -1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D) + c[..., :, None] - c[..., None, :]
    i = torch.arange(T)
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    assert lse.dtype == torch.float32 and rel_l2(lse, torch.logsumexp(s, -1)) <= 1e-5


def test_the_gradient_through_lse_is_not_offered():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = {n: t.requires_grad_(True) for n, t in inputs(attn, seed=2).items()}
    _, lse = torch.ops.foxc.attention(attn.id, [x[n] for n in attn.params])
    assert not lse.requires_grad


def test_gradients_are_deterministic():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = inputs(attn, T=260, seed=3)
    dout = torch.randn(x["q"].shape).to(torch.bfloat16)
    _, a = grads(lambda t: attn(**t), x, dout)
    _, b = grads(lambda t: attn(**t), x, dout)
    assert all(torch.equal(a[n], b[n]) for n in x)


def test_torch_compile_traces_forward_and_backward_without_graph_breaks():
    attn = foxc.load(EXAMPLES / "fox_qknorm.attn")
    x = inputs(attn, seed=4)
    dout = torch.randn(x["q"].shape).to(torch.bfloat16)

    def f(t):
        return attn(**t) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out_c, g_c = grads(compiled, x, dout)
    out_e, g_e = grads(f, x, dout)
    assert torch.equal(out_c, out_e)
    assert all(torch.equal(g_c[n], g_e[n]) for n in x)


def test_the_backward_op_alone():
    """torch.ops.foxc.attention_backward: one gradient per float input, in parameter order."""
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = inputs(attn, seed=5)
    ins = [x[n] for n in attn.params]
    out, lse, out_f32 = torch.ops.foxc.attention_train(attn.id, ins)
    assert torch.equal(out, attn(**x)) and torch.equal(out_f32.to(out.dtype), out)
    assert out_f32.dtype == torch.float32 and not torch.equal(out_f32, out.float())
    dout = torch.randn(out.shape).to(out.dtype)
    gs = torch.ops.foxc.attention_backward(attn.id, ins, out_f32, lse, dout)
    assert [tuple(g.shape) for g in gs] == [tuple(t.shape) for t in ins]
    _, ref = grads(lambda t: attn(**t), x, dout)
    assert all(torch.equal(g, ref[n]) for g, n in zip(gs, attn.params))
    # A wrong lse changes the gradients (the saved value is really read).
    bad = torch.ops.foxc.attention_backward(attn.id, ins, out_f32, lse + 1.0, dout)
    assert rel_l2(bad[2], gs[2]) > 0.1


def test_direct_op_callers_get_gradients_through_the_rounded_out():
    """foxc::attention (what foxc.distributed calls) differentiates too, from its bf16 out."""
    attn = foxc.load(EXAMPLES / "alibi.attn", no_prune=True)
    x = inputs(attn, seed=7)
    dout = torch.randn(x["q"].shape).to(torch.bfloat16)
    _, g = grads(lambda t: torch.ops.foxc.attention(attn.id, [t[n] for n in attn.params])[0], x, dout)
    _, w = grads(lambda t: attn(**t), x, dout)
    for n in ("q", "k", "v"):
        assert rel_l2(g[n], w[n]) <= 1e-2, n
    assert 0 < rel_l2(g["slope"], w["slope"]) <= 5e-2


def test_errors_name_the_tensor():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = inputs(attn, seed=6)
    with pytest.raises(ValueError, match="`q`"):
        attn(**{**x, "q": x["q"].float()})
    with pytest.raises(ValueError, match="`v`"):
        attn(**{**x, "v": x["v"].transpose(2, 3).contiguous().transpose(2, 3)})


def test_an_int64_start_is_narrowed_like_the_host_path(tmp_path):
    """`start: i64[B]` takes torch's default int64 tensors; the op narrows them to int32
    (saturating) as the extension narrows host arrays: the same output as the int32 program."""
    # Without the declared range [0, 256]: starts beyond it are the point.
    text = (EXAMPLES / "fox_leftpad.attn").read_text().replace(" in [0, 256]", "")
    wide, narrow = (tmp_path / "leftpad_i64.attn"), (tmp_path / "leftpad_i32.attn")
    wide.write_text(text.replace("start: i32[B]", "start: i64[B]"))
    narrow.write_text(text)
    wide, narrow = foxc.load(wide), foxc.load(narrow)
    x = inputs(narrow, B=2, T=150)
    x["start"] = torch.tensor([7, 2**31 - 1], dtype=torch.int32)
    out = wide(**dict(x, start=torch.tensor([7, 2**40], dtype=torch.int64)))
    assert torch.equal(out, narrow(**x))
    assert (out[1] == 0).all()

