"""The tensors of a Llama-family GGUF file (llama, qwen2, qwen3) under their HF names, as the
loader reads a safetensors checkpoint: each dequantized to float32 when read (the `gguf`
package's own dequantizers: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K and the rest),
with llama's q/k rows put back from llama.cpp's RoPE order. The quantized blocks stay reachable
(`GGUFTensor.raw`) for kernels that run on them without a round trip through fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.gguf_blocks import from_gguf_blocks
from sandwich.gguf_config import ROPE_PERMUTED, GGUFError, hf_config, metadata, open_reader
from sandwich.models import ModelConfig
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
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# the layer tensors an architecture has beyond Llama's
ARCH_LAYER_NAMES = {
    "qwen2": {"self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.bias": "attn_v.bias"},
    "qwen3": {"self_attn.q_norm.weight": "attn_q_norm.weight",
              "self_attn.k_norm.weight": "attn_k_norm.weight"},
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_arch(cfg: ModelConfig) -> str:
    """The GGUF architecture llama.cpp runs a model as: qwen2 (q/k/v biases), qwen3 (q/k head
    norms) or llama."""
    return "qwen2" if cfg.qkv_bias else "qwen3" if cfg.qk_norm else "llama"


def layer_names(arch: str) -> dict[str, str]:
    """HF name inside a decoder layer -> GGUF name inside `blk.{i}.`, for `arch`."""
    return LAYER_NAMES | ARCH_LAYER_NAMES.get(arch, {})


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

    def __init__(self, raw, path: Path, rope_heads: int | None = None) -> None:
        self.raw, self.path, self.rope_heads = raw, path, rope_heads
        self.shape = tuple(int(d) for d in reversed(raw.shape.tolist()))  # GGML lists ne0 first
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
        type is the one `fmt` reproduces (Q8_0 for int8-g32, Q4_0, Q4_1); else None."""
        if fmt.ggml_type is None or fmt.ggml_type != self.dtype or not fmt.quantized:
            return None
        try:
            qw = from_gguf_blocks(self.raw.data, self.dtype, self.shape)
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
        heads, kv = self.config["num_attention_heads"], self.config["num_key_value_heads"]
        permuted = self.config["model_type"] in ROPE_PERMUTED
        self._where: dict[str, GGUFTensor] = {}
        for hf, gg in GLOBAL_NAMES.items():
            if gg in tensors:
                self._where[hf] = GGUFTensor(tensors[gg], self.path)
        for i in range(self.config["num_hidden_layers"]):
            for hf, gg in layer_names(self.config["model_type"]).items():
                t = tensors.get(f"blk.{i}.{gg}")
                if t is not None:
                    rope = (heads if "q_proj.weight" in hf else kv if "k_proj.weight" in hf
                            else None) if permuted else None
                    self._where[f"model.layers.{i}.{hf}"] = GGUFTensor(t, self.path, rope)
        self.rope_freqs = tensors.get("rope_freqs.weight")

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def get(self, name: str) -> GGUFTensor:
        t = self._where.get(name)
        if t is None:
            raise CheckpointError(f"{self.path}: GGUF file has no tensor for '{name}'")
        return t
