"""Pack weights for the GEMM template and call a compiled kernel on numpy arrays, zero-copy."""

from __future__ import annotations

import numpy as np

from sandwich.compiler.gemm_formats import ACT_BLOCK, int_activations, weight_format
from sandwich.compiler.gemm_template import slice_args
from sandwich.errors import ShapeError
from sandwich.types import AMX_OPS, KernelSchedule
from sandwich.weight_formats import QuantizedWeight, quantize, unpack4, unpack5, unpack6


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


def pack_weight(w: np.ndarray | QuantizedWeight, pack_n: int, dtype: str = "float32", *,
                quads: bool | None = None) -> tuple[np.ndarray, ...]:
    """A weight -> the kernel's weight arrays for `dtype` (a schedule's dtype: "float32" or a
    weight format's name), in call order; `w` is float (K, N), quantized here for an int
    format, or already a QuantizedWeight of that format (a GGUF's blocks, as stored).
    `quads`: see pack_quantized (None: as the family reads this format and K)."""
    fmt = weight_format(dtype)
    if isinstance(w, QuantizedWeight):
        if w.fmt != fmt:
            raise ShapeError(f"weights are {w.fmt.name}, the kernel reads {fmt.name}")
        return tuple(pack_quantized(w, pack_n, quads=quads))
    if fmt.bits == 32:
        return (pack_weights(w, pack_n),)
    if np.ndim(w) != 2:
        raise ShapeError(f"weights must be 2-D (K, N), got shape {np.shape(w)}")
    return tuple(pack_quantized(quantize(w, fmt), pack_n, quads=quads))


