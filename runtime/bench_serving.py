"""`sandwichc bench serving`: TTFT and TPOT of sandwichc against HF transformers, llama.cpp and
OpenVINO on the same random-weight model, the same prompts and the same threads, in one run.

Every peer of a model is loaded, each prompt length warmed up, and the timed greedy
generations go round robin over the peers (never two at once), so a drift of this VM's
memory bandwidth over minutes hits all of them alike. Writes results/serving.{json,md}.
"""

from __future__ import annotations

import datetime
import gc
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.serving_peers import GenTiming


@dataclass
class ServingRow:
    model: str
    peer: str
    prompt_len: int
    new_tokens: int
    ttft_ms: float
    tpot_ms: float
    same_ids_as_sandwichc: bool | None = None


@dataclass
class ServingResult:
    command: str
    date: str
    machine: str
    threads: int
    repeats: int
    rows: list[ServingRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    other_load: tuple[float, float] = (0.0, 0.0)

    def to_json(self) -> dict:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d


def model_dir_for(name_or_dir: str, root: Path, *, seed: int = 0) -> Path:
    """An HF model directory as given, or a random-weight checkpoint of an embedded config
    (written once under `root` and reused)."""
    p = Path(name_or_dir)
    if p.is_dir():
        return p
    from sandwich.runtime.checkpoint import write_checkpoint
    from sandwich.tuner.models import embedded_models

    if name_or_dir not in embedded_models():
        raise ConfigError(f"{name_or_dir}: not a model directory nor an embedded model "
                          f"({', '.join(embedded_models())})")
    out = root / f"{name_or_dir}-seed{seed}"
    if not (out / "config.json").is_file():
        write_checkpoint(name_or_dir, out, seed=seed)
    return out


def prompts(lengths: list[int], vocab: int, *, seed: int = 0) -> dict[int, list[int]]:
    rng = np.random.default_rng(seed)
    return {n: [int(x) for x in rng.integers(3, vocab, n)] for n in lengths}


def time_peers(peers: list, prompt_ids: dict[int, list[int]], new_tokens: int, repeats: int, *,
               settle=lambda: time.sleep(0.2)) -> dict[str, dict[int, tuple[GenTiming, float, float]]]:
    """Median TTFT and TPOT over `repeats` runs per peer and prompt length.

    Each length is warmed up on every peer first (kernels for a new M load lazily; llama.cpp
    sizes its buffers on first use); then the repeats go round robin over the peers, with a
    pause before each run for the previous library's idle threads to go to sleep, so a drift
    of the machine's memory bandwidth over minutes hits every peer alike."""
    out: dict[str, dict[int, tuple[GenTiming, float, float]]] = {p.name: {} for p in peers}
    for n, ids in prompt_ids.items():
        for peer in peers:
            peer.generate(ids, 2)
        runs: dict[str, list[GenTiming]] = {p.name: [] for p in peers}
        for _ in range(repeats):
            for peer in peers:
                settle()
                runs[peer.name].append(peer.generate(ids, new_tokens))
        for name, rs in runs.items():
            out[name][n] = (rs[0], statistics.median(r.ttft_ms for r in rs),
                            statistics.median(r.tpot_ms for r in rs))
    return out


def _make_peer(name: str, model_dir: Path, *, threads: int, max_seq: int, cache, work: Path):
    from sandwich.runtime import serving_peers as sp

    if name == "sandwichc":
        return sp.SandwichPeer(model_dir, cache, threads=threads, max_seq=max_seq)
    if name == "hf-transformers":
        return sp.HfPeer(model_dir, threads=threads)
    if name == "llama.cpp":
        from sandwich.runtime.gguf_export import write_gguf

        gguf = work / f"{model_dir.name}.f32.gguf"
        if not gguf.is_file():
            write_gguf(model_dir, gguf)
        return sp.LlamaCppPeer(gguf, threads=threads, max_seq=max_seq)
    if name == "openvino":
        from sandwich.runtime.openvino_llama import OpenVinoLlamaPeer

        return OpenVinoLlamaPeer(model_dir, threads=threads, max_seq=max_seq)
    raise AssertionError(name)  # run_serving_bench checked the names


PEERS = ("sandwichc", "hf-transformers", "llama.cpp", "openvino")


def run_serving_bench(*, models: list[str], prompt_lens: list[int], new_tokens: int, repeats: int,
                      threads: int, cache, work: Path, command: str, peers=PEERS,
                      log=print) -> ServingResult:
    from sandwich.compiler.target import describe_machine
    from sandwich.runtime.loader import read_config
    from sandwich.tuner.quiet import other_cpu_load, warn_if_busy

    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ConfigError(f"unknown serving peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    load0 = warn_if_busy("the serving benchmark", log)
    res = ServingResult(command, datetime.date.today().isoformat(), describe_machine(), threads, repeats)
    max_seq = max(prompt_lens) + new_tokens
    for model in models:
        model_dir = model_dir_for(model, work)
        model = model_dir.name if Path(model).is_dir() else model
        cfg, _ = read_config(model_dir)
        ids = prompts(prompt_lens, cfg.vocab_size)
        loaded = []
        try:
            for name in peers:
                try:
                    loaded.append(_make_peer(name, model_dir, threads=threads, max_seq=max_seq,
                                             cache=cache, work=work))
                except ConfigError as e:
                    res.skipped.append(f"{model}/{name}: {e}")
                    log(f"skipped {name}: {e}")
            timed = time_peers(loaded, ids, new_tokens, repeats)
        finally:
            for peer in loaded:
                peer.close()
            loaded.clear()
            gc.collect()
        reference = {n: t[0].ids for n, t in timed.get("sandwichc", {}).items()}
        for name, per_len in timed.items():
            for n, (first, ttft, tpot) in per_len.items():
                same = first.ids == reference[n] if n in reference and name != "sandwichc" else None
                res.rows.append(ServingRow(model, name, n, new_tokens, ttft, tpot, same))
                log(f"{model} {name:<16} prompt {n:>5}: TTFT {ttft:9.1f} ms  TPOT {tpot:8.2f} ms")
    res.other_load = (load0, other_cpu_load())
    return res


def write_report(res: ServingResult, md: Path, js: Path) -> None:
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res.to_json(), indent=1))
    lines = [
        "# Serving latency: sandwichc vs "
        + ", ".join(dict.fromkeys(r.peer for r in res.rows if r.peer != "sandwichc")),
        "",
        f"Regenerate: `{res.command}`",
        "",
        f"- machine: {res.machine}; {res.threads} threads for every system; fp32 weights and "
        f"fp32 KV caches everywhere (llama.cpp's and OpenVINO's default to f16 / u8); date {res.date}",
        "- one request at a time, greedy, the same random-weight checkpoint and prompt ids for "
        "every system (llama.cpp reads an F32 GGUF written from it; OpenVINO a graph built from "
        "it); each prompt length warmed up "
        f"on every system, then the median of {res.repeats} runs taken round robin over the "
        "systems (one at a time, 0.2 s apart)",
        "- TTFT = prompt ids in to first new token out (prefill + argmax); TPOT = mean time of "
        "each later token",
        f"- other processes used {100 * res.other_load[0]:.0f}% of the CPUs at the start and "
        f"{100 * res.other_load[1]:.0f}% at the end",
    ]
    if res.skipped:
        lines.append(f"- skipped: {'; '.join(res.skipped)}")
    lines += ["", "| model | prompt | new tokens | system | TTFT ms | TPOT ms | same ids as sandwichc |",
              "|---|---:|---:|---|---:|---:|---|"]
    for r in sorted(res.rows, key=lambda r: (r.model, r.prompt_len, r.peer != "sandwichc", r.peer)):
        same = "" if r.same_ids_as_sandwichc is None else ("yes" if r.same_ids_as_sandwichc else "no")
        lines.append(f"| {r.model} | {r.prompt_len} | {r.new_tokens} | {r.peer} | {r.ttft_ms:.1f} | "
                     f"{r.tpot_ms:.2f} | {same} |")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines) + "\n")
