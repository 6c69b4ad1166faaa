"""foxc.KVCache: a decode loop that evicts key blocks (docs/RULES.md, "Eviction") against the f64
interpreter of the whole sequence with nothing evicted or pruned, on the CPU backend; the
premises the cache checks; the refusals. No GPU needed."""

import math
import pathlib

import numpy as np
import pytest

import foxc

ROOT = pathlib.Path(__file__).resolve().parents[2]
PREFILL = ROOT / "bench" / "fox_prefill.attn"
FOX = ROOT / "examples" / "fox.attn"
# bench/fox_prefill.attn with an f32 output: its rounding (~1e-7) hides nothing of what eviction
# may change (a bf16 output's 2^-8 would hide errors far above eps).
PREFILL_F32 = PREFILL.read_text().replace("-> bf16[B, H, N, D]", "-> f32[B, H, N, D]")


def within_acp(got, ref, v, sources=2):
    """Each source of skipped keys (the cache's eviction, the kernel's own pruning) gives them
    less than eps of a row's weight, moving the output by at most 2 eps max|v|; plus f32."""
    bound = sources * 2 * math.exp(-10.0) * np.abs(v).max() + 1e-5 * np.abs(ref).max()
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"max error {err.max():.3g} > {bound:.3g} at {np.unravel_index(np.argmax(err), err.shape)}"


def bounded_rows(rng, shape, bound):
    """Random rows (last axis) of norm at most `bound`, most of them near it."""
    x = rng.standard_normal(shape)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    # Below the bound by more than bf16's rounding (the cache checks the rounded norm).
    return (x * bound * rng.uniform(0.5, 0.99, shape[:-1] + (1,))).astype(np.float32)


def sequence(rng, B, H, T, D, q_norm, k_norm):
    # Gate logits per head from strongly forgetting (log f = -3 per token) to slow (-0.08).
    bias = np.linspace(-3.0, 2.5, H).reshape(1, H, 1)
    return {
        "q": bounded_rows(rng, (B, H, T, D), q_norm),
        "k": bounded_rows(rng, (B, H, T, D), k_norm),
        "v": rng.standard_normal((B, H, T, D)).astype(np.float32),
        "fgate": (rng.standard_normal((B, H, T)) * 0.5 + bias).astype(np.float32),
    }


def decode(cache, x, T, chunk=1):
    """Feed `x` to `cache` `chunk` tokens at a time; the outputs of every row, and the keys held
    after each call."""
    outs, held = [], []
    for t in range(0, T, chunk):
        step = {n: a[:, :, t : t + chunk] for n, a in x.items()}
        outs.append(cache(**step))
        held.append(cache.length)
    return np.concatenate(outs, axis=2), held


def test_an_evicting_decode_stays_within_the_acp_bound_of_the_dense_reference():
    attn = foxc.load(PREFILL_F32)
    assert "pruned" in attn.ir()
    rng = np.random.default_rng()
    B, H, T, D = 2, 4, 512, 16
    q_norm, k_norm = 3.0, 3.0
    x = sequence(rng, B, H, T, D, q_norm, k_norm)
    cache = foxc.KVCache(attn, max_keys=T, q_norm=q_norm, k_norm=k_norm, every=16)
    got, held = decode(cache, x, T)
    # Row t of the dense f64 run of the whole sequence (N = M = T: every row causal) is decode
    # step t with every key kept.
    within_acp(got, foxc.reference(attn, **x), x["v"])
    # It evicted. The dense cache drops what every head can drop (the slowest head sets its
    # length); each head's own window is what a paged cache would hold.
    assert cache.dropped > 0 and cache.length < T, (cache.dropped, cache.length)
    per_head = cache.held_per_head()
    assert per_head.shape == (B, H) and (per_head >= 1).all() and (per_head <= cache.length).all()
    assert foxc.evictable(cache).shape == (B, H)
    # The slowest head (log f ~ -0.09 per token) needs ~230 tokens for the horizon's threshold
    # -10 - ln 512 - 2 * 3 * 3 / 4 = -20.7; then a partial block and `every` tokens of slack.
    assert max(held) <= 300 + 2 * cache.block + cache.every < T, max(held)


