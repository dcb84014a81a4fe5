"""Permanent buffers: zeroed, C-contiguous and 64-byte aligned, as TVM's compiled kernels
assume (they do not check it; a misaligned array faults in aligned vector loads)."""

from __future__ import annotations

import numpy as np

from sandwich.compiler.gemm_runner import aligned_empty


def aligned_zeros(shape: int | tuple[int, ...], dtype=np.float32, align: int = 64) -> np.ndarray:
    """np.zeros (calloc: large buffers are mapped lazily, untouched pages cost nothing),
    shifted to an `align`-byte boundary."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off: off + nbytes].view(dtype).reshape(shape)


def aligned_copy(x: np.ndarray, dtype=np.float32) -> np.ndarray:
    """A writable aligned copy (e.g. of a read-only view into a mapped checkpoint)."""
    out = aligned_empty(x.shape, dtype)
    out[...] = x
    return out
