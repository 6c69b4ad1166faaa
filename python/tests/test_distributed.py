"""Context parallelism on the CPU: the communication plan against a brute force over the
interpreter's kept set, the distributed threshold against the whole-sequence one, and the
context-parallel output against the single-device output (P simulated ranks, reference path).
Fresh random inputs; no GPU needed."""

import pathlib

import numpy as np
import pytest

import foxc
from foxc import distributed as cp

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
# Context-parallel vs one device, relative to the largest output entry (see the test).
TOL = 1e-4
# Every rule of foxc's table (docs/RULES.md): `local` and `tight-causal` read the tile's own and the
# causal prefix's statistics, which the distributed threshold reduces across ranks.
RULES = ["paper", "tight", "local", "tight-causal"]


def fox(rule="paper", out="bf16", tiles=(32, 32), example="fox.attn", log_eps=-10.0):
    text = (EXAMPLES / example).read_text()
    if out != "bf16":
        # Same kept set (the threshold reads q and k only); an f32 output makes the comparison
        # sharper than bf16 rounding.
        text = text.replace("-> bf16[B, H, T, D]", f"-> {out}[B, H, T, D]")
    return foxc.load(text, prune_rule=rule, tiles=tiles, log_eps=log_eps)


def workload(rng, B=1, H=4, T=512, D=16, Hk=None):
    """Random q, k, v and gate logits whose heads forget at different speeds (as the standard
    workload): ACP prunes some heads much and some not at all."""
    Hk = Hk or H
    q = rng.standard_normal((B, H, T, D)).astype(np.float32)
    k = rng.standard_normal((B, Hk, T, D)).astype(np.float32)
    v = rng.standard_normal((B, Hk, T, D)).astype(np.float32)
    a = 10.0 ** np.linspace(-3, 0, H)  # mean decay per token of each head
    logit = np.log(np.exp(-a) / (1 - np.exp(-a)))
    fgate = (logit.reshape(1, H, 1) + rng.standard_normal((B, H, T))).astype(np.float32)
    return q, k, v, fgate


