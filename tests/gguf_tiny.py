"""A tiny llama (or qwen2, qwen3) GGUF file written the way llama.cpp's converter writes one:
a byte-level BPE vocabulary trained here with `tokenizers` (gpt2 type, control tokens, a chat
template) or a SentencePiece one (llama type: pieces with scores, byte tokens), llama's q/k
rows permuted to GGML's RoPE order, Qwen2's q/k/v biases or Qwen3's q/k head norms, and
tensors in several of GGUF's types."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sandwich.gguf_config import ROPE_PERMUTED
from sandwich.runtime.gguf_file import layer_names, rope_permute

CORPUS = ["the quick brown fox jumps over the lazy dog", "def main():\n    return 42",
          "hello world, hello tokens", "numbers 0123456789 and more", "    indented\tand\ttabbed"]
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONFIG = dict(hidden=64, heads=4, kv=2, ffn=128, layers=2, vocab=320, ctx=256, theta=10000.0)
# one weight type per projection, to exercise the dequantizers and the row layouts; F32 holds
# the most values (with the Q8_0 embedding), so `--weights auto` runs the file in fp32
TYPES = {"attn_q.weight": "Q8_0", "attn_k.weight": "F16", "attn_v.weight": "Q4_0",
         "attn_output.weight": "Q4_1", "ffn_gate.weight": "BF16", "ffn_up.weight": "F32",
         "ffn_down.weight": "F32"}


def train_tokenizer(vocab: int):
    """A byte-level BPE over CORPUS with the gpt2 split, `vocab` tokens in all."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=CONTROL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 50, trainer)
    return tok


def train_spm(pieces: int):
    """A SentencePiece-style BPE over CORPUS ("▁" for spaces), `pieces` tokens."""
    from tokenizers import SentencePieceBPETokenizer

    tok = SentencePieceBPETokenizer()
    tok.train_from_iterator(CORPUS * 50, vocab_size=pieces, show_progress=False)
    return tok


def spm_vocab(size: int):
    """(tokens, scores, types, trained tokenizer) as llama.cpp's converter writes a llama
    SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then the pieces, each
    scored by its rank (earlier merges score higher)."""
    import gguf

    head = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = train_spm(size - len(head))
    pieces = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    pieces = [t for t in pieces if t not in head][: size - len(head)]
    tokens = head + pieces + [f"[PAD{i}]" for i in range(len(head) + len(pieces), size)]
    scores = [0.0] * len(head) + [-float(i) for i in range(len(tokens) - len(head))]
    T = gguf.TokenType
    types = ([T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256
             + [T.NORMAL] * (len(tokens) - len(head)))
    return tokens, scores, [int(t) for t in types], tok


def _add_gpt2_vocab(w, size: int):
    import gguf

    tok = train_tokenizer(size)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), size)]
    merges = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    types = [gguf.TokenType.CONTROL if t in CONTROL else gguf.TokenType.NORMAL for t in tokens]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    return tok


def _add_spm_vocab(w, size: int):
    from sandwich.bench.gguf_export import add_spm_vocab

    tokens, scores, types, tok = spm_vocab(size)
    add_spm_vocab(w, tokens, scores, types)
    return tok


def _tensor(w: np.ndarray, kind: str):
    """(data, raw dtype) as GGUFWriter takes them for a GGML type."""
    import gguf
    from gguf.quants import quantize

    if kind == "F32":
        return w.astype(np.float32), None
    if kind == "F16":
        return w.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "Q4_K":  # the gguf package reads the K-quants but does not write them
        return q4_k_blocks(w), qtype
    if kind == "Q5_K":
        return q5_k_blocks(w), qtype
    if kind == "Q6_K":
        return q6_k_blocks(w), qtype
    return quantize(w.astype(np.float32), qtype), qtype


