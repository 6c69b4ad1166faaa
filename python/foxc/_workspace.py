"""Where a GPU plan's buffers live (pure Python, no torch): the caller's tensors ("input",
"output") or a place in one of two workspaces the caller allocates per launch: "scratch" (any
contents) and "zeroed" (zero when the plan is launched: counters that the kernels leave zero)."""

from typing import Dict, List, Sequence, Tuple

# Buffers start at this alignment inside a workspace.
ALIGN = 256
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
