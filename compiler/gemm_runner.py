"""Pack weights for the GEMM template and call a compiled kernel on numpy arrays, zero-copy."""

from __future__ import annotations

import numpy as np

from sandwich.compiler.gemm_template import slice_args
from sandwich.errors import ShapeError
from sandwich.types import KernelSchedule


def pack_weights(w: np.ndarray, pack_n: int) -> np.ndarray:
    """W[K, N] -> Wp[N / pack_n, K, pack_n], 64-byte aligned; done once at load time."""
    if w.ndim != 2:
        raise ShapeError(f"weights must be 2-D (K, N), got shape {w.shape}")
    k, n = w.shape
    if n % pack_n:
        raise ShapeError(f"weight N={n} is not a multiple of the packed width {pack_n}")
    packed = aligned_empty((n // pack_n, k, pack_n))
    packed[...] = w.astype(np.float32, copy=False).reshape(k, n // pack_n, pack_n).transpose(1, 0, 2)
    return packed


def aligned_empty(shape: tuple[int, ...], dtype=np.float32, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `align`-byte boundary."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off: off + nbytes].view(dtype).reshape(shape)


def check_activation(a: np.ndarray, k: int) -> np.ndarray:
    """Validate A[M, K] float32 and return it C-contiguous and writable, as TVM wraps it (a
    copy only if the caller gave a strided view or a read-only array)."""
    if not isinstance(a, np.ndarray) or a.ndim != 2 or a.shape[1] != k or a.shape[0] < 1:
        shape = getattr(a, "shape", type(a).__name__)
        raise ShapeError(f"activation must have shape (M, {k}) with M >= 1, got {shape}")
    if a.dtype != np.float32:
        raise ShapeError(f"activation must be float32, got {a.dtype}")
    if not a.flags.writeable:  # np.frombuffer, read-only memmaps: DLPack refuses them
        return np.array(a, order="C")
    return np.ascontiguousarray(a)


def call_gemm(func, a: np.ndarray, wp: np.ndarray, out: np.ndarray, schedule: KernelSchedule,
              workspace: np.ndarray | None = None) -> np.ndarray:
    """Run C = A @ W through a compiled kernel with the schedule's slice, wrapping numpy
    buffers without copies. Split-K kernels need `workspace` ((t_k * M, N) floats)."""
    func(*gemm_args(a, wp, out, schedule, workspace))
    return out


def gemm_args(a: np.ndarray, wp: np.ndarray, out: np.ndarray, schedule: KernelSchedule,
              workspace: np.ndarray | None = None) -> list:
    """The packed-function arguments of one call (prebuilt once when timing)."""
    args = [wrap(a), wrap(wp), wrap(out)]
    if schedule.polymerization.t_k > 1:
        if workspace is None:
            raise ShapeError(f"split-K kernel {schedule.key()} needs a workspace")
        args.append(wrap(workspace))
    sizes = slice_args(schedule)
    if min(sizes) < 1:  # the kernel divides by them: a zero is SIGFPE, a negative wrong output
        raise ShapeError(f"schedule {schedule.key()} has a slice of {sizes} blocks; every size "
                         f"must be positive")
    return args + list(sizes)


def workspace_view(buf: np.ndarray, t_k: int, m: int, n: int) -> np.ndarray:
    """The contiguous (t_k * M, N) prefix of a preallocated workspace buffer."""
    need = t_k * m * n
    if buf.size < need:
        raise ShapeError(f"split-K workspace holds {buf.size} floats, the call needs {need}")
    return buf.reshape(-1)[:need].reshape(t_k * m, n)


def wrap(x: np.ndarray):
    """Zero-copy TVM tensor over a numpy array (TVM's own helper insists on 64-byte alignment)."""
    import tvm_ffi

    return tvm_ffi.from_dlpack(x)