def brute_force_needs(starts, bm, bn, P, kv_group=1):
    """Every kept (query i, key j) pair by the interpreter's definition K(i) = {j <= i} and
    {j >= start[i // bm] * bn}; rank i // L needs key tile j // bn when j is another rank's."""
    B, H, mt = starts.shape
    T = mt * bm
    L = T // P
    need = np.zeros((P, B, H // kv_group, T // bn), dtype=bool)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                r = i // L
                for j in range(starts[b, h, i // bm] * bn, i + 1):
                    if j // L != r:
                        need[r, b, h // kv_group, j // bn] = True
    return need


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("P", [2, 4, 8])
def test_plan_is_the_kept_set_of_each_rank(rule, P):
    rng = np.random.default_rng(100 + P)
    attn = fox(rule)
    q, k, v, fgate = workload(rng)
    # The CPU backend's block starts, and the interpreter's from its cumsum and threshold.
    starts, (bm, bn) = cp.block_starts(attn, q=q, k=k, v=v, fgate=fgate)
    ref = cp.boundary(attn, cp.decay_cumsum(attn, fgate=fgate), cp.threshold(attn, q, k))
    np.testing.assert_array_equal(starts, ref)
    # The case prunes something and keeps something (else the test could not tell).
    assert 0 < (starts > 0).mean() < 1, starts
    plan = cp.plan_from_starts(starts, bm, bn, P)
    need = brute_force_needs(starts, bm, bn, P)
    for r in range(P):
        np.testing.assert_array_equal(plan.needed(r), need[r], err_msg=f"rank {r}")
    assert plan.tiles_sent() == need.sum()
    b = plan.bytes(d=16)
    assert b["plan"] < b["causal"] < b["ring"]


def test_plan_unites_a_query_group_for_shared_kv_heads():
    rng = np.random.default_rng(7)
    attn = fox(example="fox_gqa.attn")
    q, k, v, fgate = workload(rng, H=4, Hk=2)
    names = dict(zip(attn.params, [q, k, v, fgate]))
    starts, (bm, bn) = cp.block_starts(attn, **names)
    plan = cp.plan_from_starts(starts, bm, bn, 4, kv_group=2)
    need = brute_force_needs(starts, bm, bn, 4, kv_group=2)
    for r in range(4):
        np.testing.assert_array_equal(plan.needed(r), need[r])


@pytest.mark.parametrize("example", ["fox_gqa.attn", "fox_softcap.attn", "fox_keybias.attn", "fox_qknorm.attn"])
def test_context_parallel_refuses_what_its_partial_cannot_compute(example):
    rng = np.random.default_rng(5)
    attn = fox(example=example)
    q, k, v, fgate = workload(rng, H=2, T=128)
    with pytest.raises(ValueError, match="plain FoX"):
        cp.rank_forward(attn, cp.ThreadExchange(1).rank_view(0), q, k, v, fgate)


def test_plan_refuses_chunks_of_partial_tiles():
    with pytest.raises(ValueError, match="whole"):
        cp.plan_from_starts(np.zeros((1, 1, 6), dtype=np.int32), 32, 32, 4)


@pytest.mark.parametrize("rule", RULES)
def test_local_thresholds_are_the_whole_sequence_threshold(rule):
    """Each rank's threshold from its own rows plus the shared maxima equals the program's
    threshold of those tiles on the whole sequence."""
    rng = np.random.default_rng(11)
    attn = fox(rule)
    q, k, v, fgate = workload(rng, T=256)
    whole = cp.threshold(attn, q, k)
    P = 4
    ex = cp.ThreadExchange(P)
    got = [None] * P

    def run(r):
        sl = slice(r * 64, (r + 1) * 64)
        got[r] = cp.local_threshold(attn, ex.rank_view(r), q[:, :, sl], k[:, :, sl], 256)

    import threading

    ts = [threading.Thread(target=run, args=(r,)) for r in range(P)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    np.testing.assert_array_equal(np.concatenate(got, axis=2), whole)


@pytest.mark.parametrize("rule,P", [("paper", 2), ("paper", 4), ("tight", 4), ("local", 4), ("tight-causal", 4), ("paper", 8)])
def test_context_parallel_output_is_the_single_device_output(rule, P):
    rng = np.random.default_rng(20 + P)
    # eps = e^-4: the first kept tiles carry up to 2% of a row, so a tile the plan forgot would
    # show far above the tolerance.
    attn = fox(rule, out="f32", log_eps=-4.0)
    q, k, v, fgate = workload(rng, H=3, T=256)
    out, lse, plan, sent = cp.simulate(attn, P, q, k, v, fgate)
    # One device: the whole sequence through the same pruned program (f64 interpreter).
    ref_out, ref_lse = cp.reference_with_lse(attn, q=q, k=k, v=v, fgate=fgate)
    # Tiles a rank did not receive hold POISON: a read of one would swamp its row.
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    # The partials read c as f32 (as every backend stores it); the single-device reference
    # keeps it in f64: |c| <= 400 here, so exponents differ by up to ~3e-5.
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=TOL * np.abs(ref_out).max())
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=TOL * np.abs(ref_lse).max())
    # The plan saved something here, and the exchange sent exactly the planned K/V tiles.
    assert 0 < plan.tiles_sent() < plan.bytes(d=16)["causal"] // (plan.bn * 16 * 4)
    assert sent["p2p"] == plan.tiles_sent() * plan.bn * 2 * 16 * 4


def test_a_tile_missing_from_the_plan_shows_in_the_output(monkeypatch):
    """The comparison above sees a plan that forgets one needed tile: the rank reads the
    tile's POISON instead of keys it keeps."""
    rng = np.random.default_rng(24)
    attn = fox(out="f32", log_eps=-4.0)
    q, k, v, fgate = workload(rng, H=3, T=256)
    ref_out, _ = cp.reference_with_lse(attn, q=q, k=k, v=v, fgate=fgate)
    real = cp.plan_from_starts

    def forgetful(starts, bm, bn, P, kv_group=1):
        plan = real(starts, bm, bn, P, kv_group)
        r = P - 1
        heads = np.argwhere(plan.first[r] < r * plan.tiles_per_rank)
        assert len(heads), "the last rank needs no remote tile: the test cannot tell"
        b, h = heads[0]
        plan.first[r, b, h] += 1
        return plan

    monkeypatch.setattr(cp, "plan_from_starts", forgetful)
    out, _, _, _ = cp.simulate(attn, 4, q, k, v, fgate)
    assert np.abs(out - ref_out).max() > 100 * TOL * np.abs(ref_out).max()


def test_the_own_chunk_program_is_the_partial_with_hi_at_the_row():
    """DIAG_SOURCE (causal mask, the start in the score) keeps exactly the keys of
    PARTIAL_SOURCE with ``hi[i] = i``: same output and lse on fresh inputs."""
    rng = np.random.default_rng()
    B, H, L, D = 1, 2, 96, 16
    q, k, v = (rng.standard_normal((B, H, L, D)) for _ in range(3))
    c = np.cumsum(-rng.uniform(0, 0.5, (B, H, L)), axis=2)
    lo = rng.integers(0, L, (B, H, L)).astype(np.float64)
    lo = np.minimum(lo, np.arange(L))  # at least the diagonal is kept
    diag = cp._run(cp._diag_program(), q, k, v, c, lo)
    part = cp._run(cp._partial_program(), q, k, v, c, c, lo, np.broadcast_to(np.arange(L, dtype=np.float64), (B, H, L)))
    np.testing.assert_allclose(diag[0], part[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(diag[1], part[1], rtol=0, atol=1e-12)
