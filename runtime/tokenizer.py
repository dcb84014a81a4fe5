"""Text <-> token ids with the HF `tokenizers` library, set up from what a model ships: a GGUF
file's vocabulary (gpt2 byte-level BPE, split the way llama.cpp splits for the file's
`tokenizer.ggml.pre`; or llama's SentencePiece pieces and scores) or `tokenizer.json` beside
safetensors; the chat template rendered
with jinja2 the way HF renders it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from sandwich.errors import ConfigError, first_line

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), applied in order, each splitting the
# pieces the previous one left; keyed by `tokenizer.ggml.pre`
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("gpt-2", "gpt2", "mpt", "olmo", "jais"), (_GPT2,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva"), (r"\p{N}", _GPT2)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"),
                    (_LLAMA3,)),
    **dict.fromkeys(("qwen2", "stablelm2", "deepseek-r1-qwen"), (_QWEN2,)),
}
# texts of the tokens that end a turn in the chat templates llama.cpp knows
END_OF_TURN = {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "</s>", "<|eom_id|>"}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # llama.cpp token types


@dataclass
class TextTokenizer:
    """What generation needs from a vocabulary: encode, decode, stop tokens, the chat
    template."""

    backend: Any  # tokenizers.Tokenizer
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    stop_ids: frozenset[int] = field(default_factory=frozenset)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Ids of `text`; special tokens written in it (`<|im_start|>`) stay whole."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        bos = self.add_bos if add_bos is None else add_bos
        return ([self.bos_id] if bos and self.bos_id is not None else []) + list(ids)

    def decode(self, ids, *, skip_special: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def stream(self):
        """`step(id) -> str`: text as ids arrive, holding back an incomplete UTF-8 sequence."""
        from tokenizers.decoders import DecodeStream

        ds = DecodeStream(skip_special_tokens=True)
        return lambda token: ds.step(self.backend, token) or ""

    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation, from the model's own template."""
        if not self.chat_template:
            raise ConfigError("this model has no chat template; give a plain prompt instead")
        return render_template(self.chat_template, messages=messages,
                               add_generation_prompt=add_generation_prompt,
                               bos_token=self._text(self.bos_id), eos_token=self._text(self.eos_id))

    def _text(self, token: int | None) -> str:
        return "" if token is None else (self.backend.id_to_token(token) or "")

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for, alone: a byte-level BPE token's bytes (which may end
        inside a UTF-8 character), a SentencePiece piece with its "▁" as a space (a <0xXX>
        piece as its byte), a special token's text; b"" for an id outside the vocabulary."""
        piece = self.backend.id_to_token(token)
        if piece is None:
            return b""
        if self._byte_level:
            table = _unicode_to_byte()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
            return piece.encode()  # an added token, stored as text
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace("▁", " ").encode()

    @cached_property
    def _byte_level(self) -> bool:
        """Whether the decoder maps characters back to bytes (GPT-2's byte-level BPE)."""
        return '"ByteLevel"' in json.dumps(json.loads(self.backend.to_str()).get("decoder"))


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet backwards: the printable Latin-1 bytes stand for
    themselves, every other byte for the character 256 + its rank among those others."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    others = [b for b in range(256) if b not in keep]
    return {chr(b): b for b in keep} | {chr(256 + i): b for i, b in enumerate(others)}


