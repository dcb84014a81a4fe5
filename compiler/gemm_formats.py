"""Which weight formats the GEMM family builds, and the weight arrays each one passes."""

from __future__ import annotations

import numpy as np

from sandwich.errors import ConfigError
from sandwich.types import AMX8_OP, AMX_OP, GEMM_OP
from sandwich.weight_formats import WeightFormat, format_of

ACT_BLOCK = 32  # values along K per activation scale when act = 1
ACT_MAX = 127.0  # activations quantized to 8 bits: dot8's signed bytes


def weight_format(dtype: str) -> WeightFormat:
    """The weight format a schedule's dtype names ("float32" is fp32); the family builds
    every format of sandwich/weight_formats.py."""
    fmt = format_of(dtype)
    if fmt.bits not in (32, 16, 8, 6, 5, 4):
        raise ConfigError(f"no GEMM kernel for {fmt.name} weights (built: fp32, bf16, int8, "
                          f"int6, int5, int4)")
    return fmt


def weight_args(dtype: str, k: int) -> tuple[str, ...]:
    """The kernel's weight arrays for a dtype and K, in call order: the values are Q8Q / Q4Q
    (dot8's bytes) where the family uses 8-bit activations, else Q8 / Q4; then the scales
    (and minimums), as QuantizedWeight.arrays orders them."""
    fmt = weight_format(dtype)
    if fmt.bits == 32:
        return ("W",)
    if fmt.bits == 16:
        return ("WB",)
    if fmt.bits == 6:  # Q6_K: the values' low and high bits, 8-bit factors, fp16 d per 256
        return ("Q6Q", "Q6H", "SC", "SD")
    values = ("Q8" if fmt.bits == 8 else "Q4") + ("Q" if int_activations(fmt, k) else "")
    if fmt.super_group:  # Q4_K: 6-bit factors, then their fp16 multipliers; Q5_K: the same
        fifth = ("Q5H",) if fmt.bits == 5 else ()  # after the fifth bits of its values
        return (values, *fifth, "SK", "ZK", "SD", "ZD")
    scales = "SF" if fmt.scale_dtype == "float32" else "S"
    return (values, scales) + (("Z",) if not fmt.symmetric else ())


def int_activations(fmt: WeightFormat, k: int) -> bool:
    """Whether the family computes this format's products on 8-bit integer activations
    (tunable act = 1), as llama.cpp's Q8_0 and Q4_0 dot products do: every int format whose
    groups are whole blocks of 32 values, and the 6-bit one (two groups of 16 a block, which
    the family sums apart)."""
    return fmt.quantized and (fmt.group_size(k) % ACT_BLOCK == 0 or fmt.bits == 6)


def amx_format(dtype: str, k: int) -> bool:
    """Whether the AMX kernel takes weights of this format: bf16, and int8 / int4 whose groups
    are whole blocks of 32 values, in the family's dot8 layout (Q8Q / Q4Q; Q8_0, Q4_0, Q4_1),
    which it rounds to bf16 a block of W at a time. Not the K-quants (super-blocks of 256)."""
    fmt = weight_format(dtype)
    return fmt.bits == 16 or (fmt.bits in (8, 4) and not fmt.super_group and int_activations(fmt, k))


def amx8_format(dtype: str, k: int) -> bool:
    """Whether the AMX byte-product kernel (gemm_amx_int8) takes weights of this format: the
    int8 and int4 ones of amx_format (its products are the family's, on 8-bit activations)."""
    return weight_format(dtype).bits in (8, 4) and amx_format(dtype, k)


def op_takes(op: str, dtype: str, k: int) -> bool:
    """Whether the kernel that schedules of `op` build takes weights of this format: the
    family every format it builds, the AMX kernels theirs (amx_format, amx8_format); an
    unknown op none."""
    if op == AMX8_OP:
        return amx8_format(dtype, k)
    if op == AMX_OP:
        return amx_format(dtype, k)
    return op == GEMM_OP


def quantized_activations(a: np.ndarray) -> np.ndarray:
    """A[M, K] as the kernel sees it with act = 1 (float64): each block of 32 values along K
    rounded to 8 bits (scale max |a| / 127), in the kernel's float32 arithmetic."""
    m, k = a.shape
    blocks = np.asarray(a, np.float32).reshape(m, k // ACT_BLOCK, ACT_BLOCK)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(ACT_MAX) / amax, np.float32(0))
    q = np.floor(blocks * inv + np.float32(0.5))
    scale = amax / np.float32(ACT_MAX)
    return (q.astype(np.float64) * scale.astype(np.float64)).reshape(m, k)
