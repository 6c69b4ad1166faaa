"""foxc.fox: FoX in both layouts, both gate spellings, any sm_scale, square or queries at the end
of the keys. The program foxc writes means FoX: its f64 interpreter (the reference) equals an
independent f64 NumPy FoX (inputs rounded to bf16 as the program declares them) within ACP's
bound; the compiled CPU run meets the numerics contract against the interpreter (DESIGN.md
section 5: relative L2 4e-3 for a bf16 output); both layouts give the same bits; the attention
is fused and pruned."""

import itertools

import numpy as np
import pytest

import foxc

ml_dtypes = pytest.importorskip("ml_dtypes")


def bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def fox_f64(q, k, v, log_f, sm_scale):
    """Head-first f64 FoX: q [B, H, N, D] at the end of k, v [B, H, M, D]; log_f [B, H, M]."""
    n, m = q.shape[2], k.shape[2]
    c = np.cumsum(log_f, axis=-1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * sm_scale + c[..., m - n :, None] - c[..., None, :]
    keep = np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n)
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v


CASES = list(itertools.product([True, False], ["logits", "log"], [None, 0.3], [False, True]))


@pytest.mark.parametrize("head_first,gate,sm_scale,fewer", CASES)
def test_fox_matches_an_independent_reference(head_first, gate, sm_scale, fewer):
    rng = np.random.default_rng()
    B, H, M, D = 2, 3, 200, 16
    N = 3 if fewer else M
    q, k, v = (rng.standard_normal((B, H, t, D)) for t in (N, M, M))
    logits = rng.standard_normal((B, H, M)) + np.linspace(-3.0, 4.0, H)[None, :, None]
    log_f = -np.logaddexp(0.0, -logits)  # logsigmoid
    g = logits if gate == "logits" else log_f
    g = g.astype(np.float32)
    scale = D**-0.5 if sm_scale is None else sm_scale
    ref = fox_f64(bf16(q), bf16(k), bf16(v), -np.logaddexp(0.0, -g.astype(np.float64)) if gate == "logits" else g.astype(np.float64), scale)

    def layout(x):  # head-first [B, H, T, ...] -> the layout asked for
        return np.ascontiguousarray(x if head_first else np.moveaxis(x, 1, 2)).astype(np.float32)

    x = dict(q=layout(q), k=layout(k), v=layout(v))
    got = foxc.fox.attention(x["q"], x["k"], x["v"], layout(g), head_first=head_first, gate_kind=gate, sm_scale=sm_scale)
    attn = foxc.fox.load(head_first, gate, sm_scale, fewer)
    x["fgate" if gate == "logits" else "logf"] = layout(g)
    interp = foxc.reference(attn, **x)

    def head_first_of(y):
        return np.asarray(y, dtype=np.float64) if head_first else np.moveaxis(np.asarray(y, dtype=np.float64), 2, 1)

    # The program as written (the interpreter, dense) is FoX: ACP's bound is not even needed.
    err = np.abs(head_first_of(interp) - ref)
    assert err.max() <= 2.0**-7 * np.abs(ref).max(), f"interpreter vs NumPy FoX: {err.max():.3g}"
    got, interp = head_first_of(got), head_first_of(interp)
    rel = np.linalg.norm(got - interp) / np.linalg.norm(interp)
    assert rel <= 4e-3, rel
    assert np.abs(got - interp).max() <= 1e-2 * np.abs(interp).max()
    if not head_first:  # the same bits as the head-first program on the transposed tensors
        same = foxc.fox.attention(*(np.ascontiguousarray(np.moveaxis(a, 1, 2)) for a in (x["q"], x["k"], x["v"], layout(g))), gate_kind=gate, sm_scale=sm_scale)
        np.testing.assert_array_equal(np.asarray(same, dtype=np.float64), got)
    ir = attn.ir()
    assert "attention {" in ir and "pruned" in ir, ir


def test_the_options_are_checked():
    with pytest.raises(ValueError, match="gate must be one of"):
        foxc.fox.program(gate="sigmoid")
    with pytest.raises(ValueError, match="sm_scale must be finite"):
        foxc.fox.program(sm_scale=float("nan"))