def pack_quantized(qw: QuantizedWeight, pack_n: int, *, quads: bool | None = None
                   ) -> list[np.ndarray]:
    """A weight in bf16 (pack_bf16) or an int format -> the family's arrays in call order
    (gemm_formats.weight_args):
    values [N / pack_n, K (int8) or K / 2 (int4), pack_n], then scales and, when asymmetric,
    minimums [N / pack_n, K / G, pack_n] in the format's scale type (int4-k: then its fp16
    multipliers [N / pack_n, K / 256, pack_n]); done once at load time.
    int4 bytes are re-paired so that byte k / 2 holds value k (low nibble) and k + 1 (high).
    With `quads` (the family's 8-bit activations, gemm_formats.int_activations), the values
    are Q8Q / Q4Q instead (dot8_values): what one dot8 lane takes, in 32-bit elements; 6-bit
    values are always Q6Q and Q6H (six_bit_values), then int6-k's factors and d; 5-bit ones
    Q4Q and Q5H (five_bit_values), then int4-k's factors and multipliers."""
    k, n = qw.shape
    if n % pack_n:
        raise ShapeError(f"weight N={n} is not a multiple of the packed width {pack_n}")
    if qw.fmt.bits == 16:
        return [pack_bf16(qw, pack_n)]
    if qw.fmt.bits == 6:  # the family reads 6-bit values only as dot8 takes them
        values = six_bit_values(unpack6(qw.q, qw.high))
    elif qw.fmt.bits == 5:  # and 5-bit ones
        values = five_bit_values(unpack5(qw.q, qw.high, qw.fmt.group_size(k)))
    else:
        v = qw.q
        if qw.fmt.bits == 4:
            if k % 2:
                raise ShapeError(f"int4 weights need an even K, got K={k}")
            v = unpack4(qw.q, qw.fmt.group_size(k)).reshape(n, k)
        if int_activations(qw.fmt, k) if quads is None else quads:
            v = dot8_values(v, qw.fmt.bits)
        elif qw.fmt.bits == 4:
            v = v[:, 0::2] | (v[:, 1::2] << np.uint8(4))
        values = (v,)
    out = []
    for a in (*values, *(a for key, a in qw.arrays().items() if key not in ("q", "high"))):
        packed = aligned_empty((n // pack_n, a.shape[1], pack_n), a.dtype)
        packed[...] = a.reshape(n // pack_n, pack_n, a.shape[1]).transpose(0, 2, 1)
        out.append(packed)
    return out


def dot8_values(values: np.ndarray, bits: int) -> np.ndarray:
    """int values [N, K] (int8, or int4 as 0..15) -> [N, K / 4 or K / 8] int32, per block of 32
    along K as the family's dot8 takes them against the activations' element 8 b + u (values
    32 b + u + 8 q in its bytes q): int8's element 8 b + u holds those values + 128 (unsigned
    bytes); int4's element 4 b + u holds quad 8 b + u in its low nibbles, 8 b + u + 4 in its
    high ones."""
    n, k = values.shape
    if k % ACT_BLOCK:
        raise ShapeError(f"8-bit activations need K a multiple of {ACT_BLOCK}, got K={k}")
    if bits == 8:
        u8 = (values.astype(np.int16) + 128).astype(np.uint8).reshape(n, k // 32, 4, 8)
        quads = u8.transpose(0, 1, 3, 2)  # [n, block, u, q]
    else:
        v = values.astype(np.uint8).reshape(n, k // 32, 4, 2, 4)  # [n, block, q, high, u]
        quads = (v[:, :, :, 0] | (v[:, :, :, 1] << np.uint8(4))).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(quads).reshape(n, -1).view("<i4").astype(np.int32, copy=False)


def six_bit_values(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """6-bit values [N, K] (0..63) -> (Q6Q [N, K / 8], Q6H [N, K / 16]) int32, per block of 32
    along K as the family's dot8 takes them against the 6-bit activation layout (element 8 b + u
    holds values 32 b + 4 u + q, so quads 0-3 are the block's first group of 16 and 4-7 its
    second): Q6Q's element 4 b + u holds the low four bits of quad u in its low nibbles and of
    quad u + 4 in its high ones; Q6H's element 2 b + h holds the high two bits of group h's quad
    u in bits 2 u and 2 u + 1 of each byte."""
    n, k = values.shape
    if k % ACT_BLOCK:
        raise ShapeError(f"6-bit weights need K a multiple of {ACT_BLOCK}, got K={k}")
    v = values.astype(np.uint8).reshape(n, k // 32, 2, 4, 4)  # [n, block, group, u, q]
    low, high = v & np.uint8(15), v >> np.uint8(4)
    q6q = low[:, :, 0] | (low[:, :, 1] << np.uint8(4))  # [n, block, u, q]
    q6h = sum(high[:, :, :, u] << np.uint8(2 * u) for u in range(4))  # [n, block, group, q]
    return tuple(np.ascontiguousarray(a).reshape(n, -1).view("<i4").astype(np.int32, copy=False)
                 for a in (q6q, q6h.astype(np.uint8)))


def five_bit_values(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """5-bit values [N, K] (0..31) -> (Q4Q [N, K / 8], Q5H [N, K / 32]) int32: their low four
    bits as int4's dot8_values, and their fifth bits a block of 32 a word, value 32 b + i's at
    bit i of element b (bit u of byte q: value 32 b + 8 q + u, in aq's quad u, byte q)."""
    n, k = values.shape
    v = values.astype(np.uint8)
    q4q = dot8_values(v & np.uint8(15), 4)  # checks K a multiple of 32
    q5h = np.packbits(v >> np.uint8(4), axis=-1, bitorder="little")  # [n, K / 8]
    return q4q, q5h.view("<i4").astype(np.int32, copy=False)


def pack_bf16(qw: QuantizedWeight, pack_n: int) -> np.ndarray:
    """bf16 weight -> WB[N / pack_n, K / 2, pack_n] int32: element [p, kk, j] holds the bits of
    column p pack_n + j's values 2 kk (low half) and 2 kk + 1, the pair a vdpbf16ps lane takes."""
    k, n = qw.shape
    if k % 2:
        raise ShapeError(f"bf16 weights need an even K, got K={k}")
    pairs = qw.q.reshape(n, k // 2, 2).view(np.uint32).reshape(n, k // 2)  # little-endian
    packed = aligned_empty((n // pack_n, k // 2, pack_n), np.int32)
    packed[...] = pairs.view(np.int32).reshape(n // pack_n, pack_n, k // 2).transpose(0, 2, 1)
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


def call_gemm(func, a: np.ndarray, wp: np.ndarray | tuple[np.ndarray, ...], out: np.ndarray,
              schedule: KernelSchedule, workspace: np.ndarray | None = None) -> np.ndarray:
    """Run C = A @ W through a compiled kernel with the schedule's slice, wrapping numpy
    buffers without copies. Split-K kernels need `workspace` ((t_k * M, N) floats)."""
    func(*gemm_args(a, wp, out, schedule, workspace))
    return out


def gemm_args(a: np.ndarray, wp: np.ndarray | tuple[np.ndarray, ...], out: np.ndarray,
              schedule: KernelSchedule, workspace: np.ndarray | None = None) -> list:
    """The packed-function arguments of one call (prebuilt once when timing); `wp` is the
    packed fp32 weight or the arrays `pack_weight` made for the schedule's dtype."""
    weights = (wp,) if isinstance(wp, np.ndarray) else tuple(wp)
    args = [wrap(a), *(wrap(x) for x in weights), wrap(out)]
    if schedule.op in AMX_OPS:  # the AMX kernels' blocks are fixed: no slice, no split K
        return args
    if schedule.polymerization.t_k > 1:
        if workspace is None:
            raise ShapeError(f"split-K kernel {schedule.key()} needs a workspace")
        args.append(wrap(workspace))
    sizes = slice_args(schedule)
    if min(sizes) < 1:  # the kernel divides by them: a zero is SIGFPE, a negative wrong output
        raise ShapeError(f"schedule {schedule.key()} has a slice of {sizes} blocks; every size "
                         f"must be positive")
    if weight_format(schedule.dtype).bits == 16 and sizes[2] % 2 and sizes[2] < a.shape[1]:
        raise ShapeError(f"schedule {schedule.key()}: bf16 weights are read in pairs along K, "
                         f"so b_k={sizes[2]} must be even")
    return args + list(sizes)


def rotated_args(args: list, wrapped: list[tuple]) -> list[list]:
    """One call's arguments (gemm_args, checked once) for each weight copy in `wrapped`
    (tuples of `wrap`ped arrays, in the packed arrays' order), sharing A, C, the workspace and
    the slice: a decode timing cycles over up to 1024 copies, and wrapping every array again
    for each took longer than timing a small GEMM."""
    nw = len(wrapped[0])
    return [[args[0], *w, *args[1 + nw:]] for w in wrapped]


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
