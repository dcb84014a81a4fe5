"""The tensors of a Llama-family GGUF file (llama and Mixtral, qwen2, qwen3, qwen2moe, qwen3moe)
under their HF names, as the loader reads a safetensors checkpoint: each dequantized to float32
when read (the `gguf` package's own dequantizers: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K,
Q6_K and the rest), with llama's q/k rows put back from llama.cpp's RoPE order. The quantized
blocks stay reachable (`GGUFTensor.raw`) for kernels that run on them without a round trip
through fp32 (`GGUFTensor.blocks`: Q8_0, Q4_0, Q4_1, Q4_K). An MoE layer's experts are stacked
in one tensor per projection; each expert reads as its own tensor, a view of its blocks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sandwich.errors import ConfigError
from sandwich.gguf_blocks import from_gguf_blocks, loads_into
from sandwich.gguf_config import (
    GGUF_ARCHITECTURES,
    ROPE_PERMUTED,
    GGUFError,
    hf_config,
    metadata,
    open_reader,
)
from sandwich.models import ModelConfig
from sandwich.runtime.moe_names import SHARED_EXPERT, SHARED_EXPERT_GATE, moe_names
from sandwich.runtime.safetensors_io import CheckpointError
from sandwich.weight_formats import QuantizedWeight, WeightFormat, take_columns

# HF name inside a decoder layer -> GGUF name inside `blk.{i}.`
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
DENSE_MLP_NAMES = {
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
QKV_BIASES = {"self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.bias": "attn_v.bias"}
HEAD_NORMS = {"self_attn.q_norm.weight": "attn_q_norm.weight",
              "self_attn.k_norm.weight": "attn_k_norm.weight"}
SHARED_EXPERT_NAMES = dict(zip(SHARED_EXPERT, ("ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                                               "ffn_down_shexp.weight"), strict=True))
SHARED_EXPERT_NAMES[SHARED_EXPERT_GATE] = "ffn_gate_inp_shexp.weight"  # stored as a vector
# the layer tensors an architecture has beyond Llama's
ARCH_LAYER_NAMES = {"qwen2": QKV_BIASES, "qwen3": HEAD_NORMS,
                    "qwen2moe": QKV_BIASES | SHARED_EXPERT_NAMES, "qwen3moe": HEAD_NORMS}
# an MoE layer: the router, and each projection's experts stacked (experts, rows, cols)
ROUTER = "ffn_gate_inp.weight"
EXPERT_STACKS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_arch(cfg: ModelConfig) -> str:
    """The GGUF architecture llama.cpp runs a model as (Mistral's and Mixtral's: llama)."""
    return {t: a for a, t in GGUF_ARCHITECTURES.items()}.get(cfg.model_type, "llama")


def layer_names(arch: str, *, moe: bool = False) -> dict[str, str]:
    """HF name inside a decoder layer -> GGUF name inside `blk.{i}.`, for `arch`: every
    tensor but a (routed) MoE layer's router and experts (`EXPERT_STACKS`)."""
    return LAYER_NAMES | ({} if moe else DENSE_MLP_NAMES) | ARCH_LAYER_NAMES.get(arch, {})


@dataclass(frozen=True)
class ExpertSlice:
    """Expert e of a stacked GGUF tensor, shaped as the reader's tensors are (`shape` in
    GGML's order, `data` the expert's rows of blocks)."""

    name: str
    data: np.ndarray
    tensor_type: Any
    shape: np.ndarray

    @classmethod
    def of(cls, stack, e: int) -> ExpertSlice:
        return cls(f"{stack.name}[{e}]", stack.data[e], stack.tensor_type, stack.shape[:2])


