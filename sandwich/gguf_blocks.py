"""A GGUF tensor's stored bytes as a `QuantizedWeight`, as stored: Q8_0, Q4_0 and Q4_1 blocks
split into values and fp16 scales (no re-quantizing), F32 and BF16 rows as they are, Q4_K's
super-blocks as int4-k (the same nibbles, 6-bit factors and fp16 d and dmin), Q5_K's as int5-k
(those and each value's fifth bit), Q6_K's as int6-k (the same 6-bit values, int8 factors and
fp16 d); and Q4_K into int4-g32-asym groups too, the same 4-bit values with each group's scale
and minimum multiplied out (fp16, as Q4_1 keeps them), for a run that asks for that format.

Which weight format a GGUF type loads into (`STORED_AS`), and which one its values are
re-quantized to when no format holds them (`NEAREST`), is decided here too."""

from __future__ import annotations

import numpy as np

from sandwich.errors import ConfigError
from sandwich.weight_formats import QuantizedWeight, pack4, pack5, pack6, parse_format

# GGUF type -> (weight format, bytes of one block of 32 values, bytes before its values)
BLOCKS = {"Q8_0": ("int8-g32", 34, 2), "Q4_0": ("int4-g32", 18, 2),
          "Q4_1": ("int4-g32-asym", 20, 4)}
ROWS = {"F32": ("fp32", np.float32), "BF16": ("bf16", np.uint16)}
Q4_K_BLOCK = 144  # 256 values: fp16 d and dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
Q5_K_BLOCK = 176  # 256 values: Q4_K's 144 bytes, and 32 of fifth bits before the nibbles
Q6_K_BLOCK = 210  # 256 values: 128 bytes of low 4 bits, 64 of high 2, 16 int8 factors, fp16 d
# GGUF super-block type -> (weight format, bytes of one block of 256 values)
SUPER_BLOCKS = {"Q4_K": ("int4-k", Q4_K_BLOCK), "Q5_K": ("int5-k", Q5_K_BLOCK),
                "Q6_K": ("int6-k", Q6_K_BLOCK)}
# GGUF type -> the format that holds its values without re-quantizing
STORED_AS = {t: f for t, (f, *_) in {**BLOCKS, **ROWS, **SUPER_BLOCKS}.items()}
# GGUF type -> other formats its blocks load into with the values as stored (the scales'
# products rounded once to fp16)
ALSO_LOADS = {"Q4_K": ("int4-g32-asym",)}
# the other types -> the format whose bits come nearest from above (F16: bf16; 5 bits: int8),
# or from below where nothing smaller exists (2 and 3 bits: int4, weight_choice)
NEAREST = {"F16": "bf16", "Q5_0": "int8-g32", "Q5_1": "int8-g32",
           "Q8_1": "int8-g32", "Q8_K": "int8-g32"}


def ggml_type_name(ggml_type: object) -> str:
    """The type's name ("Q4_0") from a `GGMLQuantizationType`, its number or its name."""
    if isinstance(ggml_type, str):
        return ggml_type.upper()
    name = getattr(ggml_type, "name", None)
    if name is None:
        from gguf.constants import GGMLQuantizationType

        try:
            name = GGMLQuantizationType(int(ggml_type)).name
        except (TypeError, ValueError):
            name = str(ggml_type)
    return name


def loads_into(ggml_type: object) -> tuple[str, ...]:
    """The formats a GGUF type's blocks load into without re-quantizing (STORED_AS's first)."""
    name = ggml_type_name(ggml_type)
    return ((STORED_AS[name],) if name in STORED_AS else ()) + ALSO_LOADS.get(name, ())


