"""The NumPy path: arrays go to the extension as (dtype, shape, bytes) and run on the CPU
backend (or the reference interpreter); results come back as NumPy arrays."""

from __future__ import annotations

import numpy as np


def _bf16_dtype():
    try:
        import ml_dtypes  # optional

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None


def _wire(name: str, a) -> tuple:
    if not isinstance(a, np.ndarray):
        raise ValueError(
            f"input `{name}` is a {type(a).__module__}.{type(a).__name__}: pass NumPy arrays "
            "(CPU backend) or torch CUDA tensors (GPU)"
        )
    bf16 = _bf16_dtype()
    if a.dtype == np.float32:
        dtype = "f32"
    elif bf16 is not None and a.dtype == bf16:
        dtype = "bf16"
    elif a.dtype == np.float16:
        dtype = "f16"
    elif a.dtype == np.int32:
        dtype = "i32"
    elif a.dtype == np.int64:
        dtype = "i64"
    else:
        raise ValueError(
            f"input `{name}` has dtype {a.dtype}: foxc takes float32, float16 (or ml_dtypes.bfloat16) arrays, "
            "and int32 or int64 for integer parameters"
        )
    # Little-endian row-major bytes (a copy only when the array is not already that).
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return (dtype, list(a.shape), a.tobytes())


def _wires(tensors: dict) -> dict:
    return {name: _wire(name, a) for name, a in tensors.items()}


def run(program, tensors: dict) -> np.ndarray:
    shape, data = program.run_cpu(_wires(tensors))
    return np.frombuffer(data, dtype="<f4").reshape(shape).copy()


def reference(program, tensors: dict, pruned: bool) -> np.ndarray:
    shape, data = program.reference(_wires(tensors), pruned)
    return np.frombuffer(data, dtype="<f8").reshape(shape).copy()


def _with_dout(tensors: dict, dout) -> dict:
    return {**_wires(tensors), "dout": _wire("dout", dout)}


def grad(program, tensors: dict, dout) -> dict:
    r = program.grad_cpu(_with_dout(tensors, dout))
    return {n: np.frombuffer(d, dtype="<f4").reshape(s).copy() for n, (s, d) in r.items()}


def grad_reference(program, tensors: dict, dout) -> dict:
    r = program.grad_reference(_with_dout(tensors, dout))
    return {n: np.frombuffer(d, dtype="<f8").reshape(s).copy() for n, (s, d) in r.items()}
