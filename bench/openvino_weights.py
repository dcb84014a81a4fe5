"""sandwichc's int weight formats as OpenVINO's weight-decompression subgraph (the same values and scales).

The subgraph is what NNCF's compress_weights emits: int Constant (N, K/g, g) -> Convert ->
[Subtract zero point] -> Multiply by the (N, K/g, 1) scales -> Reshape (N, K), feeding a
MatMul with transpose_b. The CPU plugin folds it into one FullyConnected that keeps the
weight in its int type and dequantizes a group as it reads it (its runtime graph shows the
FullyConnected at i8 / i4 / u4 precision, no f32 copy of the weight).
"""

from __future__ import annotations

import numpy as np

from sandwich.errors import ConfigError
from sandwich.weight_formats import (
    QuantizedWeight,
    WeightFormat,
    asym_group_scales,
    asym_values,
    parse_weights,
    six_group_scales,
    unpack4,
    unpack6,
)


def check_format(weights: str) -> WeightFormat:
    """The format `weights` names if this peer builds it (fp32, bf16 or an int format), else a
    one-line ConfigError."""
    spec = parse_weights(weights)
    if spec.overrides:
        raise ConfigError(f"openvino peer runs one format for every GEMM; --weights {spec.name} "
                          f"keeps some in another (name one, e.g. --weights {spec.base.name})")
    return spec.base


def _int4_constant(values: np.ndarray, signed: bool):
    """An i4 (-8..7) or u4 (0..15) Constant of `values`' shape: two values a byte, the
    lower index in the low nibble (OpenVINO's order; sandwichc pairs j with j + g/2)."""
    import openvino as ov

    nibbles = (values.astype(np.int16) & 0x0F).astype(np.uint8)
    tensor = ov.Tensor(ov.Type.i4 if signed else ov.Type.u4, ov.Shape(list(values.shape)))
    tensor.data[:] = (nibbles[..., 0::2] | (nibbles[..., 1::2] << np.uint8(4))).reshape(-1)
    return ov.op.Constant(tensor)


def _f32(ops, a: np.ndarray):
    """A Constant in its stored dtype, converted to f32 when it is not (fp16 scales)."""
    c = ops.constant(np.ascontiguousarray(a))
    return c if a.dtype == np.float32 else ops.convert(c, np.float32)


def _asym(qw: QuantizedWeight, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1's `d q + m` as `(q - zp) d` (the plugin fuses a Subtract, not an Add): zp = -m / d
    in f32. A group with d = 0 holds m everywhere: q = 0, zp = -1 and the scale m instead."""
    k, n = qw.shape
    q = asym_values(qw)
    # int4-k's scales and minimums are made from its factors (float32); the others' as stored
    pair = asym_group_scales(qw) if qw.fmt.super_group else (qw.scales, qw.mins)
    d, m = (a.reshape(n, k // g, 1) for a in pair)
    flat = d == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        zp = np.where(flat, np.float32(-1), -m.astype(np.float32) / d.astype(np.float32))
    return np.where(flat, np.uint8(0), q), zp.astype(np.float32), np.where(flat, m, d)


def compressed_weight(ops, qw: QuantizedWeight):
    """W (N, K) of `qw` (an int format) as the decompression subgraph, for
    `MatMul(x, W, transpose_b=True)`: int8 as i8, symmetric int4 as i4 (nibble - 8),
    asymmetric int4 as u4 (int5-k as u8) with an f32 zero point per group; int6-k as i8 (value -
    32); the format's scales as stored (the K-quants': made from their factors, in f32)."""
    fmt, (k, n) = qw.fmt, qw.shape
    if not fmt.quantized:
        raise ConfigError(f"{fmt.name} is not an int format")
    g = fmt.group_size(k)
    scales = qw.scales.reshape(n, k // g, 1)
    if fmt.bits == 8:
        w = ops.convert(ops.constant(qw.q.reshape(n, k // g, g)), np.float32)
    elif fmt.bits == 6:  # int6-k: value - 32 as i8, each group's d * sc as an f32 scale
        six = unpack6(qw.q, qw.high).reshape(n, k // g, g).astype(np.int8) - np.int8(32)
        w = ops.convert(ops.constant(six), np.float32)
        scales = six_group_scales(qw).reshape(n, k // g, 1)
    elif fmt.symmetric:
        w = ops.convert(_int4_constant(unpack4(qw.q, g).astype(np.int8) - np.int8(8), True), np.float32)
    else:
        q, zp, scales = _asym(qw, g)
        values = ops.constant(q) if fmt.bits == 5 else _int4_constant(q, False)
        w = ops.subtract(ops.convert(values, np.float32), ops.constant(zp))
    w = ops.multiply(w, _f32(ops, scales))
    return ops.reshape(w, ops.constant(np.asarray([n, k], np.int64)), special_zero=False)