def from_gguf_blocks(raw: np.ndarray, ggml_type: object, shape: tuple[int, int],
                     fmt: str | None = None) -> QuantizedWeight:
    """The weight W = T.T of a GGUF tensor T, from T's bytes (`ReaderTensor.data`) and type,
    in `fmt` (one of `loads_into(type)`; None: STORED_AS's).

    `shape` is T's shape in HF's (out, in) = (N, K) order, as `GGUFTensor.shape` gives it: GGUF
    blocks run along a row of T, that is along K for each output column of W, which is the
    layout `QuantizedWeight` keeps, so the block bytes are split, never transposed."""
    name = ggml_type_name(ggml_type)
    if name not in STORED_AS:
        raise ConfigError(f"GGUF type {name} has no weight format here (loaded as stored: "
                          f"{', '.join(STORED_AS)}); dequantize it and quantize instead")
    if len(shape) != 2:
        raise ConfigError(f"GGUF tensor of type {name}: expected a 2-D (N, K) shape, got {shape}")
    n, k = (int(d) for d in shape)
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    values = 256 if name in SUPER_BLOCKS else 32
    if name in ROWS:
        fmt_name, dtype = ROWS[name]
        want = n * k * np.dtype(dtype).itemsize
    else:
        fmt_name, block, head = BLOCKS.get(name) or (*SUPER_BLOCKS[name], 0)
        if k % values:
            raise ConfigError(f"GGUF tensor of type {name}: K = {k} is not a multiple of {values}")
        want = n * (k // values) * block
    if data.size != want:
        raise ConfigError(f"GGUF tensor of type {name} and shape (N, K) = ({n}, {k}) must hold "
                          f"{want} bytes, got {data.size}")
    if fmt is not None and parse_format(fmt).name not in loads_into(name):
        raise ConfigError(f"GGUF type {name} does not load into {fmt} as stored (it loads into "
                          f"{', '.join(loads_into(name))})")
    fmt = parse_format(fmt or fmt_name)
    if name in ROWS:
        return QuantizedWeight(fmt, (k, n), data.view(dtype).reshape(n, k).copy())
    if name == "Q4_K":
        return _from_q4_k(data.reshape(n, k // 256, Q4_K_BLOCK), fmt)
    if name == "Q5_K":
        return _from_q5_k(data.reshape(n, k // 256, Q5_K_BLOCK), fmt)
    if name == "Q6_K":
        return _from_q6_k(data.reshape(n, k // 256, Q6_K_BLOCK), fmt)
    b = data.reshape(n, k // 32, block)
    q = b[..., head:].reshape(n, -1)
    if name == "Q8_0":
        q = q.view(np.int8)
    scales = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]
    mins = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0] if head == 4 else None
    return QuantizedWeight(fmt, (k, n), np.ascontiguousarray(q), scales, mins)


def q4_k_factors(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 sub-blocks' 6-bit scale and min factors, (..., 8) each, from a Q4_K block's 12
    scale bytes (..., 12): ggml's get_scale_min_k4, for all eight at once."""
    q = scales.astype(np.uint8)
    lo, hi = q[..., 0:4], q[..., 8:12]  # j < 4 take 6 bits; j >= 4 a nibble and 2 high bits
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([q[..., 4:8] & 63, (hi >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, mn


def _from_q4_k(b: np.ndarray, fmt) -> QuantizedWeight:
    """(N, K/256, 144) Q4_K blocks -> int4-k, every number as stored; or int4-g32-asym, where a
    sub-block of 32 (`d*sc*q - dmin*m`) takes its scale d*sc and minimum -dmin*m rounded once
    to fp16 (within 2^-11 of ggml's float products; its values are the stored nibbles).
    Sub-block 2c holds the low nibbles of bytes 32c..32c+31, 2c+1 their high ones; a group here
    keeps j and j+16 in one byte."""
    n, blocks = b.shape[:2]
    d16 = np.ascontiguousarray(b[..., 0:2]).view(np.float16)  # (N, B, 1)
    dmin16 = np.ascontiguousarray(b[..., 2:4]).view(np.float16)
    sc, mn = q4_k_factors(b[..., 4:16])
    qs = b[..., 16:].reshape(n, blocks, 4, 1, 32)
    nibbles = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=3)  # (N, B, 4, 2, 32)
    q = pack4(nibbles.reshape(n, blocks * 8, 32))
    if fmt.super_group:
        return QuantizedWeight(fmt, (blocks * 256, n), q, sc.reshape(n, -1), mn.reshape(n, -1),
                               d16[..., 0], dmin16[..., 0])
    d, dmin = d16.astype(np.float32), dmin16.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        scales = (d * sc).astype(np.float16).reshape(n, -1)
        mins = (-(dmin * mn)).astype(np.float16).reshape(n, -1)
    if not (np.isfinite(scales).all() and np.isfinite(mins).all()):
        raise ConfigError("Q4_K block scales or minimums do not fit float16 (the file is "
                          "damaged, or its values are beyond int4-g32-asym's range)")
    return QuantizedWeight(fmt, (blocks * 256, n), q, scales, mins)


def _from_q5_k(b: np.ndarray, fmt) -> QuantizedWeight:
    """(N, K/256, 176) Q5_K blocks -> int5-k, every number as stored: Q4_K's d, dmin, 12 factor
    bytes and 128 nibble bytes (sub-block 2c the low nibbles of bytes 32c..32c+31, 2c+1 their
    high ones), with `qh` (32 bytes) between the factors and the nibbles: value l of sub-block
    s (l < 32) takes its fifth bit from bit s of qh's byte l (ggml's dequantize_row_q5_K)."""
    n, blocks = b.shape[:2]
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]  # (N, B)
    dmin = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0]
    sc, mn = q4_k_factors(b[..., 4:16])
    qh = b[..., 16:48].reshape(n, blocks, 1, 32)
    fifth = (qh >> np.arange(8, dtype=np.uint8)[:, None]) & np.uint8(1)  # (N, B, 8, 32)
    qs = b[..., 48:].reshape(n, blocks, 4, 1, 32)
    low = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=3).reshape(n, blocks, 8, 32)
    q, high = pack5((low | (fifth << np.uint8(4))).reshape(n, -1), 32)
    return QuantizedWeight(fmt, (blocks * 256, n), q, sc.reshape(n, -1), mn.reshape(n, -1), d, dmin,
                           high)


def _from_q6_k(b: np.ndarray, fmt) -> QuantizedWeight:
    """(N, K/256, 210) Q6_K blocks -> int6-k, every number as stored. Each half of a block
    (128 values) has 64 bytes of `ql` and 32 of `qh`: value 32s + l (s < 4, l < 32) takes
    its low 4 bits from byte l + 32 (s % 2) of ql (low nibble for s < 2, high for s >= 2)
    and its high 2 from bits 2s, 2s + 1 of byte l of qh (ggml's dequantize_row_q6_K)."""
    n, blocks = b.shape[:2]
    ql = b[..., 0:128].reshape(n, blocks, 2, 1, 64)
    low = np.concatenate([ql & np.uint8(0x0F), ql >> np.uint8(4)], axis=3)  # (N, B, 2, 2, 64)
    qh = b[..., 128:192].reshape(n, blocks, 2, 1, 32)
    top = (qh >> np.arange(0, 8, 2, dtype=np.uint8)[:, None]) & np.uint8(3)  # (N, B, 2, 4, 32)
    values = low.reshape(n, -1) | (top.reshape(n, -1) << np.uint8(4))
    q, high = pack6(values)
    scales = np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(n, -1)
    d = np.ascontiguousarray(b[..., 208:210]).view(np.float16)[..., 0]  # (N, B)
    return QuantizedWeight(fmt, (blocks * 256, n), q, scales, super_scales=d, high=high)
