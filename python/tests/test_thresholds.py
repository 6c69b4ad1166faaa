"""``foxc.load(..., thresholds=[d_0, ..., d_{H-1}])``: per-head thresholds given by the user
(docs/RULES.md, "Given thresholds"), on the CPU backend against the f64 interpreter; the kept
tiles they give (tighter keeps fewer, -inf keeps all); the errors; the load cache; eviction's
refusal. No GPU needed."""

import math
import pathlib

import numpy as np
import pytest

import foxc
import foxc.distributed

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOX = ROOT / "examples" / "fox.attn"
PREFILL = ROOT / "bench" / "fox_prefill.attn"
INF = math.inf


def inputs(rng, H=2, T=384, D=16):
    return {
        "q": (rng.standard_normal((1, H, T, D)) * 1.5).astype(np.float32),
        "k": (rng.standard_normal((1, H, T, D)) * 1.5).astype(np.float32),
        "v": rng.standard_normal((1, H, T, D)).astype(np.float32),
        # Gate logits from fast forgetting to slow, per head.
        "fgate": (rng.standard_normal((1, H, T)) + np.linspace(-2.0, 3.0, H).reshape(1, H, 1)).astype(np.float32),
    }


def kept(attn, x):
    """Kept key tiles per head (the CPU kernels' own block starts; square tiles)."""
    starts, (bm, bn) = foxc.distributed.block_starts(attn, **x)
    assert bm == bn
    m = np.arange(starts.shape[-1])
    return (m + 1 - starts).sum(axis=(0, 2))


def test_given_thresholds_run_on_the_cpu_as_the_interpreter_does():
    rng = np.random.default_rng()
    x = inputs(rng, H=3)
    attn = foxc.load(FOX, thresholds=[-1.0, -INF, -4.0], tiles=(32, 32))
    assert attn.options[2] == "given"
    assert "rule = given[-1, -inf, -4]" in attn.ir("opt")
    out = np.asarray(attn(**x), dtype=np.float64)
    ref = np.asarray(foxc.reference(attn, pruned=True, **x), dtype=np.float64)
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel <= 1e-3, rel
    assert np.abs(out - ref).max() <= 1e-2 * np.abs(ref).max()
    # The -inf head is not pruned at all: it equals the dense program there.
    dense = np.asarray(foxc.reference(attn, pruned=False, **x), dtype=np.float64)
    np.testing.assert_array_equal(ref[:, 1], dense[:, 1])
    assert np.abs(ref[:, 0] - dense[:, 0]).max() > 0, "a threshold of -1 prunes nothing"


def test_tighter_thresholds_keep_fewer_tiles_and_minus_inf_keeps_all():
    rng = np.random.default_rng()
    x = inputs(rng, H=2)
    mt = 384 // 32
    everything = mt * (mt + 1) // 2
    got = {}
    for d in [-INF, -20.0, -3.0, -0.5]:
        got[d] = kept(foxc.load(FOX, thresholds=[d, d], tiles=(32, 32)), x)
    assert (got[-INF] == everything).all(), got[-INF]
    assert (got[-0.5] <= got[-3.0]).all() and (got[-3.0] <= got[-20.0]).all(), got
    assert got[-0.5].sum() < got[-3.0].sum() < got[-20.0].sum() <= got[-INF].sum(), got
    # Each head its own: [-0.5, -inf] keeps head 0 as -0.5 does and all of head 1.
    mixed = kept(foxc.load(FOX, thresholds=[-0.5, -INF], tiles=(32, 32)), x)
    assert list(mixed) == [got[-0.5][0], everything], mixed


def test_bad_thresholds_are_value_errors():
    for bad, what in [([float("nan")], "NaN"), ([-1.0, 0.5], "0.5"), ([INF], "inf"), ([], "at least one")]:
        with pytest.raises(ValueError, match="threshold") as e:
            foxc.load(FOX, thresholds=bad)
        assert what in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="numbers"):
        foxc.load(FOX, thresholds=["x"])
    # Any rule named beside them, the default's name too: the thresholds replace the rule.
    for rule in ("tight", "paper"):
        with pytest.raises(ValueError, match="prune_rule"):
            foxc.load(FOX, thresholds=[-1.0, -2.0], prune_rule=rule)


def test_another_head_count_is_refused():
    rng = np.random.default_rng()
    attn = foxc.load(FOX, thresholds=[-1.0, -2.0])
    x = inputs(rng, H=3, T=64)
    with pytest.raises(ValueError, match=r"2 per-head thresholds.*H = 3"):
        attn(**x)
    with pytest.raises(ValueError, match=r"2 per-head thresholds"):
        foxc.reference(attn, pruned=True, **x)
    with pytest.raises(ValueError, match=r"2 per-head thresholds"):
        attn.grad(np.ones((1, 3, 64, 16), np.float32), **x)
    attn(**inputs(rng, H=2, T=64))  # the right count runs


def test_each_table_is_its_own_program():
    a = foxc.load(FOX, thresholds=[-1.0, -2.0])
    assert foxc.load(FOX, thresholds=[-1.0, -2.0]) is a
    assert foxc.load(FOX, thresholds=[-1.0, -3.0]) is not a
    assert foxc.load(FOX) is not a


def test_gradients_run_with_given_thresholds():
    rng = np.random.default_rng()
    x = inputs(rng, H=2, T=128)
    attn = foxc.load(FOX, thresholds=[-1.0, -INF], tiles=(32, 32))
    dout = rng.standard_normal((1, 2, 128, 16)).astype(np.float32)
    got = attn.grad(dout, **x)
    want = foxc.reference_grad(attn, dout, **x)
    for name in ["out", "grad_q", "grad_k", "grad_v", "grad_fgate"]:
        g, w = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
        assert np.linalg.norm(g - w) <= 5e-3 * np.linalg.norm(w), name


def test_eviction_refuses_given_thresholds():
    attn = foxc.load(PREFILL, thresholds=[-1.0, -2.0])
    with pytest.raises(ValueError, match="given per head"):
        foxc.KVCache(attn, max_keys=64, q_norm=1.0, k_norm=1.0)
    foxc.KVCache(attn, max_keys=64, evict=False)  # keeping every key needs no bound
