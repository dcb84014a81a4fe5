"""OpenVINO as a serving peer: the Llama decoder built op by op with OpenVINO's opset API.

The graph has the shape optimum-intel exports (past K/V gathered by `beam_idx`, concatenated
along the sequence axis, fed to opset13 ScaledDotProductAttention, then turned into
ReadValue/Assign state), so the CPU plugin keeps the KV cache inside the infer request and
fuses concat + attention into its stateful SDPA kernel. Weights are fp32 Constants, which
the plugin packs once at compile time, or for an int format sandwichc's own int values and
scales as OpenVINO's weight-compression subgraph (bench/openvino_weights.py); only the last
position reaches the lm_head.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from sandwich.bench.openvino_weights import check_format, compressed_weight
from sandwich.bench.serving_peers import GenTiming, _timing
from sandwich.errors import ConfigError
from sandwich.models import ModelConfig
from sandwich.runtime.loader import WeightReader, open_checkpoint, read_config
from sandwich.runtime.rope_tables import RopeSpec, cos_sin
from sandwich.runtime.safetensors_io import INDEX_NAME
from sandwich.weight_formats import WeightFormat, quantize

_NEG = float(np.finfo(np.float32).min)  # masked score: exp() underflows to 0, no inf - inf NaN


def _ov():
    """Import OpenVINO lazily, so the project imports without it."""
    try:
        import openvino as ov
        import openvino.opset13 as ops
        from openvino._offline_transformations import apply_make_stateful_transformation
    except ImportError:
        raise ConfigError("openvino peer needs openvino (pip install -e .[bench])") from None
    return ov, ops, apply_make_stateful_transformation


def _check_files(model_dir: Path) -> None:
    """A missing checkpoint is a user error; say so before any tensor is read."""
    if not (model_dir / INDEX_NAME).is_file() and not any(model_dir.glob("*.safetensors")):
        raise ConfigError(f"{model_dir}: no *.safetensors file; write one with `sandwichc init-model`")


class _Builder:
    """Emits the decoder ops; one method per HF module so the graph reads like modeling_llama."""

    def __init__(self, ops, cfg: ModelConfig, read: WeightReader, fmt: WeightFormat) -> None:
        self.ops, self.cfg, self.read, self.fmt = ops, cfg, read, fmt

    def w(self, name: str):
        """A checkpoint tensor as an fp32 Constant. Copied: OpenVINO cannot share the read-only
        mapped file, so loading peaks at two copies until the ov.Model is dropped."""
        return self.ops.constant(np.ascontiguousarray(self.read(name), dtype=np.float32))

    def i64(self, values):
        return self.ops.constant(np.asarray(values, dtype=np.int64))

    def weight(self, name: str):
        """A projection's W (out, in) in the model's format: as sandwichc packs it (the GGUF's
        blocks when already in that format, else quantized from the checkpoint's values)."""
        if not self.fmt.quantized:
            return self.w(name)
        qw = self.read.projection([(name, slice(None))], self.fmt)
        return compressed_weight(self.ops, quantize(qw, self.fmt) if isinstance(qw, np.ndarray) else qw)

    def linear(self, x, name: str):
        """x @ W.T with W (out, in) as stored: the layout the CPU FullyConnected fusion expects."""
        return self.ops.matmul(x, self.weight(name), transpose_a=False, transpose_b=True)

    def qkv(self, x, prefix: str):
        """A q, k or v projection, plus its bias where the model has them (Qwen2)."""
        y = self.linear(x, prefix + ".weight")
        return self.ops.add(y, self.w(prefix + ".bias")) if self.cfg.qkv_bias else y

    def head_norm(self, x, name: str):
        """Qwen3's RMSNorm of each head (1, n, L, D) over D; other models: x."""
        return self.rmsnorm(x, name) if self.cfg.qk_norm else x

    def rmsnorm(self, x, name: str):
        """x / sqrt(mean(x^2) + eps) * w, in the op order the CPU RMS fusion matches."""
        o = self.ops
        var = o.reduce_mean(o.power(x, o.constant(np.float32(2.0))), self.i64([-1]), keep_dims=True)
        std = o.sqrt(o.add(var, o.constant(np.float32(self.cfg.rms_norm_eps))))
        return o.multiply(o.multiply(x, o.divide(o.constant(np.float32(1.0)), std)), self.w(name))

    def heads(self, x, n: int):
        """(1, L, n D) -> (1, n, L, D)."""
        o = self.ops
        x = o.reshape(x, self.i64([0, 0, n, self.cfg.head_dim]), special_zero=True)
        return o.transpose(x, self.i64([0, 2, 1, 3]))

    def rope(self, x, cos, sin):
        """HF's rotate-half RoPE: x cos + [-x2, x1] sin, cos/sin (1, 1, L, D); written as the
        VariadicSplit / Multiply(-1) form that the CPU plugin fuses into one RoPE node."""
        o, half = self.ops, self.cfg.head_dim // 2
        x1, x2 = o.variadic_split(x, self.i64(3), self.i64([half, half])).outputs()
        rot = o.concat([o.multiply(x2, o.constant(np.float32(-1.0))), x1], -1)
        return o.add(o.multiply(x, cos), o.multiply(rot, sin))

    def repeat_kv(self, kv):
        """(1, KVH, S, D) -> (1, H, S, D) as unsqueeze/broadcast/reshape, the GQA form the
        stateful SDPA fusion recognises (and folds into its own head grouping)."""
        o, c = self.ops, self.cfg
        g = c.num_attention_heads // c.num_key_value_heads
        if g == 1:
            return kv
        x = o.unsqueeze(kv, self.i64([2]))
        x = o.broadcast(x, self.i64([1, 1, g, 1, 1]), broadcast_spec="BIDIRECTIONAL")
        return o.reshape(x, self.i64([0, c.num_attention_heads, -1, c.head_dim]), special_zero=True)

    def attention(self, h, i: int, io: dict):
        """Self-attention of layer i over [past | current] K/V; returns (out, present k, v)."""
        o, c = self.ops, self.cfg
        p = f"model.layers.{i}.self_attn."
        q = self.rope(self.head_norm(self.heads(self.qkv(h, p + "q_proj"), c.num_attention_heads),
                                     p + "q_norm.weight"), *io["rope"])
        k = self.rope(self.head_norm(self.heads(self.qkv(h, p + "k_proj"), c.num_key_value_heads),
                                     p + "k_norm.weight"), *io["rope"])
        v = self.heads(self.qkv(h, p + "v_proj"), c.num_key_value_heads)
        present = []
        for kind, cur in (("key", k), ("value", v)):
            past = o.parameter([1, c.num_key_value_heads, -1, c.head_dim], np.float32,
                               name=f"past_key_values.{i}.{kind}")
            io["past"].append(past)
            present.append(o.concat([o.gather(past, io["beam_idx"], self.i64(0)), cur], 2))
        att = o.scaled_dot_product_attention(q, self.repeat_kv(present[0]), self.repeat_kv(present[1]),
                                             io["mask"], causal=False)
        att = o.reshape(o.transpose(att, self.i64([0, 2, 1, 3])), self.i64([0, 0, -1]), special_zero=True)
        return self.linear(att, p + "o_proj.weight"), present

    def mlp(self, h, i: int):
        """down(silu(gate h) * up h); Swish(beta=1) is SiLU."""
        p = f"model.layers.{i}.mlp."
        gate = self.ops.swish(self.linear(h, p + "gate_proj.weight"))
        return self.linear(self.ops.multiply(gate, self.linear(h, p + "up_proj.weight")), p + "down_proj.weight")


def build_model(cfg: ModelConfig, rope: RopeSpec, read: WeightReader, *, max_seq: int,
                weights: str = "fp32"):
    """The stateless decoder with past/present K/V as Parameter/Result pairs (made stateful later).

    Inputs: input_ids, position_ids (1, L) int64; attention_mask (1, 1, L, past + L) float
    additive; beam_idx (1,) int32. Output: logits (1, 1, vocab) of the last position.
    `weights` (an int format) compresses what sandwichc quantizes: every projection and the
    lm_head (the embedding's values when tied, a second, compressed copy); the embedding
    that input_ids gather from stays fp32, as in sandwichc. fp32 and bf16 weights are fp32
    constants (bf16 is the compiled model's inference precision: OpenVinoLlamaPeer)."""
    if cfg.is_moe:
        raise ConfigError(f"openvino peer: {cfg.model_type} is an MoE model; its graph builds "
                          f"dense MLPs only (leave openvino out of --peers)")
    ov, o, _ = _ov()
    b = _Builder(o, cfg, read, check_format(weights))
    ids, pos, mask, beam = inputs = _inputs(o)
    cos, sin = (np.concatenate([t, t], axis=1) for t in cos_sin(rope, max_seq))  # (max_seq, D)
    rope_cs = [o.unsqueeze(o.gather(o.constant(t), pos, b.i64(0)), b.i64([1])) for t in (cos, sin)]
    io = {"rope": rope_cs, "mask": mask, "beam_idx": beam, "past": []}
    embed = b.w("model.embed_tokens.weight")
    x = o.gather(embed, ids, b.i64(0))
    presents = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        att, present = b.attention(b.rmsnorm(x, p + "input_layernorm.weight"), i, io)
        x = o.add(x, att)
        x = o.add(x, b.mlp(b.rmsnorm(x, p + "post_attention_layernorm.weight"), i))
        presents += present
    last = o.slice(x, b.i64([-1]), b.i64([np.iinfo(np.int64).max]), b.i64([1]), b.i64([1]))
    last = b.rmsnorm(last, "model.norm.weight")
    if cfg.tie_word_embeddings and not b.fmt.quantized:
        logits = o.matmul(last, embed, transpose_a=False, transpose_b=True)
    else:
        head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        logits = b.linear(last, head)
    logits.output(0).get_tensor().set_names({"logits"})
    pairs = [(par, o.result(pres, name=par.get_friendly_name().replace("past_key_values", "present")))
             for par, pres in zip(io["past"], presents, strict=True)]
    results = [o.result(logits, name="logits")] + [r for _, r in pairs]
    return ov.Model(results, [*inputs, *io["past"]], "sandwich-llama"), pairs


def _inputs(o) -> list:
    """input_ids, position_ids, attention_mask, beam_idx; named tensors, as infer() looks them up."""
    params = [o.parameter([1, -1], np.int64, name="input_ids"),
              o.parameter([1, -1], np.int64, name="position_ids"),
              o.parameter([1, 1, -1, -1], np.float32, name="attention_mask"),
              o.parameter([-1], np.int32, name="beam_idx")]  # i32 [?]: what the SDPA fusion matches
    for p in params:
        p.output(0).get_tensor().set_names({p.get_friendly_name()})
    return params


def make_stateful(model, pairs) -> None:
    """past/present Parameter/Result pairs -> ReadValue/Assign: the KV cache lives in the request."""
    _, o, apply_make_stateful_transformation = _ov()
    apply_make_stateful_transformation(model, pairs)
    for op in model.get_ops():  # the CPU plugin wants an initial value: an empty (1, KVH, 0, D)
        if op.get_type_name() == "ReadValue":
            dims = [d.get_length() if d.is_static else 0 for d in op.get_output_partial_shape(0)]
            zeros = o.broadcast(o.constant(np.float32(0.0)), o.constant(np.asarray(dims, np.int64)))
            op.set_arguments([zeros])
    model.validate_nodes_and_infer_types()


def causal_mask(start: int, n: int) -> np.ndarray:
    """Additive mask (1, 1, n, start + n): query i (at position start + i) sees keys <= it."""
    m = np.zeros((1, 1, n, start + n), np.float32)
    if n > 1:
        m[0, 0][np.arange(start + n)[None, :] > (start + np.arange(n))[:, None]] = _NEG
    return m


class OpenVinoLlamaPeer:
    """OpenVINO's CPU plugin on the same HF checkpoint, stateful KV cache, fp32 compute; fp32
    weights, or sandwichc's int values of the format `weights` as compressed weights. With
    bf16 weights, the fp32 graph under the plugin's bf16 inference precision: it keeps the
    weights in bf16 and runs its MatMuls (AMX or avx512_bf16 where the CPU has them) and, unlike
    sandwichc, its other ops in bf16 too; a CPU without bf16 units runs f32.

    With i8/i4 weights the plugin by default also quantizes activations to int8 in groups of
    32 as it runs a compressed FullyConnected (as llama.cpp's Q8_0/Q4_0 dot products do; not
    for the u4 weights of -asym with their f32 zero points); the benchmark keeps that default,
    `dynamic_quantization=False` turns it off (activations stay f32: what a check against a
    reference forward needs)."""

    name = "openvino"

    def __init__(self, model_dir: Path, *, threads: int, max_seq: int, weights: str = "fp32",
                 dynamic_quantization: bool = True, kv_dtype: str = "f32") -> None:
        ov, _, _ = _ov()
        fmt = check_format(weights)  # a bad format before any tensor is read
        bf16 = fmt.bits == 16
        model_dir = Path(model_dir)
        if model_dir.is_dir():  # the config's errors first, then the weights'
            read_config(model_dir)
            _check_files(model_dir)
        cfg, rope, ckpt = open_checkpoint(model_dir)  # a GGUF: dequantized, or its blocks in `weights`
        self.max_seq = max_seq
        model, pairs = build_model(cfg, rope, WeightReader(ckpt, cfg), max_seq=max_seq, weights=fmt.name)
        make_stateful(model, pairs)
        config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                  "KV_CACHE_PRECISION": kv_dtype}  # the plugin's default is u8 on x86: peers keep one type
        if not dynamic_quantization:
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
        self.compiled = ov.Core().compile_model(model, "CPU", config)
        self.request = self.compiled.create_infer_request()
        self._beam = np.zeros(1, np.int32)

    def _forward(self, ids: list[int], start: int) -> np.ndarray:
        """Run ids at positions start.. against the request's cache; last-position logits."""
        n = len(ids)
        self.request.infer({
            "input_ids": np.asarray([ids], np.int64),
            "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
            "attention_mask": causal_mask(start, n),
            "beam_idx": self._beam,
        }, share_inputs=True)
        return self.request.get_tensor("logits").data[0, -1]

    def _check(self, prompt: list[int], max_new_tokens: int) -> None:
        if not prompt or max_new_tokens < 1:
            raise ConfigError("openvino peer needs a non-empty prompt and max_new_tokens >= 1")
        if len(prompt) + max_new_tokens > self.max_seq:
            raise ConfigError(f"openvino peer: prompt {len(prompt)} + {max_new_tokens} new tokens "
                              f"exceeds max_seq {self.max_seq}")

    def logits(self, prompt: list[int]) -> np.ndarray:
        """Last-token logits of a fresh prefill (for checking against a reference)."""
        self._check(prompt, 1)
        self.request.reset_state()
        return self._forward(list(prompt), 0).copy()

    def generate(self, prompt: list[int], max_new_tokens: int) -> GenTiming:
        self._check(prompt, max_new_tokens)
        ids, stamps = [], []
        self.request.reset_state()
        t0 = time.perf_counter()
        logits = self._forward(list(prompt), 0)
        for i in range(max_new_tokens):
            if i:
                logits = self._forward([ids[-1]], len(prompt) + i - 1)
            ids.append(int(logits.argmax()))
            stamps.append(time.perf_counter())
        return _timing(ids, stamps, t0)

    def exec_layer_types(self) -> dict[str, int]:
        """Node types of the compiled graph, e.g. whether 'ScaledAttn' (the fused SDPA) is in it."""
        counts: dict[str, int] = {}
        for op in self.compiled.get_runtime_model().get_ops():
            t = op.get_rt_info()["layerType"].astype(str)
            counts[t] = counts.get(t, 0) + 1
        return counts

    def close(self) -> None:
        self.request = self.compiled = None