def q4_k_blocks(w: np.ndarray) -> np.ndarray:
    """Rows of `w` (K a multiple of 256) as Q4_K super-blocks, bytes (rows, K/256*144), laid
    out as ggml's block_q4_K: fp16 d and dmin, 12 bytes of 6-bit sub-block scales and mins
    (get_scale_min_k4's packing), 128 bytes of nibbles (sub-block 2c low, 2c+1 high). A
    plain min/max rounding, not llama.cpp's search: the tests check the layout."""
    rows, k = w.shape
    x = w.astype(np.float32).reshape(rows, k // 256, 8, 32)
    lo = np.minimum(x.min(-1), 0)
    span = (x.max(-1) - lo) / 15
    d = (span.max(-1, keepdims=True) / 63).astype(np.float16)
    dmin = (-lo.min(-1, keepdims=True) / 63).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.round(span / d.astype(np.float32))).clip(0, 63).astype(np.uint8)
        mn = np.nan_to_num(np.round(-lo / dmin.astype(np.float32))).clip(0, 63).astype(np.uint8)
        step = d.astype(np.float32) * sc
        base = dmin.astype(np.float32) * mn
        q = np.nan_to_num(np.round((x + base[..., None]) / step[..., None])).clip(0, 15)
    q = q.astype(np.uint8)
    qs = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).reshape(rows, k // 256, 128)
    return np.concatenate([_k_head(d, dmin, sc, mn), qs], axis=-1).reshape(rows, -1)


def _k_head(d, dmin, sc, mn) -> np.ndarray:
    """(rows, blocks, 16) bytes of block_q4_K's and block_q5_K's head: fp16 d and dmin, then
    the 8 sub-blocks' 6-bit scale and min factors (rows, blocks, 8) packed as
    get_scale_min_k4 reads them."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    packed = np.empty((*sc.shape[:2], 12), np.uint8)
    packed[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    head = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(*sc.shape[:2], 2),
                           dmin.astype(np.float16).view(np.uint8).reshape(*sc.shape[:2], 2)], axis=-1)
    return np.concatenate([head, packed], axis=-1)


def q5_k_blocks(w: np.ndarray) -> np.ndarray:
    """Rows of `w` (K a multiple of 256) as Q5_K super-blocks, bytes (rows, K/256*176), laid
    out as ggml's block_q5_K: Q4_K's head (d, dmin, 12 factor bytes), qh (32 bytes: bit s of
    byte l is the fifth bit of value l of sub-block s), qs (128: as Q4_K's nibbles). The
    values are int5-k's quantizer's, so loading these blocks gives its arrays back."""
    from sandwich.weight_formats import quantize, unpack5

    rows, k = w.shape
    qw = quantize(np.ascontiguousarray(w.T, np.float32), "int5-k")
    v = unpack5(qw.q, qw.high, 32).reshape(rows, k // 256, 8, 32)  # (row, block, sub-block, l)
    qh = sum((v[:, :, s] >> 4) << s for s in range(8)).astype(np.uint8)  # (row, block, 32)
    low = v & 0x0F
    qs = (low[:, :, 0::2] | (low[:, :, 1::2] << 4)).reshape(rows, k // 256, 128)
    head = _k_head(qw.super_scales, qw.super_mins, qw.scales.reshape(rows, -1, 8),
                   qw.mins.reshape(rows, -1, 8))
    return np.concatenate([head, qh, qs], axis=-1).astype(np.uint8).reshape(rows, -1)


def q6_k_blocks(w: np.ndarray) -> np.ndarray:
    """Rows of `w` (K a multiple of 256) as Q6_K super-blocks, bytes (rows, K/256*210), laid
    out as ggml's block_q6_K: ql (128 bytes: in each half of 128 values, byte l holds value l
    low and l + 64 high, of their low 4 bits), qh (64: byte l of a half holds the high 2 bits
    of values l, l + 32, l + 64, l + 96), 16 int8 factors, fp16 d. The values are int6-k's
    quantizer's, so loading these blocks (gguf_blocks._from_q6_k) gives its arrays back."""
    from sandwich.weight_formats import quantize, unpack6

    rows, k = w.shape
    qw = quantize(np.ascontiguousarray(w.T, np.float32), "int6-k")
    v = unpack6(qw.q, qw.high).reshape(rows, k // 256, 2, 4, 32)  # (row, block, half, s, l)
    low, top = v & 0x0F, v >> 4
    ql = np.concatenate([low[..., 0, :] | (low[..., 2, :] << 4),
                         low[..., 1, :] | (low[..., 3, :] << 4)], axis=-1)  # (row, block, half, 64)
    qh = top[..., 0, :] | (top[..., 1, :] << 2) | (top[..., 2, :] << 4) | (top[..., 3, :] << 6)
    scales = qw.scales.view(np.uint8).reshape(rows, k // 256, 16)
    d = qw.super_scales.view(np.uint8).reshape(rows, k // 256, 2)
    parts = [ql.reshape(rows, k // 256, 128), qh.reshape(rows, k // 256, 64), scales, d]
    return np.concatenate(parts, axis=-1).astype(np.uint8).reshape(rows, -1)


def write_tiny_gguf(path: Path, *, seed: int = 0, arch: str = "llama", vocab: str = "gpt2",
                    types: dict[str, str] | None = None, ctx: int | None = None,
                    config: dict | None = None) -> tuple[Path, object]:
    """Write the file with a gpt2 byte-level BPE vocabulary (and a chat template) or a llama
    SentencePiece one (`vocab="spm"`); `types` overrides TYPES (GGUF name -> GGML type, the
    token embedding included; a layer's own as "blk.1.ffn_down.weight"); `ctx` the context length, `config` other CONFIG values;
    returns (path, the trained tokenizer it carries)."""
    types = {**TYPES, "token_embd.weight": "Q8_0", **(types or {})}
    import gguf

    c = CONFIG | (config or {}) | ({"ctx": ctx} if ctx else {})
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-gguf")
    w.add_context_length(c["ctx"])
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv"])
    w.add_rope_dimension_count(c["hidden"] // c["heads"])
    if arch == "qwen3":  # llama.cpp's converter writes a config's head_dim (Qwen3 has one)
        w.add_key_length(c["hidden"] // c["heads"])
        w.add_value_length(c["hidden"] // c["heads"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(c["theta"])
    w.add_vocab_size(c["vocab"])
    tok = (_add_spm_vocab if vocab == "spm" else _add_gpt2_vocab)(w, c["vocab"])
    rng = np.random.default_rng(seed)
    h, d = c["hidden"], c["hidden"] // c["heads"]

    def rand(*shape, std=0.1):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    data, raw = _tensor(rand(c["vocab"], h, std=0.5), types["token_embd.weight"])
    w.add_tensor("token_embd.weight", data, raw_dtype=raw)
    shapes = {"attn_q.weight": (c["heads"] * d, h), "attn_k.weight": (c["kv"] * d, h),
              "attn_v.weight": (c["kv"] * d, h), "attn_output.weight": (h, c["heads"] * d),
              "ffn_gate.weight": (c["ffn"], h), "ffn_up.weight": (c["ffn"], h),
              "ffn_down.weight": (h, c["ffn"])}
    extras = {"qwen2": {"attn_q.bias": (c["heads"] * d,), "attn_k.bias": (c["kv"] * d,),
                        "attn_v.bias": (c["kv"] * d,)},
              "qwen3": {"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)}}.get(arch, {})
    for i in range(c["layers"]):
        for gg in layer_names(arch).values():
            if gg in ("attn_norm.weight", "ffn_norm.weight"):
                w.add_tensor(f"blk.{i}.{gg}", 1 + rand(h))
                continue
            if gg in extras:  # in F32, as llama.cpp writes them
                norm = gg.endswith("norm.weight")  # around 1; biases N(0, 0.5)
                w.add_tensor(f"blk.{i}.{gg}", 1 + rand(*extras[gg]) if norm
                             else rand(*extras[gg], std=0.5))
                continue
            t = rand(*shapes[gg])
            if arch in ROPE_PERMUTED and gg in ("attn_q.weight", "attn_k.weight"):
                t = rope_permute(t, c["heads"] if gg == "attn_q.weight" else c["kv"])
            data, raw = _tensor(t, types.get(f"blk.{i}.{gg}", types[gg]))
            w.add_tensor(f"blk.{i}.{gg}", data, raw_dtype=raw)
    w.add_tensor("output_norm.weight", 1 + rand(h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, tok
