"""Which weight formats the GEMM family builds, and the weight arrays each one passes."""

from __future__ import annotations

from sandwich.errors import ConfigError
from sandwich.weight_formats import WeightFormat, format_of


def weight_format(dtype: str) -> WeightFormat:
    """The weight format a schedule's dtype names ("float32" is fp32); the family builds
    fp32 and the int formats (bf16 has no kernel yet)."""
    fmt = format_of(dtype)
    if fmt.bits not in (32, 8, 4):
        raise ConfigError(f"no GEMM kernel for {fmt.name} weights yet (built: fp32, int8, int4)")
    return fmt


def weight_args(dtype: str) -> tuple[str, ...]:
    """The kernel's weight arrays for a dtype, in call order."""
    fmt = weight_format(dtype)
    if fmt.bits == 32:
        return ("W",)
    scales = "SF" if fmt.scale_dtype == "float32" else "S"
    return ("Q8" if fmt.bits == 8 else "Q4", scales) + (("Z",) if not fmt.symmetric else ())