def test_a_chunked_prefill_then_decode_evicts_the_same_way():
    """The premise holds for any mix of call sizes: a 64-token prefill then single steps."""
    attn = foxc.load(PREFILL_F32)
    rng = np.random.default_rng()
    B, H, T, D = 1, 2, 192, 8
    x = sequence(rng, B, H, T, D, 2.0, 2.0)
    x["fgate"][:] = -2.0  # every head forgets fast
    cache = foxc.KVCache(attn, max_keys=T, q_norm=2.0, k_norm=2.0)
    first = cache(**{n: a[:, :, :64] for n, a in x.items()})
    rest, _ = decode(cache, {n: a[:, :, 64:] for n, a in x.items()}, T - 64)
    within_acp(np.concatenate([first, rest], axis=2), foxc.reference(attn, **x), x["v"])
    # log f = -2.13 per token, delta = -10 - ln 192 - 2 * 2 * 2 / sqrt(8) = -18.1: about 9
    # tokens matter, plus the partial block and `every`.
    assert cache.length <= 9 + 2 * cache.block + cache.evict_every(), cache.length


CACHE_F32 = (ROOT / "examples" / "fox_cache.attn").read_text().replace("-> bf16[B, H, N, D]", "-> f32[B, H, N, D]")


def log_sigmoid(z):
    return -np.logaddexp(0.0, -z.astype(np.float64))


def test_a_cache_keeping_the_decay_cumsum_decodes_as_the_one_keeping_the_gates():
    """examples/fox_cache.attn takes c, declared nonincreasing along the keys, instead of the
    gates: the cache appends c (each step continues the cumsum from the last key held), evicts
    as the gate program's cache does, and both stay within ACP's bound of the dense reference."""
    gates, cumsum = foxc.load(PREFILL_F32), foxc.load(CACHE_F32)
    assert "pruned" in cumsum.ir()
    rng = np.random.default_rng()
    B, H, T, D = 2, 4, 384, 16
    x = sequence(rng, B, H, T, D, 3.0, 3.0)
    c = np.cumsum(log_sigmoid(x["fgate"]), axis=-1).astype(np.float32)
    by_c = {"q": x["q"], "k": x["k"], "v": x["v"], "c": c}
    a = foxc.KVCache(gates, max_keys=T, q_norm=3.0, k_norm=3.0, every=16)
    b = foxc.KVCache(cumsum, max_keys=T, q_norm=3.0, k_norm=3.0, every=16)
    assert set(b.cached) == {"k", "v", "c"}
    got_a, held_a = decode(a, x, T)
    got_b, held_b = decode(b, by_c, T)
    ref = foxc.reference(gates, **x)
    within_acp(got_a, ref, x["v"])
    within_acp(got_b, ref, x["v"])
    # Eviction decides on the same decay (the gates' cumsum in f64, or c rounded to f32): the
    # same keys held, up to a block where the rounding moves a boundary.
    assert b.dropped > 0 and all(abs(p - q) <= b.block for p, q in zip(held_a, held_b)), (held_a[-5:], held_b[-5:])
    # The declaration is checked: a c that grows along the keys is refused before any run.
    bad = dict(by_c, c=-c)
    with pytest.raises(ValueError, match="declared nonincreasing along M"):
        cumsum(**{n: t[:, :, :8] if n != "q" else t[:, :, 7:8] for n, t in bad.items()})


def test_without_eviction_the_cache_keeps_everything():
    attn = foxc.load(PREFILL_F32)
    rng = np.random.default_rng()
    x = sequence(rng, 1, 2, 80, 8, 2.0, 2.0)
    cache = foxc.KVCache(attn, max_keys=1, evict=False)  # max_keys binds only eviction
    got, held = decode(cache, x, 80)
    assert held == list(range(1, 81)) and cache.dropped == 0
    within_acp(got, foxc.reference(attn, **x), x["v"], sources=1)
    with pytest.raises(ValueError, match="does not evict"):
        foxc.evictable(cache)


def test_the_premises_are_checked():
    attn = foxc.load(PREFILL)
    rng = np.random.default_rng()
    x = sequence(rng, 1, 2, 8, 8, 2.0, 2.0)
    with pytest.raises(ValueError, match="give q_norm and k_norm"):
        foxc.KVCache(attn, max_keys=64)
    # A key longer than the stated bound: refused before it enters the cache.
    cache = foxc.KVCache(attn, max_keys=64, q_norm=2.0, k_norm=1.0)
    with pytest.raises(ValueError, match="norm .* > k_norm = 1"):
        cache(**x)
    assert cache.length == 0
    cache = foxc.KVCache(attn, max_keys=64, q_norm=1.0, k_norm=2.0)
    with pytest.raises(ValueError, match="> q_norm = 1"):
        cache(**x)
    # Past max_keys the guarantee lapses: refused.
    cache = foxc.KVCache(attn, max_keys=5, q_norm=2.0, k_norm=2.0)
    with pytest.raises(ValueError, match="exceed max_keys = 5"):
        cache(**x)
    with pytest.raises(ValueError, match="missing"):
        cache.append(k=x["k"])


