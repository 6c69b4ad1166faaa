"""Queries shorter than keys through the NumPy path (CPU backend): a prefill against a KV cache
and decode steps, fused and pruned (docs/SEMANTICS.md, attention: queries sit at the end of the
keys), against the f64 interpreter of the program as written; and a decode loop against one
square run of the whole sequence. No GPU needed."""

import math
import pathlib

import numpy as np

import foxc

ROOT = pathlib.Path(__file__).resolve().parents[2]
PREFILL = ROOT / "bench" / "fox_prefill.attn"
FOX = ROOT / "examples" / "fox.attn"


def rel_l2(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def tensors(rng, B, H, N, M, D):
    """q for N query rows, k, v and gate logits for M keys; heads forget at different rates."""
    return {
        "q": (rng.standard_normal((B, H, N, D)) * 1.5).astype(np.float32),
        "k": (rng.standard_normal((B, H, M, D)) * 1.5).astype(np.float32),
        "v": rng.standard_normal((B, H, M, D)).astype(np.float32),
        "fgate": (rng.standard_normal((B, H, M)) + np.linspace(-3.0, 4.0, H).reshape(1, H, 1)).astype(
            np.float32
        ),
    }


def test_prefill_and_decode_match_the_interpreter():
    attn = foxc.load(PREFILL)
    ir = attn.ir()
    assert "= attention {" in ir and "pruned" in ir and "softmax" not in ir
    rng = np.random.default_rng()
    for N, M in [(40, 300), (1, 257)]:
        x = tensors(rng, 1, 4, N, M, 16)
        out = attn(**x)
        assert out.shape == (1, 4, N, 16) and np.isfinite(out).all()
        ref = foxc.reference(attn, **x)
        # The pruned output against the dense reference: within the ACP bound (2 eps max|v|)
        # plus one bf16 ulp (2^-7 relative at most: the two round to neighbours at worst).
        bound = 2 * math.exp(-10.0) * np.abs(x["v"]).max()
        step = np.maximum(np.abs(out), np.abs(ref)) * 2.0**-7
        assert (np.abs(out - ref) <= bound + step).all(), (N, M)
        assert rel_l2(out, foxc.reference(attn, pruned=True, **x)) <= 1e-3


def test_decode_steps_equal_the_square_run():
    """Every row of one square run of the whole sequence is a decode step: query t against the
    first t + 1 keys (dense, so both keep every key)."""
    square = foxc.load(FOX, no_prune=True)
    step = foxc.load(PREFILL, no_prune=True)
    rng = np.random.default_rng()
    T = 150
    x = tensors(rng, 1, 2, T, T, 16)
    whole = square(**x)
    for t in [0, 1, 63, 64, 100, T - 1]:
        y = step(
            q=x["q"][:, :, t : t + 1],
            k=x["k"][:, :, : t + 1],
            v=x["v"][:, :, : t + 1],
            fgate=x["fgate"][:, :, : t + 1],
        )
        # f32 sums in the same key order; both round to the bf16 output.
        row = whole[:, :, t : t + 1]
        assert np.abs(y - row).max() <= 2.0**-7 * np.abs(row).max(), t
        assert rel_l2(y, row) <= 1e-3, t


def test_the_inference_example_decodes_like_one_whole_run():
    """examples/infer_fox.py: prefill, a decode loop against the growing cache, and one run of the
    whole sequence agree (logits within bf16 rounding through the layers and the pruning bound)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("infer_fox", ROOT / "examples" / "infer_fox.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seed = int(np.random.default_rng().integers(1 << 30))
    # dict caches, then foxc.KVCache with bounds from the weights; each keeping the gates, then
    # the decay cumsum (examples/fox_cache.attn).
    for evict, keep_cumsum in ((False, False), (True, False), (False, True), (True, True)):
        diff, scale, same = mod.main(
            prompt=40, new=8, layers=2, seed=seed, quiet=True, evict=evict, keep_cumsum=keep_cumsum
        )
        assert diff <= 1e-2 * scale, (diff, scale, seed, evict, keep_cumsum)
        assert same >= 6, (same, seed, evict, keep_cumsum)
