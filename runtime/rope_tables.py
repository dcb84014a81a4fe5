"""RoPE frequency tables (default, linear and llama3 scaling, or GGUF's explicit divisors),
built once per model at load time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sandwich.errors import ConfigError


@dataclass(frozen=True)
class RopeSpec:
    """What the cos/sin tables depend on; `kind` is HF's rope_type."""

    theta: float
    head_dim: int
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    divisors: tuple[float, ...] = ()  # kind "freqs": GGUF's rope_freqs, one per frequency


def rope_spec(raw: dict[str, Any], *, head_dim: int, source: str) -> RopeSpec:
    """From an HF config dict: legacy `rope_theta` + `rope_scaling`, or transformers 5's
    `rope_parameters` (which carries the theta itself)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{source}: rope_scaling must be an object or null, got {params!r}")

    def num(key: str, default=None, kind=float):
        v = params.get(key, default)
        if v is None:
            raise ConfigError(f"{source}: {kind_name} rope_scaling lacks {key!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{source}: rope_scaling {key!r} must be a positive number, got {v!r}")
        return kind(v)

    kind_name = params.get("rope_type", params.get("type", "default"))
    base = raw.get("rope_theta")
    theta = num("rope_theta", 10000.0 if base is None else base)
    if kind_name == "default":
        return RopeSpec(theta, head_dim)
    if kind_name == "linear":
        return RopeSpec(theta, head_dim, "linear", factor=num("factor"))
    if kind_name == "llama3":
        return RopeSpec(theta, head_dim, "llama3", factor=num("factor"),
                        low_freq_factor=num("low_freq_factor"),
                        high_freq_factor=num("high_freq_factor"),
                        original_max_position=num("original_max_position_embeddings", kind=int))
    raise ConfigError(f"{source}: rope_type {kind_name!r} is not supported (default, linear, llama3)")


def inv_freq(spec: RopeSpec) -> np.ndarray:
    """Inverse frequencies (head_dim / 2,), computed in float32 as HF does."""
    d = spec.head_dim
    inv = (1.0 / (np.float32(spec.theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))))
    inv = inv.astype(np.float32)
    if spec.kind == "linear":
        return (inv / np.float32(spec.factor)).astype(np.float32)
    if spec.kind == "freqs":
        if len(spec.divisors) != inv.size:
            raise ConfigError(f"rope_freqs has {len(spec.divisors)} values, the head needs {inv.size}")
        return (inv / np.asarray(spec.divisors, np.float32)).astype(np.float32)
    if spec.kind == "llama3":
        old = spec.original_max_position
        low_wavelen = old / spec.low_freq_factor
        high_wavelen = old / spec.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / spec.factor, inv)
        smooth = (old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)
        smoothed = (1 - smooth) * scaled / spec.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


def cos_sin(spec: RopeSpec, max_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [max_pos, head_dim / 2] (the layout of the DSL rope kernel)."""
    freqs = np.arange(max_pos, dtype=np.float32)[:, None] * inv_freq(spec)[None, :]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
