"""Llama-family model configs (the MoE variants Mixtral, Qwen2-MoE and Qwen3-MoE included): the
embedded ones by name, any HF `config.json` by path, and GGUF files (a path, or an installed
model such as `smollm2`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sandwich.errors import ConfigError
from sandwich.gguf_config import INSTALLED_MODELS, is_gguf, read_gguf_config

DEFAULT_MODEL = "llama-160m"
LLAMA_FAMILY = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"}
# a router and top-k SwiGLU experts in place of the MLP: model_type -> (the config key of the
# expert count, its default, top-k's default), HF's defaults
MOE_TYPES = {"mixtral": ("num_local_experts", 8, 2), "qwen2_moe": ("num_experts", 60, 4),
             "qwen3_moe": ("num_experts", 128, 8)}
QKV_BIAS_TYPES = {"qwen2", "qwen2_moe"}  # biases on q, k and v (none on o): Qwen2Attention
QK_NORM_TYPES = {"qwen3", "qwen3_moe"}  # RMSNorm over each q and k head before RoPE
HEAD_DIM_DEFAULTS = {"qwen3": 128}  # transformers' default where config.json has no head_dim


@dataclass(frozen=True)
class ModelConfig:
    """The fields of an HF Llama config that shape the GEMMs, attention and the KV cache."""

    name: str
    hidden_size: int
    intermediate_size: int  # the MLP's width; in an MoE model, each expert's
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    # MoE: every layer's MLP is `num_local_experts` SwiGLU experts of width intermediate_size,
    # `num_experts_per_tok` of them per token; 0 = a dense model
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    qkv_bias: bool = False  # Qwen2: q, k and v projections add a bias
    qk_norm: bool = False  # Qwen3: each q and k head is RMS-normalized (weights of head_dim)
    model_type: str = "llama"  # HF's: names the tensors (Mixtral's experts vs Qwen's)
    norm_topk_prob: bool = True  # MoE: the top-k routing weights renormalized to sum to 1
    # Qwen2-MoE: a shared SwiGLU expert of this width that every token runs, its output
    # scaled by sigmoid(shared_expert_gate . x); 0 = none
    shared_expert_intermediate_size: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 0

    @property
    def router_outputs(self) -> int:
        """Columns of the router GEMM: one per expert, plus the shared expert's gate."""
        return self.num_local_experts + (1 if self.shared_expert_intermediate_size else 0)


def embedded_models() -> list[str]:
    """Names accepted by `--model` without a path."""
    files = resources.files("sandwich").joinpath("configs").iterdir()
    return sorted(p.name[: -len(".json")] for p in files if p.name.endswith(".json"))


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """Load an embedded config by name, or a `config.json` (or a directory holding one)."""
    raw, source = read_raw_config(name_or_path)
    return parse_model_config(raw, source=source, name=Path(str(name_or_path)).stem)


def read_raw_config(name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """The HF config dict (unvalidated) and a name for it in error messages; a GGUF file
    or an installed model's name gives the dict its metadata implies."""
    if is_gguf(name_or_path):
        return read_gguf_config(name_or_path)
    text, source = _read(str(name_or_path))
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    return raw, source


def _read(name_or_path: str) -> tuple[str, str]:
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a config.json is "
                              f"expected") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    if name_or_path in embedded_models():
        f = resources.files("sandwich").joinpath("configs", f"{name_or_path}.json")
        return f.read_text(), f"embedded model '{name_or_path}'"
    known = ", ".join(embedded_models() + sorted(INSTALLED_MODELS))
    raise ConfigError(f"unknown model '{name_or_path}': not a file, and not one of: {known}")


def _int(raw: dict[str, Any], key: str, source: str, default: int | None = None) -> int:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"{source}: '{key}' must be a positive integer, got {v!r}")
    return v


def _positive_float(raw: dict[str, Any], key: str, source: str, default: float) -> float:
    v = raw.get(key)
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{source}: '{key}' must be a positive number, got {v!r}")
    return float(v)


# the keys the parser reads: an absent one whose near-spelling is present was probably
# mistyped (HF configs carry many keys we do not read, so only near misses are reported)
READ_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
             "num_key_value_heads", "num_hidden_layers", "vocab_size", "head_dim",
             "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
             "rope_parameters", "tie_word_embeddings", "num_local_experts",
             "num_experts_per_tok", "num_experts", "moe_intermediate_size", "norm_topk_prob",
             "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers")


def _warn_near_misses(raw: dict[str, Any], source: str) -> None:
    import difflib
    import warnings

    from sandwich.errors import ConfigWarning

    for key in raw:
        if not isinstance(key, str) or key in READ_KEYS:
            continue
        close = [k for k in difflib.get_close_matches(key, READ_KEYS, n=1, cutoff=0.85)
                 if k not in raw]
        if close:
            warnings.warn(ConfigWarning(f"{source}: unknown key {key!r} is ignored; did you "
                                        f"mean {close[0]!r}?"), stacklevel=3)


