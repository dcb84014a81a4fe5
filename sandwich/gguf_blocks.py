"""A GGUF tensor's stored bytes as a `QuantizedWeight`, as stored: Q8_0, Q4_0 and Q4_1 blocks
split into values and fp16 scales (no re-quantizing), F32 and BF16 rows as they are."""

from __future__ import annotations

import numpy as np

from sandwich.errors import ConfigError
from sandwich.weight_formats import QuantizedWeight, parse_format

# GGUF type -> (weight format, bytes of one block of 32 values, bytes before its values)
BLOCKS = {"Q8_0": ("int8-g32", 34, 2), "Q4_0": ("int4-g32", 18, 2),
          "Q4_1": ("int4-g32-asym", 20, 4)}
ROWS = {"F32": ("fp32", np.float32), "BF16": ("bf16", np.uint16)}


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


def from_gguf_blocks(raw: np.ndarray, ggml_type: object, shape: tuple[int, int]) -> QuantizedWeight:
    """The weight W = T.T of a GGUF tensor T, from T's bytes (`ReaderTensor.data`) and type.

    `shape` is T's shape in HF's (out, in) = (N, K) order, as `GGUFTensor.shape` gives it: GGUF
    blocks run along a row of T, that is along K for each output column of W, which is the
    layout `QuantizedWeight` keeps, so the block bytes are split, never transposed."""
    name = ggml_type_name(ggml_type)
    if name not in BLOCKS and name not in ROWS:
        raise ConfigError(f"GGUF type {name} has no weight format here (loaded as stored: "
                          f"{', '.join([*BLOCKS, *ROWS])}); dequantize it and quantize instead")
    if len(shape) != 2:
        raise ConfigError(f"GGUF tensor of type {name}: expected a 2-D (N, K) shape, got {shape}")
    n, k = (int(d) for d in shape)
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if name in ROWS:
        fmt_name, dtype = ROWS[name]
        want = n * k * np.dtype(dtype).itemsize
    else:
        fmt_name, block, head = BLOCKS[name]
        if k % 32:
            raise ConfigError(f"GGUF tensor of type {name}: K = {k} is not a multiple of 32")
        want = n * (k // 32) * block
    if data.size != want:
        raise ConfigError(f"GGUF tensor of type {name} and shape (N, K) = ({n}, {k}) must hold "
                          f"{want} bytes, got {data.size}")
    fmt = parse_format(fmt_name)
    if name in ROWS:
        return QuantizedWeight(fmt, (k, n), data.view(dtype).reshape(n, k).copy())
    b = data.reshape(n, k // 32, block)
    q = b[..., head:].reshape(n, -1)
    if name == "Q8_0":
        q = q.view(np.int8)
    scales = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]
    mins = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0] if head == 4 else None
    return QuantizedWeight(fmt, (k, n), np.ascontiguousarray(q), scales, mins)