def render_template(template: str, **context) -> str:
    """Render a chat template in the sandbox and with the helpers HF gives its templates."""
    import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ConfigError(f"chat template: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(**context)
    except jinja2.TemplateError as e:
        raise ConfigError(f"chat template cannot be rendered: {e}") from None


def _byte_level_bpe(tokens: list[str], merges: list[str], splits: tuple[str, ...]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm_bpe(tokens: list[str], scores: list[float], types: list[int], *, space_prefix: bool):
    """llama.cpp's SentencePiece vocabulary as a `tokenizers` BPE: llama.cpp merges the adjacent
    pair whose merged token scores highest, so the merges are every split of a vocabulary
    token into two others, ranked by that token's score; spaces become "▁" (one in front of
    the text too, with add_space_prefix); a piece outside the vocabulary falls back to its
    bytes' <0xXX> tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = [i for i, k in enumerate(types) if k in (NORMAL, USER_DEFINED)]
    merges = []
    for i in sorted(mergeable, key=lambda i: (-scores[i], i)):
        t = tokens[i]
        splits = [(vocab[t[:j]], vocab[t[j:]]) for j in range(1, len(t))
                  if t[:j] in vocab and t[j:] in vocab]
        merges += [(tokens[a], tokens[b]) for a, b in sorted(splits)]
    unk = next((tokens[i] for i, k in enumerate(types) if k == UNKNOWN), None)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True,
                               ignore_merges=False))
    steps = [normalizers.Prepend("▁")] if space_prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    tail = [decoders.Strip(" ", 1, 0)] if space_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()] + tail)
    return tok


def from_gguf_metadata(meta: dict[str, Any], *, source: str) -> TextTokenizer:
    """The tokenizer a GGUF file describes (`tokenizer.ggml.*`)."""
    from tokenizers import AddedToken

    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ConfigError(f"{source}: the GGUF file has no vocabulary (tokenizer.ggml.tokens)")
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ConfigError(f"{source}: {len(types)} token types for {len(tokens)} tokens")
    if kind == "llama":
        scores = list(meta.get("tokenizer.ggml.scores") or ())
        if len(scores) != len(tokens):
            raise ConfigError(f"{source}: a SentencePiece vocabulary needs one score per token "
                              f"(tokenizer.ggml.scores), got {len(scores)} for {len(tokens)}")
    elif kind == "gpt2":
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZER_SPLITS:
            raise ConfigError(f"{source}: GGUF pre-tokenizer {pre!r} is not supported "
                              f"({', '.join(sorted(PRE_TOKENIZER_SPLITS))})")
    else:
        raise ConfigError(f"{source}: GGUF tokenizer {kind!r} is not supported (gpt2 byte-level "
                          f"BPE, llama SentencePiece)")
    typed = list(zip(tokens, types, strict=True))
    try:  # a damaged vocabulary or merge list fails inside `tokenizers`, in its own words
        if kind == "llama":
            backend = _spm_bpe(list(tokens), scores, types,
                               space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)))
        else:
            backend = _byte_level_bpe(list(tokens), list(meta.get("tokenizer.ggml.merges") or ()),
                                      PRE_TOKENIZER_SPLITS[pre])
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, k in typed if k == CONTROL])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, k in typed if k == USER_DEFINED])
    except Exception as e:
        raise ConfigError(f"{source}: the GGUF vocabulary (tokenizer.ggml.*) makes no tokenizer: "
                          f"{type(e).__name__}: {first_line(e)}") from None
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    stops = {int(eos)} if eos is not None else set()
    if meta.get("tokenizer.ggml.eot_token_id") is not None:
        stops.add(int(meta["tokenizer.ggml.eot_token_id"]))
    stops |= {i for i, (t, k) in enumerate(typed) if k == CONTROL and t in END_OF_TURN}
    return TextTokenizer(backend, bos_id=None if bos is None else int(bos),
                         eos_id=None if eos is None else int(eos),
                         add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")),
                         chat_template=meta.get("tokenizer.chat_template"),
                         stop_ids=frozenset(stops))


def from_hf_dir(model_dir: Path) -> TextTokenizer:
    """`tokenizer.json` (+ `tokenizer_config.json`) beside a safetensors checkpoint."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{model_dir}: no tokenizer.json; give token ids (--prompt-ids) instead")
    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as e:
        raise ConfigError(f"{path}: not a valid tokenizer.json ({first_line(e)})") from None
    conf_path = model_dir / "tokenizer_config.json"
    conf = json.loads(conf_path.read_text()) if conf_path.is_file() else {}

    def token_id(key: str) -> int | None:
        tok = conf.get(key)
        tok = tok.get("content") if isinstance(tok, dict) else tok
        return backend.token_to_id(tok) if isinstance(tok, str) else None

    bos, eos = token_id("bos_token"), token_id("eos_token")
    stops = {eos} if eos is not None else set()
    stops |= {i for t, i in backend.get_vocab(with_added_tokens=True).items() if t in END_OF_TURN}
    return TextTokenizer(backend, bos_id=bos, eos_id=eos, add_bos=bool(conf.get("add_bos_token")),
                         chat_template=conf.get("chat_template"), stop_ids=frozenset(stops))


def load_tokenizer(model: str | Path) -> TextTokenizer:
    """The tokenizer of a model: a GGUF file (or installed model name), or an HF directory."""
    from sandwich.gguf_config import gguf_path, is_gguf, metadata, open_reader

    if is_gguf(model):
        path = gguf_path(model)
        return from_gguf_metadata(metadata(open_reader(path)), source=str(path))
    return from_hf_dir(Path(model))
