"""Helpers over NumPy arrays and torch tensors alike (the cache and the context-parallel code
take either): what kind an array is, its size, concatenation and contiguous views. torch is
imported only when a torch tensor is given."""

from __future__ import annotations

import numpy as np


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch)."""
    return type(x).__module__.split(".")[0] == "torch"


def nbytes(x) -> int:
    return x.numel() * x.element_size() if is_torch(x) else x.nbytes


def cat(xs, axis: int):
    """Concatenate arrays of one kind along ``axis``."""
    if is_torch(xs[0]):
        import torch

        return torch.cat(xs, dim=axis)
    return np.concatenate(xs, axis=axis)


def contiguous(x):
    return x.contiguous() if is_torch(x) else np.ascontiguousarray(x)


def swap_axes(x, a: int, b: int):
    """``x`` with axes ``a`` and ``b`` swapped, contiguous (a torch tensor's stays differentiable)."""
    return x.transpose(a, b).contiguous() if is_torch(x) else np.ascontiguousarray(np.swapaxes(x, a, b))
