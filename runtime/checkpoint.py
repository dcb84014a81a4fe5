"""Random-weight HF-format Llama-family checkpoints (MoE ones too): there is no hub here, so tests and
benchmarks make their own, in exactly the format (config.json + model.safetensors, HF tensor
names) that a downloaded model has."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.models import ModelConfig, parse_model_config, read_raw_config
from sandwich.runtime.moe_names import SHARED_EXPERT, SHARED_EXPERT_GATE, moe_names
from sandwich.runtime.safetensors_io import SINGLE_NAME, save_file, save_sharded

# the transformers class of each model_type (the rest load as LlamaForCausalLM)
ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM"}


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor of a Llama model with its (out, in) shape, in save_pretrained's order;
    an MoE layer has the hub's per-expert names (runtime/moe_names.py), which transformers
    fuses into its expert tensors on load."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (cfg.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": (cfg.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": (cfg.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": (h, cfg.num_attention_heads * d),
        })
        if cfg.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (cfg.num_attention_heads * d,),
                           p + "self_attn.k_proj.bias": (cfg.num_key_value_heads * d,),
                           p + "self_attn.v_proj.bias": (cfg.num_key_value_heads * d,)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        if cfg.is_moe:
            names = moe_names(cfg.model_type)
            shapes[p + names.router] = (cfg.num_local_experts, h)
            for e in range(cfg.num_local_experts):
                shapes.update(_swiglu(p, names.expert(e), h, inter))
            if cfg.shared_expert_intermediate_size:
                shapes.update(_swiglu(p, SHARED_EXPERT, h, cfg.shared_expert_intermediate_size))
                shapes[p + SHARED_EXPERT_GATE] = (1, h)
        else:
            shapes.update({p + "mlp.gate_proj.weight": (inter, h),
                           p + "mlp.up_proj.weight": (inter, h),
                           p + "mlp.down_proj.weight": (h, inter)})
        shapes.update({p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def _swiglu(prefix: str, names: tuple[str, str, str], hidden: int,
            inter: int) -> dict[str, tuple[int, int]]:
    gate, up, down = names
    return {prefix + gate: (inter, hidden), prefix + up: (inter, hidden),
            prefix + down: (hidden, inter)}


def random_weights(cfg: ModelConfig, *, seed: int, std: float = 0.02,
                   norm_std: float = 0.0) -> dict[str, np.ndarray]:
    """HF's initializer: matrices ~ N(0, std), norm weights 1 (plus N(0, norm_std) when a test
    wants the norm weights to matter); biases ~ N(0, 0.5) (HF's are 0, which would hide a
    bias the executor forgot)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith(".bias"):
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
        elif len(shape) == 1:
            w = np.ones(shape, np.float32)
            if norm_std:
                w += rng.standard_normal(shape, dtype=np.float32) * np.float32(norm_std)
        else:
            w = rng.standard_normal(shape, dtype=np.float32)
            w *= np.float32(std)
        out[name] = w
    return out


def write_checkpoint(config: str | Path, out_dir: str | Path, *, seed: int = 0,
                     layers: int | None = None, norm_std: float = 0.0, shards: int = 1,
                     bf16: bool = False) -> Path:
    """Write config.json + model.safetensors (or `shards` files + index) for a random model."""
    raw, source = read_raw_config(config)
    raw = dict(raw)
    if layers is not None:
        if layers < 1:
            raise ConfigError(f"--layers must be >= 1, got {layers}")
        raw["num_hidden_layers"] = layers
    cfg = parse_model_config(raw, source=source, name=Path(str(config)).stem)
    std = float(raw.get("initializer_range", 0.02))
    weights = random_weights(cfg, seed=seed, std=std, norm_std=norm_std)
    raw.setdefault("architectures", [ARCHITECTURES.get(raw["model_type"], "LlamaForCausalLM")])
    raw["torch_dtype"] = "bfloat16" if bf16 else "float32"
    raw["initializer_range"] = std
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    if shards > 1:
        save_sharded(weights, out, shards=shards)
    else:
        save_file(weights, out / SINGLE_NAME, metadata={"format": "pt"},
                  bf16=frozenset(weights) if bf16 else frozenset())
    return out
