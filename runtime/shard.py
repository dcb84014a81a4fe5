"""One tensor-parallel rank's slice of a Llama checkpoint, packed into the GEMMs of
`make_payload(cfg, tp=...)` (Megatron-style: two all-reduces per layer).

Attention is split by heads (q/k/v rows of the rank's heads, o columns of the same heads) and
the MLP by the intermediate dimension (gate/up rows, down columns), so attention and SiLU-mul
need no communication; o and down yield partial sums that the all-reduce adds. lm_head is
split by vocabulary rows when tp divides the vocabulary (the payload tunes that shape; the
logits of one step are small to gather, the lm_head weights are the largest GEMM of a small
model), else replicated. Embedding and norms are replicated: the residual stream is whole.
An MoE layer's experts (and a shared expert) are split like the MLP (each expert's intermediate
columns), its router replicated: every rank routes the same whole hidden states alike.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sandwich.errors import CacheError, ConfigError
from sandwich.models import ModelConfig
from sandwich.payload import make_payload, op_format
from sandwich.runtime.loader import (
    GEMM_FIELDS,
    LlamaModel,
    ModelGemms,
    WeightReader,
    check_memory,
    open_checkpoint,
    pack_model,
)
from sandwich.tuner.kernel_cache import GemmKernel, KernelCache
from sandwich.weight_formats import gemm_dtype, parse_weights, weights_flag


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Raise a ConfigError unless every sharded dimension splits evenly over tp ranks."""
    if tp < 1:
        raise ConfigError(f"tensor-parallel degree must be >= 1, got {tp}")
    for what, value in (("num_attention_heads", cfg.num_attention_heads),
                        ("num_key_value_heads", cfg.num_key_value_heads),
                        ("intermediate_size", cfg.intermediate_size),
                        ("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size)):
        if value % tp:
            raise ConfigError(f"{cfg.name}: tensor-parallel degree {tp} does not divide {what} "
                              f"({value}); choose a tp that divides it")


def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The config one rank runs: its heads, kv heads and intermediate sizes; hidden, head_dim
    and vocab_size (token ids, embedding) stay whole."""
    check_tp(cfg, tp)
    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=cfg.num_key_value_heads // tp,
                               intermediate_size=cfg.intermediate_size // tp,
                               shared_expert_intermediate_size=cfg.shared_expert_intermediate_size // tp)


def vocab_sharded(cfg: ModelConfig, tp: int) -> bool:
    """lm_head is split by vocabulary rows exactly when the payload tuned it that way."""
    return tp > 1 and cfg.vocab_size % tp == 0


def shard_gemms(cfg: ModelConfig, cache: KernelCache, *, tp: int,
                threads: int | None = None, weights: str = "fp32") -> ModelGemms:
    """The GEMMs of the tp payload in the weight format `weights`, tuned for `threads` (a
    rank's CPU count)."""
    found = {}
    spec = parse_weights(weights)

    def gemm(n: int, k: int, dtype: str, name: str) -> GemmKernel:
        try:
            return cache.gemm(n=n, k=k, dtype=dtype, threads=threads)
        except CacheError as e:
            raise CacheError(f"{e} (GEMM {name} at tensor-parallel degree {tp}: "
                             f"tune with `--tp {tp}{weights_flag(weights)}`)") from None

    for op in make_payload(cfg, tp=tp, seq_max=1, weights=weights).ops:
        if op.name not in ("qk", "v") and op.dtype == gemm_dtype(
                op_format(spec, op.name, cfg.num_hidden_layers)):  # per-layer formats: below
            found[GEMM_FIELDS.get(op.name, op.name)] = gemm(op.n, op.k, op.dtype, op.name)
    local = shard_config(cfg, tp)
    n_q, n_v = (local.num_attention_heads * local.head_dim, local.num_key_value_heads * local.head_dim)
    found.setdefault("qkv", None)  # every layer runs v apart
    return ModelGemms(**found).with_layer_formats(
        spec, lambda n, k, fmt: gemm(n, k, gemm_dtype(fmt), f"of N={n} K={k}"),
        layers=cfg.num_hidden_layers, qk=(n_q + n_v, cfg.hidden_size), v=(n_v, cfg.hidden_size))


def load_shard(model_dir: str | Path, cache: KernelCache, *, rank: int, tp: int,
               threads: int | None = None, weights: str = "fp32") -> LlamaModel:
    """Read rank `rank`'s rows/columns of every projection and pack them once, in the
    format `weights` (a share of K keeps the groups and scales of the whole K)."""
    cfg, rope, ckpt = open_checkpoint(model_dir)  # an HF directory or a GGUF file
    if not 0 <= rank < tp:
        raise ConfigError(f"rank {rank} is outside tensor-parallel degree {tp}")
    local = shard_config(cfg, tp)
    read = WeightReader(ckpt, cfg)  # checkpoint errors before kernel lookups
    check_memory(cfg, weights=weights, tp=tp)
    gemms = shard_gemms(cfg, cache, tp=tp, threads=threads, weights=weights)
    rows = cfg.vocab_size // tp if vocab_sharded(cfg, tp) else None
    return pack_model(read, cfg, rope, gemms, local=local, rank=rank, vocab_rows=rows)