def rope_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q/k projection from HF's half-split RoPE order to GGML's interleaved one
    (what llama.cpp's converter does)."""
    out, inp = w.shape
    return w.reshape(heads, 2, out // heads // 2, inp).swapaxes(1, 2).reshape(out, inp)


def rope_unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `rope_permute`: GGML's interleaved rows back to HF's half-split order."""
    out, inp = w.shape
    return w.reshape(heads, out // heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


class GGUFTensor:
    """One tensor of the file: `shape` in HF's (out, in) order, `to_f32()` dequantizes."""

    def __init__(self, raw, path: Path, rope_heads: int | None = None,
                 shape: tuple[int, ...] | None = None) -> None:
        """`shape` overrides the stored one where HF's has another rank (a vector GGUF keeps
        for a one-row matrix)."""
        self.raw, self.path, self.rope_heads = raw, path, rope_heads
        self.shape = shape or tuple(int(d) for d in reversed(raw.shape.tolist()))  # ne0 first
        self.dtype = raw.tensor_type.name

    def to_f32(self) -> np.ndarray:
        from gguf.quants import dequantize

        try:
            w = np.asarray(dequantize(self.raw.data, self.raw.tensor_type), np.float32)
            w = w.reshape(self.shape)
        except Exception as e:  # a truncated tensor or an unknown block type
            raise GGUFError(f"{self.path}: tensor '{self.raw.name}' ({self.dtype}) cannot be "
                            f"read ({str(e).strip() or type(e).__name__})") from None
        return rope_unpermute(w, self.rope_heads) if self.rope_heads else w

    def blocks(self, fmt: WeightFormat) -> QuantizedWeight | None:
        """W = T.T in `fmt` from the stored blocks, without re-quantizing, when the tensor's
        type loads into `fmt` (Q8_0 into int8-g32, Q4_0 into int4-g32, Q4_1 into
        int4-g32-asym, Q4_K into int4-k or int4-g32-asym, Q6_K into int6-k:
        gguf_blocks.loads_into); else None."""
        if not fmt.quantized or fmt.name not in loads_into(self.dtype):
            return None
        try:
            qw = from_gguf_blocks(self.raw.data, self.dtype, self.shape, fmt.name)
        except ConfigError as e:
            raise GGUFError(f"{self.path}: tensor '{self.raw.name}': {e}") from None
        if self.rope_heads:  # the HF row order is a permutation of whole rows (columns of W)
            n = self.shape[0]
            order = rope_unpermute(np.arange(n)[:, None], self.rope_heads)[:, 0]
            qw = take_columns(qw, order)
        return qw


class GGUFCheckpoint:
    """Every weight of a GGUF file, looked up by its HF name (the loader's interface)."""

    def __init__(self, path: str | Path) -> None:
        self.dir = self.path = Path(path)
        reader = open_reader(self.path)
        self.metadata = metadata(reader)
        tensors = {t.name: t for t in reader.tensors}
        self.config = hf_config(self.metadata, set(tensors), source=str(self.path))
        c = self.config
        heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
        permuted = c["model_type"] in ROPE_PERMUTED
        moe = "num_experts_per_tok" in c
        self._where: dict[str, GGUFTensor] = {}
        for hf, gg in GLOBAL_NAMES.items():
            if gg in tensors:
                self._where[hf] = GGUFTensor(tensors[gg], self.path)
        arch = self.metadata["general.architecture"]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            for hf, gg in layer_names(arch, moe=moe).items():
                t = tensors.get(f"blk.{i}.{gg}")
                if t is not None:
                    rope = (heads if "q_proj.weight" in hf else kv if "k_proj.weight" in hf
                            else None) if permuted else None
                    shape = (1, c["hidden_size"]) if hf == SHARED_EXPERT_GATE else None
                    self._where[p + hf] = GGUFTensor(t, self.path, rope, shape)
            if moe:
                self._add_experts(p, {gg: tensors.get(f"blk.{i}.{gg}") for gg in (ROUTER, *EXPERT_STACKS)})
        self.rope_freqs = tensors.get("rope_freqs.weight")

    def _add_experts(self, prefix: str, found: dict[str, Any]) -> None:
        """One layer's router and each expert's projections, as views of the stacks."""
        names = moe_names(self.config["model_type"])
        if found[ROUTER] is not None:
            self._where[prefix + names.router] = GGUFTensor(found[ROUTER], self.path)
        for j, gg in enumerate(EXPERT_STACKS):  # each stack holds its experts' rows
            stack = found[gg]
            for e in range(int(stack.shape[2]) if stack is not None else 0):
                self._where[prefix + names.expert(e)[j]] = GGUFTensor(ExpertSlice.of(stack, e), self.path)

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def get(self, name: str) -> GGUFTensor:
        t = self._where.get(name)
        if t is None:
            raise CheckpointError(f"{self.path}: GGUF file has no tensor for '{name}'")
        return t
