"""Single-request greedy generation by each serving system, timed the same way.

TTFT is the time from handing over the prompt ids to having the first new token (prefill
plus one argmax); TPOT is the mean time of each later token. Every peer runs greedy on the
same token ids with the same thread count, so their generated ids can be compared too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from sandwich.errors import ConfigError


@dataclass(frozen=True)
class GenTiming:
    """One generation: the new ids and its latencies."""

    ids: list[int]
    ttft_ms: float
    tpot_ms: float


class ServingPeer(Protocol):
    name: str

    def generate(self, prompt: list[int], max_new_tokens: int) -> GenTiming: ...

    def close(self) -> None: ...


def _timing(ids: list[int], stamps: list[float], t0: float) -> GenTiming:
    """stamps[i] = when token i was known; TPOT over the tokens after the first."""
    ttft = stamps[0] - t0
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else 0.0
    return GenTiming(ids, 1e3 * ttft, 1e3 * tpot)


class SandwichPeer:
    """sandwichc's engine (the `generate` path) on the tuned kernels of the kernel cache,
    prefix reuse off: the rounds repeat each prompt, and every peer prefills it whole."""

    name = "sandwichc"

    def __init__(self, model_dir: Path, cache, *, threads: int, max_seq: int,
                 weights: str = "fp32", kv_dtype: str = "f32") -> None:
        from sandwich.runtime.engine import Engine
        from sandwich.runtime.executor import Executor
        from sandwich.runtime.loader import load_model

        ex = Executor(load_model(model_dir, cache, threads=threads, weights=weights), max_batch=1,
                      max_seq=max_seq, threads=threads, prefix_cache=False, kv_dtype=kv_dtype)
        self.engine = Engine(ex)

    def generate(self, prompt: list[int], max_new_tokens: int) -> GenTiming:
        from sandwich.runtime.engine import Request, RequestError

        (res,) = self.engine.run([Request(prompt=tuple(prompt), max_new_tokens=max_new_tokens)])
        if res.error:
            raise RequestError(res.error)
        return GenTiming(list(res.ids), res.ttft_ms, res.tpot_ms)

    def close(self) -> None:
        self.engine = None


def hf_model(path: Path):
    """HF transformers' fp32 model of an HF directory or a GGUF file (transformers
    dequantizes it itself). What transformers' GGUF reader leaves at its defaults whatever
    the file says is given from the file's metadata: a Qwen3's head_dim, a Qwen MoE's expert
    and shared expert widths and llama.cpp's routing (qwen3moe renormalizes the top-k
    weights)."""
    import torch
    import transformers

    extra = {}
    if path.suffix == ".gguf":
        from sandwich.models import load_model_config

        cfg = load_model_config(path)
        extra = {"gguf_file": path.name} | ({"head_dim": cfg.head_dim} if cfg.qk_norm else {})
        if cfg.is_moe:
            extra |= {"moe_intermediate_size": cfg.intermediate_size,
                      "norm_topk_prob": cfg.norm_topk_prob}
        if cfg.shared_expert_intermediate_size:
            extra["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
        path = path.parent
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                             **extra).eval()


class HfPeer:
    """HF transformers' model (LlamaForCausalLM, Qwen2's, ...) on torch (eager), with its KV
    cache."""

    name = "hf-transformers"

    def __init__(self, model_dir: Path, *, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = hf_model(Path(model_dir))
        with torch.no_grad():  # own memory, not pages mapped from the file (see bench_serving)
            for p in self.model.parameters():
                p.data = p.data.clone()

    def generate(self, prompt: list[int], max_new_tokens: int) -> GenTiming:
        torch = self.torch
        ids, stamps = [], []
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(torch.tensor([prompt]), use_cache=True)
            for i in range(max_new_tokens):
                if i:
                    out = self.model(torch.tensor([[ids[-1]]]), past_key_values=out.past_key_values,
                                     use_cache=True)
                ids.append(int(out.logits[0, -1].argmax()))
                stamps.append(time.perf_counter())
        return _timing(ids, stamps, t0)

    def close(self) -> None:
        self.model = None


def llama_cpp_module():
    """The llama_cpp module, or the one-line error that says how to install it."""
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError("llama.cpp peer needs llama-cpp-python (pip install -e .[serving])") from None
    return llama_cpp


def llama_cpp_build() -> str:
    """llama-cpp-python's version and the CPU features its llama.cpp was built for (a build
    without AMX_INT8 runs Q8_0 / Q4_0 on AVX-512 VNNI; its AMX path crashed on a Sapphire
    Rapids VM, llama.cpp issue 20824, so that machine's wheel was built with AMX off)."""
    llama_cpp = llama_cpp_module()
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    features = [f.split("=")[0].strip() for f in info.replace("CPU :", "").split("|")
                if f.strip().endswith("= 1")]
    return f"llama-cpp-python {llama_cpp.__version__}, built for {' '.join(features)}"


