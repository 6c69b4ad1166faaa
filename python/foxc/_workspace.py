"""Where a GPU plan's buffers live (pure Python, no torch): the caller's tensors ("input",
"output") or a place in one of two workspaces the caller allocates: "scratch" (any contents, per
launch) and "zeroed" (zero when the plan is launched: counters that the kernels leave zero; kept
per plan and stream, `KeptZeroed`)."""

from typing import Callable, Dict, List, Sequence, Tuple

# Buffers start at this alignment inside a workspace.
ALIGN = 256
# The caller's tensors must start at a multiple of this many bytes: the GPU kernels read q, k,
# v and a load map's x 16 bytes at a time (cp.async, tensor maps, vector loads).
TENSOR_ALIGN = 16
WORKSPACES = ("scratch", "zeroed")
TENSORS = ("input", "output")


def layout(roles: Sequence[Tuple[str, int]], sizes: Sequence[int]) -> Tuple[List[int], Dict[str, int]]:
    """Each buffer's byte offset in its workspace (0 for the caller's tensors) and each
    workspace's size in bytes. An unknown role is an error: a buffer the caller would not
    provide."""
    if len(roles) != len(sizes):
        raise ValueError(f"foxc: {len(roles)} buffer roles for {len(sizes)} sizes")
    offsets, totals = [], {w: 0 for w in WORKSPACES}
    for (role, _), size in zip(roles, sizes):
        if role in TENSORS:
            offsets.append(0)
        elif role in totals:
            offsets.append(totals[role])
            totals[role] += (size + ALIGN - 1) // ALIGN * ALIGN
        else:
            raise ValueError(f"foxc: unknown buffer role {role!r}")
    return offsets, totals


class KeptZeroed:
    """The "zeroed" workspace of each (plan, stream), kept for launches outside CUDA graph capture.

    The kernels leave their counters zero, so the first launch of a plan on a stream allocates
    it zeroed and every later launch of that plan on that stream reuses it: launches on one
    stream run in order, and two streams never share one. That saves an allocation and a memset
    per call, the pruned plan's extra host work (docs/history, run 20). A launch being
    captured into a CUDA graph must take a fresh one instead: the graph may be replayed on any
    stream, beside eager launches.
    """

    def __init__(self):
        # (id(plan), stream) -> (plan, buffer); the plan is held so that its id stays its own.
        self._kept: Dict[Tuple[int, int], Tuple[object, object]] = {}

    def get(self, plan, stream: int, nbytes: int, zeros: Callable[[int], object]):
        """The workspace of ``plan`` on ``stream``: ``zeros(nbytes)`` on first use."""
        key = (id(plan), stream)
        held = self._kept.get(key)
        if held is None:
            held = self._kept[key] = (plan, zeros(nbytes))
        return held[1]


def check_tensor_address(name: str, address: int) -> None:
    """A ValueError when a caller's tensor (an input ``name``) does not start at a multiple of
    ``TENSOR_ALIGN`` bytes: a contiguous view may start anywhere in its storage (``x[1:]``), and
    the GPU kernels' 16-byte loads would fault on it."""
    if address % TENSOR_ALIGN:
        raise ValueError(
            f"input `{name}` starts at device address {address:#x}, not a multiple of {TENSOR_ALIGN} bytes "
            f"(a view into another tensor's storage?): foxc's GPU kernels read it {TENSOR_ALIGN} bytes at "
            "a time; pass a copy (`.clone()`)"
        )
