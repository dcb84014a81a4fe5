"""Load an HF Llama-family directory or a GGUF file and pack its weights once into the cached GEMMs' layouts.

QKV and gate/up are fused along N (column blocks [q | k | v] and [gate | up]), matching the
payload the tuner tuned, so each layer runs four GEMMs. An MoE layer (Mixtral, Qwen2/3-MoE) has a
packed router and each expert's fused gate/up and down instead of the MLP (runtime/moe.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sandwich.compiler.buffers import aligned_copy
from sandwich.errors import ConfigError, ShapeError
from sandwich.gguf_config import gguf_path, is_gguf
from sandwich.models import ModelConfig, parse_model_config, read_raw_config
from sandwich.payload import op_format
from sandwich.runtime.checkpoint import tensor_shapes
from sandwich.runtime.gguf_file import GGUFCheckpoint, GGUFTensor
from sandwich.runtime.moe import MoeWeights, pack_moe
from sandwich.runtime.rope_tables import RopeSpec, rope_spec
from sandwich.runtime.safetensors_io import Checkpoint
from sandwich.tuner.kernel_cache import GemmKernel, KernelCache, PackedWeight
from sandwich.weight_formats import (
    QuantizedWeight,
    WeightFormat,
    WeightSpec,
    concat_columns,
    format_of,
    gemm_dtype,
    parse_weights,
    quantize,
    take_columns,
    take_rows,
)


@dataclass(frozen=True)
class ModelGemms:
    """The tuned GEMM of each projection (ops sharing (N, K) share a kernel); in an MoE model
    gate_up and down are every expert's (same shapes as a dense MLP of the expert's width)."""

    qkv: GemmKernel | None  # None where every layer runs q|k and v apart (qk, v)
    o: GemmKernel
    gate_up: GemmKernel
    down: GemmKernel
    lm_head: GemmKernel
    router: GemmKernel | None = None  # MoE: K=hidden, N=experts (+ the shared expert's gate)
    shared_gate_up: GemmKernel | None = None  # Qwen2-MoE's shared expert: K=hidden, N=2 shared
    shared_down: GemmKernel | None = None  # K=shared, N=hidden
    # a layer whose v projection runs apart (WeightSpec.split_v): q and k fused, and v
    qk: GemmKernel | None = None  # K=hidden, N=(H + KVH) D
    v: GemmKernel | None = None  # K=hidden, N=KVH D
    # layer -> the GEMMs of a layer whose spec gives some op another format (WeightSpec's
    # op@layer overrides: a Q4_K_M file's Q6_K ffn_down in some layers)
    per_layer: Mapping[int, ModelGemms] = field(default_factory=dict)

    def at(self, layer: int) -> ModelGemms:
        """The GEMMs layer `layer` runs."""
        return self.per_layer.get(layer, self)

    def with_layer_formats(self, spec: WeightSpec, kernel: Callable[[int, int, WeightFormat], GemmKernel],
                           *, layers: int, qk: tuple[int, int], v: tuple[int, int]) -> ModelGemms:
        """These GEMMs with the spec's per-layer formats: `kernel(n, k, fmt)` is the kernel of
        that shape for weights in `fmt`; `qk` and `v` the (N, K) of a layer's fused q|k and of
        its v where it runs v apart. Layers with the same overrides share one ModelGemms."""
        shapes = {"qk": qk, "v": v}
        made: dict[tuple, ModelGemms] = {}
        per_layer = {}
        layered = spec.layered()
        for layer in range(layers):
            split = spec.split_v(layer)
            ops = {op: f for op, f in layered.get(layer, {}).items()
                   if op != "v" and not (split and op == "qkv")}
            if not ops and split is None:
                continue
            if split is not None:  # q and k in QKV's format, v in its own
                ops |= {"qk": spec.for_op("qkv", layer), "v": split}
            key = tuple(sorted((op, f.name) for op, f in ops.items()))
            if key not in made:
                swaps = {}
                for op, f in ops.items():
                    name = GEMM_FIELDS.get(op, op)
                    g = getattr(self, name)
                    swaps[name] = kernel(*(shapes[op] if op in shapes else (g.n_out, g.k)), f)
                made[key] = replace(self, **swaps)
            per_layer[layer] = made[key]
        return replace(self, per_layer=per_layer)


# payload op names whose kernels ModelGemms holds under another name
GEMM_FIELDS = {"expert_gate_up": "gate_up", "expert_down": "down"}


@dataclass(frozen=True)
class LayerWeights:
    input_norm: np.ndarray  # (hidden,)
    qkv: PackedWeight  # K=hidden, N=(H + 2 KVH) D; [q | k] only, N=(H + KVH) D, where `v` is set
    o: PackedWeight  # K=H D, N=hidden
    post_norm: np.ndarray  # (hidden,)
    gate_up: PackedWeight | None = None  # K=hidden, N=2 inter (None in an MoE layer)
    down: PackedWeight | None = None  # K=inter, N=hidden
    moe: MoeWeights | None = None  # router and experts in place of the MLP
    qkv_bias: np.ndarray | None = None  # Qwen2: ((H + 2 KVH) D,), [q | k | v] as the GEMM's N
    q_norm: np.ndarray | None = None  # Qwen3: (D,), every q head's RMSNorm weight
    k_norm: np.ndarray | None = None  # Qwen3: (D,), every k head's
    v: PackedWeight | None = None  # the v projection apart (ModelGemms.v), K=hidden, N=KVH D


@dataclass(frozen=True)
class LlamaModel:
    """Everything the executor needs: config, RoPE spec, packed weights and their GEMMs."""

    config: ModelConfig
    rope: RopeSpec
    embed: np.ndarray  # (vocab, hidden) float32; may be a read-only view of the mapped file
    layers: tuple[LayerWeights, ...]
    norm: np.ndarray
    lm_head: PackedWeight  # K=hidden, N=vocab (the embedding when tied)
    gemms: ModelGemms  # prefill's (and decode's when it has none of its own)
    decode_gemms: ModelGemms | None = None  # tuned for decode's thread count, same layouts


def open_checkpoint(model: str | Path) -> tuple[ModelConfig, RopeSpec, Checkpoint | GGUFCheckpoint]:
    """An HF directory (config.json + safetensors) or a GGUF file (a path, or an installed
    model's name such as `smollm2`): its config, RoPE and tensors under HF names."""
    if not is_gguf(model):
        cfg, rope = read_config(model)
        return cfg, rope, Checkpoint(model)
    ckpt = GGUFCheckpoint(gguf_path(model))
    source = str(ckpt.path)
    cfg = parse_model_config(ckpt.config, source=source, name=ckpt.path.stem)
    rope = rope_spec(ckpt.config, head_dim=cfg.head_dim, source=source)
    if ckpt.rope_freqs is not None:  # llama3-style scaling, as llama.cpp stores it
        divisors = GGUFTensor(ckpt.rope_freqs, ckpt.path).to_f32().reshape(-1)
        rope = replace(rope, kind="freqs", divisors=tuple(float(x) for x in divisors))
    return cfg, rope, ckpt


def read_config(model_dir: str | Path) -> tuple[ModelConfig, RopeSpec]:
    """Validate config.json: Llama family (Qwen2's q/k/v biases and Qwen3's q/k norms
    included), SiLU, a supported RoPE (a GGUF file's config comes from its metadata)."""
    if is_gguf(model_dir):
        cfg, rope, _ = open_checkpoint(model_dir)
        return cfg, rope
    d = Path(model_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: no such model directory")
    if not (d / "config.json").is_file():
        raise ConfigError(f"{d}: no config.json; an HF model directory needs one")
    raw, source = read_raw_config(d)
    cfg = parse_model_config(raw, source=source, name=d.name)
    return cfg, rope_spec(raw, head_dim=cfg.head_dim, source=source)


def model_gemms(cfg: ModelConfig, cache: KernelCache, *, threads: int | None = None,
                weights: str = "fp32") -> ModelGemms:
    """Look up every projection's GEMM for the weight spec `weights` (their kernels
    dequantize an int format as they read it; an MoE router's stays fp32, as the payload's
    FP32_OPS); a CacheError names the shape to tune. An MoE model's dense names stand for
    its experts' GEMMs (gate_up for expert_gate_up, down for expert_down)."""
    h, d = cfg.hidden_size, cfg.head_dim
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    spec = parse_weights(weights)
    expert = "expert_" if cfg.is_moe else ""

    def gemm(n: int, k: int, op: str) -> GemmKernel:
        fmt = op_format(spec, op, cfg.num_hidden_layers)
        return cache.gemm(n=n, k=k, dtype=gemm_dtype(fmt), threads=threads)

    fused = any(spec.split_v(i) is None for i in range(cfg.num_hidden_layers))
    base = ModelGemms(
        qkv=gemm((heads + 2 * kv) * d, h, "qkv") if fused else None,  # None: every layer splits v
        o=gemm(h, heads * d, "o"),
        gate_up=gemm(2 * cfg.intermediate_size, h, expert + "gate_up"),
        down=gemm(h, cfg.intermediate_size, expert + "down"),
        lm_head=gemm(cfg.vocab_size, h, "lm_head"),
        router=gemm(cfg.router_outputs, h, "router") if cfg.is_moe else None,
        **_shared_gemms(cfg, gemm),
    )
    return base.with_layer_formats(
        spec, lambda n, k, fmt: cache.gemm(n=n, k=k, dtype=gemm_dtype(fmt), threads=threads),
        layers=cfg.num_hidden_layers, qk=((heads + kv) * d, h), v=(kv * d, h))


def _shared_gemms(cfg: ModelConfig, gemm: Callable[[int, int, str], GemmKernel]) -> dict[str, GemmKernel]:
    """A Qwen2-MoE shared expert's gate/up and down GEMMs; none for other models."""
    s = cfg.shared_expert_intermediate_size
    return {"shared_gate_up": gemm(2 * s, cfg.hidden_size, "shared_gate_up"),
            "shared_down": gemm(cfg.hidden_size, s, "shared_down")} if s else {}


class WeightReader:
    """Fetches tensors as float32, checking names and shapes against the config."""

    def __init__(self, ckpt: Checkpoint | GGUFCheckpoint, cfg: ModelConfig) -> None:
        self.ckpt, self.shapes = ckpt, tensor_shapes(cfg)
        self._last: tuple[tuple, np.ndarray] | None = None  # ((tensor, rope, shape), values)
        missing = [n for n in self.shapes if n not in ckpt]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ShapeError(f"{ckpt.dir}: checkpoint lacks {', '.join(missing[:3])}{more}; "
                             f"it does not match config.json")
        for name, want in self.shapes.items():  # headers only: no data is read yet
            got = ckpt.get(name).shape
            if got != want:
                raise ShapeError(f"{ckpt.dir}: tensor '{name}' has shape {list(got)}, "
                                 f"config.json implies {list(want)}")

    def __call__(self, name: str) -> np.ndarray:
        """The tensor as float32; the last one read is kept (a tied embedding is read again
        as the lm_head, a GGUF file's under another name, and a large vocabulary's
        dequantization takes seconds). Experts read on several threads: each keeps its own
        reference to what it read."""
        t = self.ckpt.get(name)
        src = (getattr(t, "raw", t), getattr(t, "rope_heads", None), tuple(t.shape))
        last = self._last
        if last is None or last[0][0] is not src[0] or last[0][1:] != src[1:]:
            last = self._last = (src, t.to_f32())
        return last[1]

    def blocks(self, name: str, fmt: WeightFormat) -> QuantizedWeight | None:
        """W = T.T as stored when the checkpoint holds T in `fmt` (a GGUF's Q8_0, Q4_0 or
        Q4_1 blocks), else None."""
        blocks = getattr(self.ckpt.get(name), "blocks", None)  # safetensors: float only
        return blocks(fmt) if blocks is not None else None

    def projection(self, parts: list[tuple[str, slice]], fmt: WeightFormat,
                   cols: slice = slice(None)) -> np.ndarray | QuantizedWeight:
        """W (K, N) of the rows `parts` ((name, row slice) pairs fused along N) and the
        columns `cols` of HF tensors (a tensor-parallel rank's share of K).

        An int format gets the stored blocks when they are already in `fmt`; a share of K
        is cut from the whole K quantized (its groups and scales, as one process has them).
        Otherwise float32 (the GEMM quantizes it when it packs)."""
        k = self.shapes[parts[0][0]][1]
        whole = range(k)[cols] == range(k)
        if fmt.quantized:
            blocks = [self.blocks(name, fmt) for name, _ in parts]
            if all(b is not None for b in blocks):
                w = concat_columns([take_columns(b, np.arange(b.shape[1])[rows])
                                    for b, (_, rows) in zip(blocks, parts, strict=True)])
                return w if whole else take_rows(w, cols)
            if not whole:
                return take_rows(quantize(self._float(parts).T, fmt), cols)
        return self._float(parts)[:, cols].T

    def pack(self, gemm: GemmKernel, parts: list[tuple[str, slice]],
             cols: slice = slice(None)) -> PackedWeight:
        """`projection(parts, ..., cols)` read in `gemm`'s weight format, packed by it."""
        return gemm.pack(self.projection(parts, format_of(gemm.dtype), cols))

    def _float(self, parts: list[tuple[str, slice]]) -> np.ndarray:
        """The rows `parts` of HF tensors (N, K), float32, fused along N."""
        picked = [self(name)[rows] for name, rows in parts]
        return picked[0] if len(picked) == 1 else np.concatenate(picked)


def load_model(model: str | Path, cache: KernelCache, *, threads: int | None = None,
               decode_threads: int | None = None, weights: str = "fp32") -> LlamaModel:
    """Read the config and the weights (HF directory or GGUF file), fuse and pack every
    projection once, in the format `weights` (quantized here from the checkpoint's values).
    With `decode_threads` other than `threads`, decode gets the kernels tuned for its own
    thread count (Sandwich: each phase its own kernel collection)."""
    cfg, rope, ckpt = open_checkpoint(model)
    read = WeightReader(ckpt, cfg)  # checkpoint errors before kernel lookups
    check_memory(cfg, weights=weights)
    gemms = model_gemms(cfg, cache, threads=threads, weights=weights)
    decode = None
    if decode_threads is not None and decode_threads != threads:
        decode = model_gemms(cfg, cache, threads=decode_threads, weights=weights)
        check_same_layouts(gemms, decode)
    return replace(pack_model(read, cfg, rope, gemms), decode_gemms=decode)


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable in bytes (Linux), or None where the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(cfg: ModelConfig, *, weights: str = "fp32", tp: int = 1,
                 meminfo: Path = Path("/proc/meminfo")) -> None:
    """A one-line ConfigError, before any weight is read, when the model packed in `weights`
    (a rank's share under tp) would not fit in the memory available, naming the formats
    that would: a 30B MoE in fp32 would otherwise be killed by the kernel minutes into its
    load, or swap the machine to a halt."""
    from sandwich.payload import resident_bytes

    avail = available_memory(meminfo)
    need = resident_bytes(cfg, weights=weights, tp=tp)
    if avail is None or need <= avail:
        return
    smaller = {f: resident_bytes(cfg, weights=f, tp=tp) for f in ("bf16", "int8-g32", "int4-g32")}
    fits = [f"{f} ({size / 1e9:.1f} GB)" for f, size in smaller.items() if size <= avail]
    hint = (f"choose --weights {' or '.join(fits)}" if fits
            else "no weight format fits: use a machine with more memory")
    raise ConfigError(f"{cfg.name} with {weights} weights needs {need / 1e9:.1f} GB, and "
                      f"{avail / 1e9:.1f} GB of memory is available; {hint}")


def check_same_layouts(a: ModelGemms, b: ModelGemms) -> None:
    """Both phases read one copy of the packed weights: their kernels must share a layout."""
    for layer in a.per_layer:
        _check_same_layouts(a.at(layer), b.at(layer))
    _check_same_layouts(a, b)


def _check_same_layouts(a: ModelGemms, b: ModelGemms) -> None:
    for name in ("qkv", "o", "gate_up", "down", "lm_head", "router", "shared_gate_up", "shared_down",
                 "qk", "v"):
        ga, gb = getattr(a, name), getattr(b, name)
        if ga is None or gb is None:
            continue
        if ga.pack_n != gb.pack_n:
            raise ConfigError(f"{name} (N={ga.n_out} K={ga.k}): the kernels tuned for the two "
                              f"phases' thread counts pack the weights differently ({ga.pack_n} "
                              f"vs {gb.pack_n}); tune both again")


def pack_model(read: WeightReader, cfg: ModelConfig, rope: RopeSpec, gemms: ModelGemms, *,
               local: ModelConfig | None = None, rank: int = 0,
               vocab_rows: int | None = None) -> LlamaModel:
    """Read and pack the weights of `cfg`'s checkpoint into `gemms`' layouts.

    With `local` (one tensor-parallel rank's config, runtime/shard.py) only rank `rank`'s
    heads and intermediate columns are kept, and with `vocab_rows` only its lm_head rows;
    by default the whole model."""
    local = local or cfg
    d = cfg.head_dim
    q = slice(rank * local.num_attention_heads * d, (rank + 1) * local.num_attention_heads * d)
    kv = slice(rank * local.num_key_value_heads * d, (rank + 1) * local.num_key_value_heads * d)
    mlp = slice(rank * local.intermediate_size, (rank + 1) * local.intermediate_size)
    s = local.shared_expert_intermediate_size
    shared = slice(rank * s, (rank + 1) * s)
    layers = []
    for i in range(cfg.num_hidden_layers):
        p, g = f"model.layers.{i}.", gemms.at(i)
        parts = [(p + "self_attn.q_proj.", q), (p + "self_attn.k_proj.", kv),
                 (p + "self_attn.v_proj.", kv)]
        weights = [(name + "weight", rows) for name, rows in parts]
        apart = {} if g.v is None else {"v": read.pack(g.v, weights[2:])}
        layers.append(LayerWeights(
            input_norm=aligned_copy(read(p + "input_layernorm.weight")),
            qkv=read.pack(g.qkv, weights) if g.v is None else read.pack(g.qk, weights[:2]),
            o=read.pack(g.o, [(p + "self_attn.o_proj.weight", slice(None))], q),
            post_norm=aligned_copy(read(p + "post_attention_layernorm.weight")),
            **_ffn(read, p, cfg, g, mlp, shared),
            **_attention_extras(read, p, cfg, parts), **apart,
        ))
    embed = read("model.embed_tokens.weight")
    head_name = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    rows = slice(None) if vocab_rows is None else slice(rank * vocab_rows, (rank + 1) * vocab_rows)
    lm_head = read.pack(gemms.lm_head, [(head_name, rows)])  # a tied one: the values just read
    return LlamaModel(config=local, rope=rope, embed=embed, layers=tuple(layers),
                      norm=aligned_copy(read("model.norm.weight")), lm_head=lm_head, gemms=gemms)


def _attention_extras(read: WeightReader, p: str, cfg: ModelConfig,
                      parts: list[tuple[str, slice]]) -> dict[str, np.ndarray]:
    """Qwen2's q/k/v biases (the rows `parts` keep, fused as the QKV GEMM's columns) and
    Qwen3's q/k head norms; nothing for Llama."""
    out = {}
    if cfg.qkv_bias:
        out["qkv_bias"] = aligned_copy(np.concatenate([read(name + "bias")[rows] for name, rows in parts]))
    if cfg.qk_norm:
        out["q_norm"] = aligned_copy(read(p + "self_attn.q_norm.weight"))
        out["k_norm"] = aligned_copy(read(p + "self_attn.k_norm.weight"))
    return out


def _ffn(read: WeightReader, p: str, cfg: ModelConfig, gemms: ModelGemms,
         mlp: slice, shared: slice) -> dict[str, PackedWeight | MoeWeights]:
    """One layer's MLP (fused gate/up, down), or its router and experts; `mlp` selects the
    intermediate columns (a TP rank's, or all), `shared` a shared expert's."""
    if cfg.is_moe:
        if gemms.router is None:
            raise ConfigError(f"{cfg.name}: an MoE model needs the router GEMM (N="
                              f"{cfg.router_outputs}); tune the model's payload")
        return {"moe": pack_moe(read, p, cfg, gemms, cols=mlp, shared_cols=shared)}
    return {"gate_up": read.pack(gemms.gate_up, [(p + "mlp.gate_proj.weight", mlp),
                                                 (p + "mlp.up_proj.weight", mlp)]),
            "down": read.pack(gemms.down, [(p + "mlp.down_proj.weight", slice(None))], mlp)}
