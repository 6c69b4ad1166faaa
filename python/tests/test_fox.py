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


# ---------------------------------------------------------------- packed batches (cu_seqlens)
LENGTHS = [1, 37, 100, 5, 1, 64]


def packed_case(rng, lengths, H=3, D=16, gate="logits"):
    total = sum(lengths)
    q, k, v = (rng.standard_normal((total, H, D)).astype(np.float32) for _ in range(3))
    logits = rng.standard_normal((total, H)) + np.linspace(-3.0, 4.0, H)[None, :]
    g = (logits if gate == "logits" else -np.logaddexp(0.0, -logits)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    return q, k, v, g, cu


@pytest.mark.parametrize("gate,sm_scale,head_first", [("logits", None, False), ("log", 0.3, False), ("logits", None, True)])
def test_packed_sequences_equal_each_sequence_alone(gate, sm_scale, head_first):
    rng = np.random.default_rng()
    q, k, v, g, cu = packed_case(rng, LENGTHS, gate=gate)
    scale = 16**-0.5 if sm_scale is None else sm_scale

    def lay(x):  # [total, H, ...] -> [H, total, ...] head-first
        return np.ascontiguousarray(np.moveaxis(x, 0, 1)) if head_first else x

    for dt in (np.int32, np.int64):
        got = foxc.fox.attention(lay(q), lay(k), lay(v), lay(g), head_first=head_first, gate_kind=gate, sm_scale=sm_scale, cu_seqlens=cu.astype(dt))
        got = np.asarray(got, dtype=np.float64)
        got = np.moveaxis(got, 0, 1) if head_first else got
        assert got.shape == q.shape
        # The packed program through the interpreter (dense, as written).
        attn = foxc.fox.load(head_first, gate, sm_scale, packed=True)
        x = {"q": lay(q)[None], "k": lay(k)[None], "v": lay(v)[None], ("fgate" if gate == "logits" else "logf"): lay(g)[None]}
        x["first"] = foxc.fox.first_keys(cu, int(cu[-1]))[None]
        interp = np.asarray(foxc.reference(attn, **x), dtype=np.float64)[0]
        interp = np.moveaxis(interp, 0, 1) if head_first else interp
        for s in range(len(LENGTHS)):
            a, b = cu[s], cu[s + 1]
            # Each sequence alone: the unpacked program (sequence-first [1, L, H, D]) ...
            alone = foxc.fox.attention(q[None, a:b], k[None, a:b], v[None, a:b], g[None, a:b], head_first=False, gate_kind=gate, sm_scale=sm_scale)
            alone = np.asarray(alone, dtype=np.float64)[0]
            # ... and the independent f64 FoX of test_fox_matches_an_independent_reference.
            hf = lambda x: np.moveaxis(x[a:b], 0, 1)[None].astype(np.float64)  # noqa: E731
            log_f = -np.logaddexp(0.0, -hf(g)) if gate == "logits" else hf(g)
            ref = np.moveaxis(fox_f64(bf16(hf(q)), bf16(hf(k)), bf16(hf(v)), log_f, scale)[0], 0, 1)
            what = f"sequence {s} ({b - a} tokens)"
            assert np.abs(interp[a:b] - ref).max() <= 2.0**-7 * np.abs(ref).max(), what
            for mine, name in ((got[a:b], "packed"), (alone, "alone")):
                rel = np.linalg.norm(mine - ref) / np.linalg.norm(ref)
                assert rel <= 4e-3, f"{what}, {name}: rel L2 {rel:.3g}"
            rel = np.linalg.norm(got[a:b] - alone) / np.linalg.norm(alone)
            assert rel <= 4e-3, f"{what}: packed vs alone {rel:.3g}"
            if b - a == 1:  # one token attends to itself: its value, rounded to bf16
                np.testing.assert_allclose(got[a:b], bf16(v[a:b].astype(np.float64)), rtol=2.0**-7)
    ir = attn.ir()
    assert "pruned" in ir and "keys_from" in ir, ir


def test_packed_program_is_the_plain_one_with_first_keys():
    for head_first in (True, False):
        text = foxc.fox.program(head_first=head_first, packed=True)
        assert "first: i32[B, T]" in text and "select(j >= first[b, i]" in text, text
        plain = (
            text.replace("packed attention", "attention")
            .replace("_packed(", "(")
            .replace(", first: i32[B, T]", "")
            .replace("select(j >= first[b, i], s[b, h, i, j], -inf)", "s[b, h, i, j]")
        )
        assert plain == foxc.fox.program(head_first=head_first), text
    with pytest.raises(ValueError, match="packed"):
        foxc.fox.program(packed=True, fewer_queries=True)


def test_first_keys_of_cumulative_offsets():
    np.testing.assert_array_equal(foxc.fox.first_keys([0, 1, 4, 4, 6], 6), [0, 1, 1, 1, 4, 4])
    assert foxc.fox.first_keys(np.array([0, 3], np.int64), 3).dtype == np.int32


@pytest.mark.parametrize(
    "cu,match",
    [
        ([1, 5, 10], "start at 0"),
        ([0, 6, 4, 10], "must not decrease"),
        ([0, 5, 9], "end at the number of tokens 10"),
        ([0, 5, 11], "end at the number of tokens 10"),
        (np.array([0.0, 10.0]), "integers"),
        ([[0, 10]], "1-D"),
        ([0], "1-D"),
    ],
)
def test_bad_cu_seqlens_are_value_errors(cu, match):
    rng = np.random.default_rng()
    q, k, v, g, _ = packed_case(rng, [4, 6])
    with pytest.raises(ValueError, match=match):
        foxc.fox.attention(q, k, v, g, cu_seqlens=cu)


def test_packed_shapes_are_checked():
    rng = np.random.default_rng()
    q, k, v, g, cu = packed_case(rng, [4, 6])
    with pytest.raises(ValueError, match="no batch axis"):
        foxc.fox.attention(q[None], k[None], v[None], g[None], cu_seqlens=cu)
    with pytest.raises(ValueError, match="k has 9 tokens"):
        foxc.fox.attention(q, k[:9], v, g, cu_seqlens=cu)


def test_which_programs_the_torch_op_runs_as_an_attention():
    """`output_is_attention`: the torch path's choice between the attention op (its row
    log-sum-exp, a backward from the saved forward) and the plain program op (an epilogue or a
    layout copy after the attention, a backward that recomputes the forward)."""
    import pathlib

    fox = pathlib.Path(__file__).resolve().parents[2] / "examples" / "fox.attn"
    assert foxc.load(str(fox))._program.output_is_attention
    assert foxc.fox.load(head_first=True)._program.output_is_attention
    assert not foxc.fox.load(head_first=False)._program.output_is_attention
    gate = fox.read_text()
    gate = gate.replace("fgate: f32[B, H, T])", "fgate: f32[B, H, T], g: bf16[B, H, T, D])")
    gate = gate.replace("return out", "gated[b, h, i, d] = out[b, h, i, d] * sigmoid(g[b, h, i, d])\n    return gated")
    assert not foxc.load(gate)._program.output_is_attention