def parse_model_config(raw: dict[str, Any], *, source: str, name: str) -> ModelConfig:
    """Validate a config dict: Llama family, positive sizes, heads that divide evenly."""
    _warn_near_misses(raw, source)
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in LLAMA_FAMILY:
        raise ConfigError(
            f"{source}: model_type {model_type!r} is not Llama-family (expected one of {sorted(LLAMA_FAMILY)})"
        )
    hidden = _int(raw, "hidden_size", source)
    heads = _int(raw, "num_attention_heads", source)
    kv_heads = _int(raw, "num_key_value_heads", source, default=heads)
    if heads % kv_heads:
        raise ConfigError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = (raw.get("head_dim") or HEAD_DIM_DEFAULTS.get(model_type)
                or (hidden // heads if hidden % heads == 0 else None))
    if head_dim is None:
        raise ConfigError(f"{source}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; set head_dim")
    moe = _experts(raw, model_type, source)
    _check_unsupported(raw, model_type, source)
    return ModelConfig(
        name=str(raw.get("_name_or_path") or name),
        hidden_size=hidden,
        intermediate_size=moe.pop("intermediate_size", None) or _int(raw, "intermediate_size", source),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=_int(raw, "num_hidden_layers", source),
        vocab_size=_int(raw, "vocab_size", source),
        head_dim=_int({"head_dim": head_dim}, "head_dim", source),
        max_position_embeddings=_int(raw, "max_position_embeddings", source, default=2048),
        rms_norm_eps=_positive_float(raw, "rms_norm_eps", source, 1e-6),
        rope_theta=_positive_float(raw, "rope_theta", source, _dict(
            raw, "rope_parameters", source).get("rope_theta", 10000.0)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_scaling=_dict(raw, "rope_scaling", source) or None,
        qkv_bias=model_type in QKV_BIAS_TYPES,
        qk_norm=model_type in QK_NORM_TYPES,
        model_type=model_type,
        **moe,
    )


def _check_unsupported(raw: dict[str, Any], model_type: str, source: str) -> None:
    """Refuse the variants of the family the executor does not run, in one line each."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported (the "
                          f"Llama family uses 'silu')")
    if raw.get("mlp_bias"):
        raise ConfigError(f"{source}: MLP biases (mlp_bias) are not supported")
    if raw.get("attention_bias") and model_type not in QKV_BIAS_TYPES:
        raise ConfigError(f"{source}: attention_bias (biases on q, k, v and o) is not supported "
                          f"for {model_type}; Qwen2's q/k/v biases are")
    window = raw.get("sliding_window")
    if raw.get("use_sliding_window") and window and window < raw.get("max_position_embeddings", 2048):
        raise ConfigError(f"{source}: sliding-window attention (use_sliding_window, window "
                          f"{window}) is not supported; every layer attends to every position")


def _experts(raw: dict[str, Any], model_type: str, source: str) -> dict[str, Any]:
    """The MoE fields of an MoE type, with HF's defaults ({} for a dense one). A Qwen MoE's
    experts have their own width (moe_intermediate_size), which becomes intermediate_size:
    its dense MLP width is for layers that are not sparse, which are refused here."""
    if model_type not in MOE_TYPES:
        return {}
    key, experts_default, top_k_default = MOE_TYPES[model_type]
    key = key if key in raw or "num_local_experts" not in raw else "num_local_experts"  # HF 5 saves it
    experts = _int(raw, key, source, default=experts_default)
    top_k = _int(raw, "num_experts_per_tok", source, default=top_k_default)
    if top_k > experts:
        raise ConfigError(f"{source}: num_experts_per_tok {top_k} exceeds {key} {experts}; a "
                          f"token cannot pick more experts than the layer has")
    out = {"num_local_experts": experts, "num_experts_per_tok": top_k}
    if model_type == "mixtral":
        return out
    if raw.get("decoder_sparse_step", 1) != 1 or raw.get("mlp_only_layers"):
        raise ConfigError(f"{source}: dense MLP layers among the MoE ones (decoder_sparse_step "
                          f"{raw.get('decoder_sparse_step', 1)}, mlp_only_layers "
                          f"{raw.get('mlp_only_layers')}) are not supported; every layer must be sparse")
    norm = raw.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise ConfigError(f"{source}: 'norm_topk_prob' must be true or false, got {norm!r}")
    out.update(intermediate_size=_int(raw, "moe_intermediate_size", source,
                                      default=1408 if model_type == "qwen2_moe" else 768),
               norm_topk_prob=norm)
    if model_type == "qwen2_moe":
        out["shared_expert_intermediate_size"] = _int(raw, "shared_expert_intermediate_size",
                                                      source, default=5632)
    return out


def _dict(raw: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    v = raw.get(key)
    if v is not None and not isinstance(v, dict):
        raise ConfigError(f"{source}: '{key}' must be an object, got {v!r}")
    return v or {}
