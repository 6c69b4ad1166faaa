"""Every test that draws random inputs with ``np.random.default_rng()`` gets a fresh seed it
prints (pytest shows it beside a failure), and ``FOXC_SEED=<seed>`` replays that seed. The k-th
unseeded call in a test gets ``seed + k``, so two generators in one test stay independent."""

import os
import secrets

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _printed_seed(monkeypatch, request):
    seed = int(os.environ.get("FOXC_SEED") or secrets.randbits(62))
    made = [0]
    unseeded = np.random.default_rng

    def default_rng(s=None):
        if s is not None:
            return unseeded(s)
        made[0] += 1
        return unseeded(seed + made[0] - 1)

    monkeypatch.setattr(np.random, "default_rng", default_rng)
    print(f"{request.node.nodeid}: seed {seed} (FOXC_SEED={seed} replays it)")
