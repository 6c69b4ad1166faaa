"""The GPU plan's workspace layout (foxc._workspace): pure Python, runs without torch or a GPU."""

import pytest

from foxc import _workspace


def test_buffers_take_aligned_places_in_their_own_workspace():
    roles = [
        ("input", 0),
        ("scratch", 0),
        ("zeroed", 0),
        ("output", 0),
        ("scratch", 0),
        ("zeroed", 0),
        ("input", 1),
    ]
    sizes = [1000, 10, 4, 500, 300, 64, 7]
    offsets, totals = _workspace.layout(roles, sizes)
    # The caller's tensors take no workspace; each workspace packs its own buffers, 256-aligned.
    assert offsets == [0, 0, 0, 0, 256, 256, 0]
    assert totals == {"scratch": 256 + 512, "zeroed": 256 + 256}


def test_a_plan_without_counters_needs_no_zeroed_workspace():
    _, totals = _workspace.layout([("input", 0), ("scratch", 0), ("output", 0)], [8, 8, 8])
    assert totals == {"scratch": 256, "zeroed": 0}


def test_an_unknown_role_is_an_error():
    with pytest.raises(ValueError, match="unknown buffer role 'counter'"):
        _workspace.layout([("input", 0), ("counter", 0)], [8, 8])


def test_roles_and_sizes_pair_up():
    with pytest.raises(ValueError, match="2 buffer roles for 1 sizes"):
        _workspace.layout([("input", 0), ("scratch", 0)], [8])


def test_a_zeroed_workspace_is_kept_per_plan_and_stream():
    made = []

    def zeros(n):
        made.append(n)
        return bytearray(n)

    kept = _workspace.KeptZeroed()
    plan_a, plan_b = object(), object()
    first = kept.get(plan_a, 7, 512, zeros)
    # Later launches of the same plan on the same stream reuse it (the kernels leave it zero).
    assert kept.get(plan_a, 7, 512, zeros) is first
    # Another stream or another plan never shares it.
    assert kept.get(plan_a, 8, 512, zeros) is not first
    assert kept.get(plan_b, 7, 256, zeros) is not first
    assert made == [512, 512, 256]


def test_a_tensor_off_a_16_byte_boundary_is_refused_by_name():
    # A contiguous view may start anywhere in its storage: `buf[1:]` of a float32 buffer is 4
    # bytes past a boundary. The GPU kernels read their operands 16 bytes at a time.
    _workspace.check_tensor_address("cos", 0x7F00_0000_0100)
    with pytest.raises(ValueError, match=r"input `cos` starts at device address 0x7f0000000104, not a multiple of 16 bytes"):
        _workspace.check_tensor_address("cos", 0x7F00_0000_0104)
