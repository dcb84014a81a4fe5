"""TVM tensors over numpy arrays, for callers that run compiled kernels on their own data."""

from __future__ import annotations

import numpy as np


def tensor_copy(a: np.ndarray):
    """A TVM CPU tensor holding a copy of `a` (TVM owns and aligns its memory)."""
    import tvm

    return tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu())


def tensor_over(a: np.ndarray):
    """Zero-copy when `a` is 64-byte aligned (TVM's from_dlpack insists), a copy otherwise."""
    import tvm

    if a.ctypes.data % 64 == 0:
        return tvm.runtime.from_dlpack(a)
    return tensor_copy(a)


def tvm_version() -> str:
    import tvm

    return tvm.__version__
