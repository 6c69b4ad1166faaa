"""Context-parallel attention over torch.distributed (gloo, CPU processes on the loopback):
the same rank code as the threaded simulation, with the real collectives and point-to-point
sends. Skipped where torch is not installed (CI installs no torch)."""

import os
import pathlib
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs(seed, H=3, T=256, D=16):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, H, T, D)).astype(np.float32) for _ in range(3))
    a = 10.0 ** np.linspace(-3, 0, H)
    fgate = (np.log(np.exp(-a) / (1 - np.exp(-a))).reshape(1, H, 1) + rng.standard_normal((1, H, T))).astype(np.float32)
    return q, k, v, fgate


def _program():
    import foxc

    text = (EXAMPLES / "fox.attn").read_text().replace("-> bf16[B, H, T, D]", "-> f32[B, H, T, D]")
    return foxc.load(text, tiles=(32, 32), log_eps=-4.0)


def _rank(rank, world, port, seed, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from foxc import distributed as cp

        q, k, v, fgate = _inputs(seed)
        L = q.shape[2] // world
        sl = slice(rank * L, (rank + 1) * L)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a[:, :, sl]))  # noqa: E731
        out, lse, plan = cp.rank_forward(_program(), cp.TorchExchange(), t(q), t(k), t(v), t(fgate))
        np.save(os.path.join(out_dir, f"out{rank}.npy"), np.asarray(out))
        np.save(os.path.join(out_dir, f"lse{rank}.npy"), np.asarray(lse))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_give_the_single_device_output(world, tmp_path):
    import torch.multiprocessing as mp

    from foxc import distributed as cp

    seed = 40 + world
    mp.spawn(_rank, args=(world, _free_port(), seed, str(tmp_path)), nprocs=world, join=True)
    out = np.concatenate([np.load(tmp_path / f"out{r}.npy") for r in range(world)], axis=2)
    lse = np.concatenate([np.load(tmp_path / f"lse{r}.npy") for r in range(world)], axis=2)
    q, k, v, fgate = _inputs(seed)
    ref_out, ref_lse = cp.reference_with_lse(_program(), q=q, k=k, v=v, fgate=fgate)
    assert np.isfinite(out).all()
    # As in test_distributed.py: the partials read c as f32, the reference keeps it in f64.
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-4 * np.abs(ref_out).max())
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-4 * np.abs(ref_lse).max())


def test_simulated_ranks_take_torch_tensors():
    """``simulate`` on torch tensors (the one-GPU simulation's path: all-gathers by torch.cat,
    point-to-point buffers cloned, byte counts of torch tensors) equals the NumPy run; on CPU
    tensors the partials run on the reference interpreter, so only the exchange differs."""
    from foxc import distributed as cp

    q, k, v, fgate = _inputs(50)
    attn = _program()
    want = cp.simulate(attn, 4, q, k, v, fgate)
    t = lambda a: torch.from_numpy(a)  # noqa: E731
    got = cp.simulate(attn, 4, t(q), t(k), t(v), t(fgate))
    np.testing.assert_array_equal(np.asarray(got[0]), want[0])
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])
    # f32 tensors against the f32 arrays: the same bytes moved.
    assert got[3] == want[3]
