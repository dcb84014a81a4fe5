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
    """sandwichc's engine (the `generate` path) on the tuned kernels of the kernel cache."""

    name = "sandwichc"

    def __init__(self, model_dir: Path, cache, *, threads: int, max_seq: int) -> None:
        from sandwich.runtime.engine import Engine
        from sandwich.runtime.executor import Executor
        from sandwich.runtime.loader import load_model

        ex = Executor(load_model(model_dir, cache, threads=threads), max_batch=1,
                      max_seq=max_seq, threads=threads)
        self.engine = Engine(ex)

    def generate(self, prompt: list[int], max_new_tokens: int) -> GenTiming:
        from sandwich.runtime.engine import Request, RequestError

        (res,) = self.engine.run([Request(prompt=tuple(prompt), max_new_tokens=max_new_tokens)])
        if res.error:
            raise RequestError(res.error)
        return GenTiming(list(res.ids), res.ttft_ms, res.tpot_ms)

    def close(self) -> None:
        self.engine = None


class HfPeer:
    """HF transformers' LlamaForCausalLM on torch (eager), with its KV cache."""

    name = "hf-transformers"

    def __init__(self, model_dir: Path, *, threads: int) -> None:
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        path, extra = Path(model_dir), {}
        if path.suffix == ".gguf":  # transformers dequantizes a GGUF file itself
            path, extra = path.parent, {"gguf_file": path.name}
        self.model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                   **extra).eval()
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


class LlamaCppPeer:
    """llama.cpp (llama-cpp-python) on an F32 GGUF of the same weights, f32 KV cache, the
    weights read into its own memory (no mmap; see bench_serving)."""

    name = "llama.cpp"

    def __init__(self, gguf_path: Path, *, threads: int, max_seq: int) -> None:
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ConfigError("llama.cpp peer needs llama-cpp-python (pip install -e .[serving])") from None
        from llama_cpp import GGML_TYPE_F32

        # its KV cache defaults to f16, which halves the bytes a decode step reads from
        # the cache: the other systems keep theirs in f32, and so does this one
        self.llm = Llama(model_path=str(gguf_path), n_ctx=max_seq, n_threads=threads,
                         n_threads_batch=threads, n_batch=max_seq, n_ubatch=max_seq,
                         type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, use_mmap=False,
                         verbose=False)

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