LLAMA_CPP_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
# a GGUF type -> the llama.cpp file type that, pure, holds every tensor in it
PURE_FTYPE = {"Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S"}


def llama_cpp_type(weights: str) -> str | None:
    """The GGUF type llama.cpp quantizes `weights` to (None for fp32); ConfigError for a
    format llama.cpp has no type for, before anything is written or loaded."""
    from sandwich.weight_formats import parse_weights

    spec = parse_weights(weights)
    if spec.base.name == "fp32" and not spec.overrides:
        return None
    if any(op != "lm_head" for op, _ in spec.overrides):
        raise ConfigError(f"llama.cpp's quantizer sets one type for every tensor but the output "
                          f"matrix; --weights {spec.name} has no llama.cpp twin")
    for fmt in (spec.base, *(f for _, f in spec.overrides)):
        if fmt.ggml_type not in LLAMA_CPP_TYPES:
            raise ConfigError(f"llama.cpp has no type for {fmt.name} weights (it has Q8_0 = "
                              "int8-g32, Q4_0 = int4-g32, Q4_1 = int4-g32-asym, Q4_K = int4-k, "
                              "Q5_K = int5-k, Q6_K = int6-k)")
    return spec.base.ggml_type


def llama_cpp_output_type(weights: str) -> str | None:
    """The type llama.cpp's quantizer gives the output matrix (and a tied embedding) where
    `weights` keeps the lm_head in its own format; None where it follows the rest."""
    from sandwich.weight_formats import parse_weights

    head = dict(parse_weights(weights).overrides).get("lm_head")
    return head.ggml_type if head is not None else None


def llama_cpp_gguf(model: Path, work: Path, weights: str, *, threads: int) -> Path:
    """The GGUF llama.cpp runs for `model` (an HF directory or a GGUF file): an F32 GGUF of
    the same tensors written under `work` once, quantized by llama.cpp for an int format."""
    from sandwich.bench.gguf_export import write_gguf

    ggml = llama_cpp_type(weights)
    if ggml is not None:
        llama_cpp_module()  # before the F32 file is written
    gguf = work / f"{model.name.removesuffix('.gguf')}.f32.gguf"
    if not gguf.is_file():
        write_gguf(model, gguf)
    if ggml is None:
        return gguf
    return llama_cpp_quantized(gguf, ggml, threads=threads, output=llama_cpp_output_type(weights))


def llama_cpp_quantized(f32_gguf: Path, ggml: str, *, threads: int, output: str | None = None) -> Path:
    """The F32 GGUF quantized by llama.cpp's own quantizer to `ggml` (Q8_0, Q4_0, Q4_1, Q4_K,
    Q5_K, Q6_K, from llama_cpp_type), every tensor in that type ("pure", as sandwichc quantizes every
    GEMM of one format) but the output matrix and the token embedding (the tied output) in
    `output` where given; written once beside the F32 file and reused."""
    tag = ggml.lower() + (f"-out-{output.lower()}" if output else "")
    out = f32_gguf.with_name(f32_gguf.name.replace(".f32.gguf", f".{tag}.gguf"))
    if not out.is_file():
        quantize_gguf(f32_gguf, out, PURE_FTYPE.get(ggml, ggml), threads=threads, pure=True,
                      output=output)
    return out