def test_the_cache_runs_its_checked_norms_as_the_threshold_bound():
    """With both norms checked, the attention the cache runs bounds the score by them (no pass
    over the keys' norms per call) and still prunes within ACP's bound of the dense reference."""
    attn = foxc.load(PREFILL_F32)
    assert "bound = data" in attn.ir()
    cache = foxc.KVCache(attn, max_keys=256, q_norm=1.5, k_norm=2.5)
    ir = cache._run.ir()
    assert "bound = static(q_max = 1.5, k_max = 2.5)" in ir, ir
    assert "bound = static" in cache._run.ir("opt", "sm_90a")
    rng = np.random.default_rng()
    x = sequence(rng, 1, 3, 256, 8, 1.5, 2.5)
    got, _ = decode(cache, x, 256, chunk=64)
    within_acp(got, foxc.reference(attn, **x), x["v"])
    # A program whose threshold reads the data's norms keeps doing so without the cache.
    assert foxc.load(PREFILL_F32) is attn


def test_eviction_decisions_come_once_a_block_or_a_sixteenth_of_the_window():
    """A decision reads the whole window: by default one comes per key block until 16 blocks are
    held, then per sixteenth of the keys held (a constant cost per token); `every` overrides."""
    attn = foxc.load(PREFILL_F32)
    rng = np.random.default_rng()
    x = sequence(rng, 1, 2, 3000, 8, 2.0, 2.0)
    x["fgate"][:] = 6.0  # gates near 1: nothing is evicted, the window only grows
    cache = foxc.KVCache(attn, max_keys=4096, q_norm=2.0, k_norm=2.0)
    calls = []
    evict = cache.evict
    cache.evict = lambda: calls.append(cache.length) or evict()
    decode(cache, {n: a[:, :, :2048] for n, a in x.items()}, 2048, chunk=16)
    assert cache.dropped == 0
    bn = cache.block
    gaps = np.diff([0] + calls)
    assert all(g == bn for g, at in zip(gaps, calls) if at <= 16 * bn), calls
    # The decision comes with the first 16-token call that reaches the schedule's gap.
    assert all(max(bn, at // 16) <= g < max(bn, at // 16) + 16 for g, at in zip(gaps, calls)), calls
    assert len(calls) < 2048 // bn, calls
    fixed = foxc.KVCache(attn, max_keys=4096, q_norm=2.0, k_norm=2.0, every=32)
    assert fixed.evict_every() == 32


def test_programs_without_a_decode_shape_or_pruning_are_refused():
    with pytest.raises(ValueError, match="same query and key axis"):
        foxc.KVCache(foxc.load(FOX), max_keys=64, q_norm=1.0, k_norm=1.0)
    with pytest.raises(ValueError, match="not pruned"):
        foxc.KVCache(foxc.load(PREFILL, no_prune=True), max_keys=64, q_norm=1.0, k_norm=1.0)


# bench/fox_prefill.attn with an output gate, as FoX "Pro" models have: `g` is a per-query tensor
# (N rows, not cached), which the cache passes to each call as it passes q.
PREFILL_GATED_F32 = (
    PREFILL_F32.replace("fgate: f32[B, H, M])", "fgate: f32[B, H, M], g: f32[B, H, N, D])")
    .replace("* v[b, h, j, d])\n", "* v[b, h, j, d]) * sigmoid(g[b, h, i, d])\n")
)


def test_an_output_gated_decode_passes_the_gate_per_step_and_stays_within_the_acp_bound():
    attn = foxc.load(PREFILL_GATED_F32)
    assert "sigmoid" in attn.ir() and "pruned" in attn.ir()
    rng = np.random.default_rng()
    B, H, T, D = 1, 3, 320, 16
    x = sequence(rng, B, H, T, D, 3.0, 3.0)
    x["g"] = (rng.standard_normal((B, H, T, D)) * 2.0).astype(np.float32)
    cache = foxc.KVCache(attn, max_keys=T, q_norm=3.0, k_norm=3.0, every=16)
    assert set(cache.cached) == {"k", "v", "fgate"}
    got, held = decode(cache, x, T)
    ref = foxc.reference(attn, **x)
    within_acp(got, ref, x["v"])
    assert cache.dropped > 0 and max(held) < T, held[-3:]
    # The gate is applied: without it the outputs differ by far more than the bound.
    plain = foxc.reference(foxc.load(PREFILL_F32), **{n: a for n, a in x.items() if n != "g"})
    assert np.abs(got - plain).max() > 0.1
