"""The payload: every GEMM of one decoder layer plus lm_head, with (N, K) under a TP degree
(an MoE layer's router and per-expert GEMMs in place of the MLP's)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from sandwich.errors import ConfigError
from sandwich.models import ModelConfig
from sandwich.types import GemmOp
from sandwich.weight_formats import (
    WeightFormat,
    WeightSpec,
    check_shape,
    format_of,
    gemm_dtype,
    layout,
    parse_format,
    parse_weights,
)

# the runtime runs lm_head on the last token of each sequence in a step only (runtime/executor.py:
# _head), so its M is a batch size, never a prompt length (`serve --max-batch`: 16 by default);
# past this, one more search at 4x covers the rest (tuner/tune.py: op_samples), for the rows
# `perplexity` scores
HEAD_M_MAX = 64
# GEMMs whose weights stay fp32 in every format: an MoE router (llama.cpp keeps ffn_gate_inp in
# F32 in every quantization too), whose rounded logits would send tokens to other experts
FP32_OPS = frozenset({"router"})
# ops whose K tensor parallelism splits (row-parallel); the others split N or run whole
K_SHARDED = frozenset({"o", "down", "expert_down", "shared_down"})


def op_format(weights: str | WeightSpec, op: str, layers: int | None = None) -> WeightFormat:
    """The format op `op` stores its weights in under the spec `weights` (fp32 for FP32_OPS):
    what the payload's ops and the loader's kernels both read. With `layers` (the model's),
    the format of the layers the spec gives no format of their own for the op, or where
    every layer has one, layer 0's: the kernel a model's GEMMs hold for the op runs."""
    if op in FP32_OPS:
        return parse_format("fp32")
    spec = parse_weights(weights)
    fmt = spec.for_op(op)
    if layers and all(spec.for_op(op, i) != fmt for i in range(layers)):
        return spec.for_op(op, 0)
    return fmt


@dataclass(frozen=True)
class Payload:
    """GEMM ops of one model under a tensor-parallel degree; M ranges over [1, seq_max]."""

    model: str
    tp: int
    seq_max: int
    ops: tuple[GemmOp, ...]


def _shard(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise ConfigError(f"tensor-parallel degree {tp} does not divide {what} ({value})")
    return value // tp


def make_payload(cfg: ModelConfig, *, tp: int = 1, seq_max: int = 2048,
                 weights: str = "fp32") -> Payload:
    """QKV and gate/up are fused (column-parallel); O and down are row-parallel (K sharded).

    An MoE model has, per layer, the router (N = experts, plus the shared expert's gate;
    replicated under TP) and each expert's fused gate/up and down, sharded like the dense
    MLP; their count is the expert GEMMs one token runs (layers x experts per token); a
    shared expert (Qwen2-MoE) has its own pair, sharded alike. Every GEMM reads its weights
    in the format the spec `weights` gives its op (sandwich/weight_formats.py), which sets
    the ops' dtype; the router's stay fp32 (FP32_OPS)."""
    if tp <= 0:
        raise ConfigError(f"--tp must be >= 1, got {tp}")
    if seq_max <= 0:
        raise ConfigError(f"--seq-max must be >= 1, got {seq_max}")
    heads = _shard(cfg.num_attention_heads, tp, "num_attention_heads")
    kv_heads = _shard(cfg.num_key_value_heads, tp, "num_key_value_heads")
    inter = _shard(cfg.intermediate_size, tp, "intermediate_size")
    layers = cfg.num_hidden_layers
    d = cfg.head_dim
    ops = (
        GemmOp("qkv", n=(heads + 2 * kv_heads) * d, k=cfg.hidden_size, count=layers),
        GemmOp("o", n=cfg.hidden_size, k=heads * d, count=layers),
        *_ffn(cfg, inter, tp),
        GemmOp("lm_head", n=cfg.vocab_size if cfg.vocab_size % tp else cfg.vocab_size // tp,
               k=cfg.hidden_size, m_max=HEAD_M_MAX),
    )
    spec = parse_weights(weights)
    layered = spec.layered()
    if layered and max(layered) >= layers:
        raise ConfigError(f"weights '{spec.name}' name layer {max(layered)}; {cfg.name} has "
                          f"{layers} (0 to {layers - 1})")
    ops = tuple(part for op in ops for part in _by_format(op, spec, layers, kv_heads * d))
    for op in ops:
        check_shape(format_of(op.dtype), (op.k, op.n))  # fp32 (FP32_OPS) takes any K
    return Payload(model=cfg.name, tp=tp, seq_max=seq_max, ops=ops)


def _by_format(op: GemmOp, spec: WeightSpec, layers: int, n_v: int) -> tuple[GemmOp, ...]:
    """`op` in its format, or one op per format where the spec gives the op another in some
    layers (each counting its layers' share of the runs). A layer whose v projection runs
    apart (WeightSpec.split_v) has a "qk" op (q and k fused, in QKV's format) and a "v" op
    (N = `n_v`) in place of its QKV."""
    if op.name in FP32_OPS or op.name == "lm_head":
        return (replace(op, dtype=gemm_dtype(op_format(spec, op.name))),)
    per_layer: Counter[tuple[str, int, str]] = Counter()
    for i in range(layers):
        fmt, v = spec.for_op(op.name, i), spec.split_v(i) if op.name == "qkv" else None
        if v is None:
            per_layer[(op.name, op.n, fmt.name)] += 1
        else:
            per_layer[("qk", op.n - n_v, fmt.name)] += 1
            per_layer[("v", n_v, v.name)] += 1
    return tuple(replace(op, name=name, n=n, dtype=gemm_dtype(fmt), count=op.count * c // layers)
                 for (name, n, fmt), c in sorted(per_layer.items(),
                                                key=lambda kv: (kv[0][0] != op.name, kv[0])))


def _ffn(cfg: ModelConfig, inter: int, tp: int) -> tuple[GemmOp, ...]:
    layers, h = cfg.num_hidden_layers, cfg.hidden_size
    if not cfg.is_moe:
        return (GemmOp("gate_up", n=2 * inter, k=h, count=layers),
                GemmOp("down", n=h, k=inter, count=layers))
    per_token = layers * cfg.num_experts_per_tok
    ops = (GemmOp("router", n=cfg.router_outputs, k=h, count=layers),
           GemmOp("expert_gate_up", n=2 * inter, k=h, count=per_token),
           GemmOp("expert_down", n=h, k=inter, count=per_token))
    if not cfg.shared_expert_intermediate_size:
        return ops
    shared = _shard(cfg.shared_expert_intermediate_size, tp, "shared_expert_intermediate_size")
    return (*ops, GemmOp("shared_gate_up", n=2 * shared, k=h, count=layers),
            GemmOp("shared_down", n=h, k=shared, count=layers))


def resident_bytes(cfg: ModelConfig, *, weights: str = "fp32", tp: int = 1) -> int:
    """Bytes one process holds once the model is loaded in `weights` (a rank's share under
    tp): every projection packed in its GEMM's format (each MoE expert stored once, whatever
    the experts a token runs), plus the float32 embedding the ids look up."""
    total = 4 * cfg.vocab_size * cfg.hidden_size
    for op in make_payload(cfg, tp=tp, seq_max=1, weights=weights).ops:
        stored = (op.count // cfg.num_experts_per_tok * cfg.num_local_experts
                  if op.name.startswith("expert_") else op.count)  # count: layers x experts a token runs
        arrays = layout(format_of(op.dtype), op.k, op.n).values()
        total += stored * sum(math.prod(shape) * dtype.itemsize for shape, dtype in arrays)
    return total