def llama_cpp_ftype(name: str) -> int:
    """llama.cpp's file-type code for `name` (Q4_K_M...), or a one-line ConfigError."""
    llama_cpp = llama_cpp_module()
    code = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name.upper()}", None)
    if code is None:
        known = sorted(k.removeprefix("LLAMA_FTYPE_MOSTLY_") for k in dir(llama_cpp)
                       if k.startswith("LLAMA_FTYPE_MOSTLY_"))
        raise ConfigError(f"llama.cpp has no file type {name} (it has {', '.join(known)})")
    return code


def quantize_gguf(f32_gguf: Path, out: Path, ftype: str, *, threads: int, pure: bool,
                  output: str | None = None) -> Path:
    """llama.cpp's quantizer on an F32 GGUF: `ftype` names one of its file types (Q8_0,
    Q4_0, Q4_1, Q4_K_M, Q5_K_S, Q6_K, ...: LLAMA_FTYPE_MOSTLY_<ftype>), as its own mix of
    tensor types or, `pure`, every tensor in the base type; `output` the output matrix's
    and token embedding's type. Written to a temporary name, then renamed."""
    llama_cpp = llama_cpp_module()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.pure = llama_cpp_ftype(ftype), threads, pure
    if output:
        params.output_tensor_type = params.token_embedding_type = getattr(llama_cpp, f"GGML_TYPE_{output}")
    tmp = out.with_name(out.name + ".tmp")
    if llama_cpp.llama_model_quantize(str(f32_gguf).encode(), str(tmp).encode(), params) != 0:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"llama.cpp could not quantize {f32_gguf.name} to {ftype}")
    tmp.replace(out)
    return out


def _llama(gguf_path: Path, *, threads: int, n_ctx: int, kv_dtype: str = "f32", **extra):
    """llama.cpp on a GGUF with a KV cache of the other systems' type, f32 or bf16 (its
    default f16 would halve the bytes a decode step reads of an f32 one), weights in its own
    memory."""
    llama_cpp = llama_cpp_module()
    # ggml's BF16 is type 30; llama-cpp-python names no constant for it
    kv = {"f32": llama_cpp.GGML_TYPE_F32, "bf16": getattr(llama_cpp, "GGML_TYPE_BF16", 30)}[kv_dtype]
    return llama_cpp.Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads,
                           n_threads_batch=threads, n_batch=n_ctx, n_ubatch=n_ctx,
                           type_k=kv, type_v=kv, use_mmap=False, verbose=False, **extra)


class LlamaCppScorer:
    """llama.cpp's log-probabilities of a window's tokens, for `sandwichc perplexity
    --compare-llama-cpp`: the same ids and windows as ours, every logit kept."""

    def __init__(self, gguf_path: Path, *, threads: int, ctx: int) -> None:
        self.llm = _llama(gguf_path, threads=threads, n_ctx=ctx, logits_all=True)

    def score(self, tokens) -> np.ndarray:
        """Log-probability of each of tokens[1:] given the tokens before it."""
        from sandwich.runtime.perplexity import next_token_logprobs

        self.llm.reset()
        self.llm.eval(list(tokens))
        return next_token_logprobs(self.llm.scores[: len(tokens) - 1], tokens[1:])

    def close(self) -> None:
        self.llm.close()


class LlamaCppPeer:
    """llama.cpp (llama-cpp-python) on an F32 GGUF of the same weights, f32 KV cache, the
    weights read into its own memory (no mmap; see bench_serving)."""

    name = "llama.cpp"

    def __init__(self, gguf_path: Path, *, threads: int, max_seq: int, kv_dtype: str = "f32") -> None:
        self.llm = _llama(gguf_path, threads=threads, n_ctx=max_seq, kv_dtype=kv_dtype)

    def generate(self, prompt: list[int], max_new_tokens: int) -> GenTiming:
        ids, stamps = [], []
        self.llm.reset()  # no prefix reuse between runs: every run prefills the whole prompt
        t0 = time.perf_counter()
        for tok in self.llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            ids.append(int(tok))
            stamps.append(time.perf_counter())
            if len(ids) == max_new_tokens:
                break
        return _timing(ids, stamps, t0)

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()
        self.llm = None
