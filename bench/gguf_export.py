"""Write an HF Llama checkpoint as an F32 GGUF file, so llama.cpp runs the same weights.

The serving benchmark compares against llama.cpp on exactly the weights sandwichc loads.
Two things differ from the HF layout: llama.cpp rotates pairs of adjacent lanes in RoPE
where HF rotates the two halves of a head, so the rows of q_proj and k_proj are permuted
per head (as llama.cpp's own converter does); and GGUF wants a vocabulary, so a random
checkpoint gets a placeholder SentencePiece vocabulary (control tokens, the 256 byte
tokens, then `<tN>`) of the model's size. Prompts are given as token ids, so the
placeholder text never matters; a GGUF source keeps its own tokenizer (every `tokenizer.`
key), so a file made from it still reads and writes text.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.gguf_config import ROPE_PERMUTED
from sandwich.runtime.gguf_file import EXPERT_STACKS, ROUTER, gguf_arch, layer_names, rope_permute
from sandwich.runtime.loader import open_checkpoint
from sandwich.runtime.moe_names import SHARED_EXPERT_GATE, moe_names
from sandwich.runtime.rope_tables import RopeSpec, inv_freq


def rope_freq_divisors(rope: RopeSpec) -> np.ndarray:
    """A scaled RoPE (linear, llama3) as llama.cpp takes it: one divisor per frequency in
    `rope_freqs.weight`, here the plain frequencies over the scaled ones."""
    plain = inv_freq(replace(rope, kind="default"))
    return (plain / inv_freq(rope)).astype(np.float32)


def placeholder_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    """<unk>, <s>, </s>, the byte tokens <0x00>..<0xFF>, then <tN>: a vocabulary llama.cpp
    accepts (it looks up the newline byte token) for a model that has none."""
    import gguf

    if size < 3 + 256:
        raise ConfigError(f"vocab_size {size} is too small for a GGUF placeholder vocabulary (>= 259)")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    tokens += [f"<t{i}>" for i in range(len(tokens), size)]
    types += [gguf.TokenType.NORMAL] * (size - len(types))
    return tokens, [0.0] * size, [int(t) for t in types]


def add_spm_vocab(w, tokens: list[str], scores: list[float], types: list[int]) -> None:
    """A llama (SentencePiece) vocabulary with <unk> <s> </s> as ids 0, 1, 2."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def copy_tokenizer(w, source: str | Path) -> bool:
    """Every `tokenizer.` key of a GGUF file `source` (vocabulary, merges, scores, token
    types, special ids, chat template) added to the writer `w` as stored; False where the
    source is not a GGUF file or has no tokenizer."""
    from gguf import GGUFValueType

    from sandwich.gguf_config import open_reader

    if Path(source).suffix != ".gguf" or not Path(source).is_file():
        return False
    fields = [f for name, f in open_reader(Path(source)).fields.items() if name.startswith("tokenizer.")]
    for f in fields:
        array = f.types[0] == GGUFValueType.ARRAY
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[-1] if array else None)
    return bool(fields)


def write_gguf(model_dir: str | Path, out_path: str | Path) -> Path:
    """Convert a model (config.json + safetensors, or a GGUF file of any weight type) to one
    F32 GGUF file, with the GGUF source's tokenizer or else a placeholder vocabulary (the
    peers take token ids); returns its path."""
    try:
        import gguf
    except ImportError:
        raise ConfigError("writing GGUF needs the gguf package (pip install -e .[serving])") from None
    cfg, rope, ckpt = open_checkpoint(model_dir)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    arch = gguf_arch(cfg)
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(cfg.name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if cfg.is_moe:
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        if cfg.shared_expert_intermediate_size:
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if not copy_tokenizer(w, model_dir):
        add_spm_vocab(w, *placeholder_vocab(cfg.vocab_size))

    def f32(name: str) -> np.ndarray:
        return np.ascontiguousarray(ckpt.get(name).to_f32())

    w.add_tensor("token_embd.weight", f32("model.embed_tokens.weight"))
    if rope.kind != "default":
        w.add_tensor("rope_freqs.weight", rope_freq_divisors(rope))
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf, gg in layer_names(arch, moe=cfg.is_moe).items():
            t = f32(p + hf)
            if cfg.model_type in ROPE_PERMUTED and hf.endswith(("q_proj.weight", "k_proj.weight")):
                heads = cfg.num_attention_heads if "q_proj" in hf else cfg.num_key_value_heads
                t = rope_permute(t, heads)
            w.add_tensor(f"blk.{i}.{gg}", t.reshape(-1) if hf == SHARED_EXPERT_GATE else t)
        if cfg.is_moe:  # the router, then each projection's experts stacked
            names = moe_names(cfg.model_type)
            w.add_tensor(f"blk.{i}.{ROUTER}", f32(p + names.router))
            experts = [names.expert(e) for e in range(cfg.num_local_experts)]
            for j, gg in enumerate(EXPERT_STACKS):
                w.add_tensor(f"blk.{i}.{gg}", np.stack([f32(p + x[j]) for x in experts]))
    w.add_tensor("output_norm.weight", f32("model.norm.weight"))
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", f32("lm_head.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out
