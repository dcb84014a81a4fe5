"""`sandwichc bench serving`: TTFT and TPOT of sandwichc against HF transformers, llama.cpp and
OpenVINO on the same random-weight model, the same prompts and the same threads, in one run.

The timed greedy generations go round robin over the systems (never two at once), and
sandwichc runs right beside every peer run, so each peer also gets a paired ratio to
sandwichc measured seconds apart: decode is memory-bound and this VM's DRAM bandwidth
drifts by tens of percent within tens of seconds. Every system keeps its weights in its
own memory: this VM reclaims pages mapped from files while another system runs, which
would make a system that maps its checkpoint re-read it from disk. When every system's
copy does not fit at once, sandwichc stays loaded and each peer is loaded and closed
within every round. Writes results/serving.{json,md}.
"""

from __future__ import annotations

import datetime
import functools
import gc
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sandwich.bench.serving_peers import GenTiming, ServingPeer
from sandwich.errors import ConfigError


@dataclass
class ServingRow:
    model: str
    peer: str
    prompt_len: int
    new_tokens: int
    ttft_ms: float
    tpot_ms: float
    same_ids_as_sandwichc: bool | None = None
    read_gbs: float | None = None  # streaming read measured right after this system's runs
    ttft_vs_sandwichc: float | None = None  # median of the paired ratios (see time_peers)
    tpot_vs_sandwichc: float | None = None


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
    per_round_load: dict[str, bool] = field(default_factory=dict)  # model -> loaded per round
    weights: str = "fp32"  # the weight format of sandwichc's GEMMs, llama.cpp's GGUF and OpenVINO's
    kv_dtype: str = "f32"  # every system's KV cache element type
    same_file: bool = False  # llama.cpp ran a GGUF model's own file (--weights auto)
    # peer -> its version and build (llama.cpp: the CPU features its kernels were built for)
    peer_builds: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d


def model_dir_for(name_or_dir: str, root: Path, *, seed: int = 0) -> Path:
    """An HF model directory or a GGUF file as given (or an installed model's file), or a
    random-weight checkpoint of an embedded config (written once under `root` and reused)."""
    from sandwich.gguf_config import gguf_path, is_gguf

    p = Path(name_or_dir)
    if p.is_dir():
        return p
    if is_gguf(name_or_dir):  # a .gguf file or an installed model such as smollm2
        return gguf_path(name_or_dir)
    from sandwich.models import embedded_models
    from sandwich.runtime.checkpoint import write_checkpoint

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


Timed = dict[str, dict[int, tuple[GenTiming, float, float]]]


@dataclass
class PeerTimings:
    """What `time_peers` measured: per system and prompt length (first run, median TTFT ms,
    median TPOT ms); per non-anchor system and length, the medians of its paired TTFT and
    TPOT ratios to the anchor; each system's median read probe; skip messages."""
    timed: Timed
    paired: dict[str, dict[int, tuple[float, float]]]
    reads: dict[str, float]
    skipped: list[str]


def time_peers(makers: dict[str, Callable[[], ServingPeer]], prompt_ids: dict[int, list[int]],
               new_tokens: int, repeats: int, *, anchor: str | None = None, resident: bool = True,
               settle=lambda: time.sleep(0.2), read_probe: Callable[[], float] | None = None,
               log=print) -> PeerTimings:
    """Time greedy generations of every system over `repeats` rounds.

    Each round runs every system in turn (never two at once), each on every prompt length,
    with a pause before each run for the previous library's idle threads to go to sleep. A
    system is warmed up on a length before its first timed run there (kernels for a new M
    load lazily; llama.cpp sizes its buffers on first use). `resident` keeps every system
    loaded across rounds; otherwise each is loaded, warmed up, timed and closed within a
    round (four private copies of a 5 GB model do not fit this machine).

    `anchor` (sandwichc) stays loaded throughout and runs on each prompt length right beside
    every other system's run, alternating which goes first: decode is memory-bound and this
    VM's DRAM bandwidth drifts by tens of percent within tens of seconds, so each system is
    also compared with the anchor measured seconds apart (the paired ratios). `read_probe`
    (streaming-read GB/s) runs after each system's runs in every round. A system whose loader
    raises ConfigError is skipped."""
    runs: dict[str, dict[int, list[GenTiming]]] = {}
    ratios: dict[str, dict[int, list[tuple[float, float]]]] = {}
    reads: dict[str, list[float]] = {}
    skipped: list[str] = []
    kept: dict[str, ServingPeer] = {}

    def load(name: str) -> ServingPeer | None:
        try:
            return makers[name]()
        except ConfigError as e:
            makers.pop(name)
            skipped.append(f"{name}: {e}")
            log(f"skipped {name}: {e}")
            return None

    def timed(name: str, peer: ServingPeer, n: int) -> GenTiming:
        settle()
        t = peer.generate(prompt_ids[n], new_tokens)
        runs.setdefault(name, {}).setdefault(n, []).append(t)
        return t

    makers = dict(makers)
    lead = load(anchor) if anchor in makers else None
    if lead is not None:
        kept[anchor] = lead
        for ids in prompt_ids.values():
            lead.generate(ids, 2)
    try:
        for r in range(repeats):
            others = [name for name in makers if name != anchor] if lead else list(makers)
            for name in others if others or lead is None else [anchor]:
                peer = kept.get(name) or load(name)
                if peer is None:
                    continue
                fresh = name not in kept
                try:
                    if lead is not None and name != anchor:
                        lead.generate(prompt_ids[min(prompt_ids)], 2)  # touch its pages again
                    for n, ids in prompt_ids.items():
                        if fresh:
                            peer.generate(ids, 2)
                        if lead is None or name == anchor:
                            timed(name, peer, n)
                            continue
                        order = [(anchor, lead), (name, peer)][:: 1 if r % 2 == 0 else -1]
                        t = {who: timed(who, p, n) for who, p in order}
                        ratios.setdefault(name, {}).setdefault(n, []).append(
                            (t[name].ttft_ms / t[anchor].ttft_ms, t[name].tpot_ms / t[anchor].tpot_ms))
                    if read_probe is not None:
                        bw = read_probe()
                        for who in {name, anchor if lead is not None else name}:
                            reads.setdefault(who, []).append(bw)
                finally:
                    if resident or name == anchor:
                        kept[name] = peer
                    else:
                        peer.close()
                        del peer
                        gc.collect()
    finally:
        for peer in kept.values():
            peer.close()
        kept.clear()
        gc.collect()
    med = statistics.median
    return PeerTimings(
        timed={name: {n: (rs[0], med(r.ttft_ms for r in rs), med(r.tpot_ms for r in rs))
                      for n, rs in per_len.items()} for name, per_len in runs.items()},
        paired={name: {n: (med(a for a, _ in rs), med(b for _, b in rs)) for n, rs in per_len.items()}
                for name, per_len in ratios.items()},
        reads={name: med(r) for name, r in reads.items()}, skipped=skipped)


def weights_fit(model_dir: Path, systems: int, *, meminfo: Path = Path("/proc/meminfo"),
                weights: str = "fp32") -> bool:
    """Whether every system can keep its own copy of the weights at once, with room for
    one transient second copy while a system loads (HF clones its tensors, llama.cpp reads
    the GGUF into memory): systems + 1 copies within 80% of the available memory."""
    if model_dir.is_file() and weights == "fp32":  # GGUF: every system holds it as fp32
        from sandwich.gguf_config import open_reader

        size = 4 * sum(int(t.n_elements) for t in open_reader(model_dir).tensors)
    elif model_dir.is_file():  # sandwichc's packed formats, llama.cpp the file or its like
        from sandwich.models import load_model_config
        from sandwich.payload import resident_bytes

        size = max(model_dir.stat().st_size,
                   resident_bytes(load_model_config(model_dir), weights=weights))
    else:
        size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    from sandwich.runtime.loader import available_memory

    return (systems + 1) * size <= 0.8 * (available_memory(meminfo) or 0)


def _make_peer(name: str, model_dir: Path, *, threads: int, max_seq: int, cache, work: Path,
               weights: str = "fp32", kv_dtype: str = "f32", same_file: bool = False):
    """Peer `name` on the model, each with its KV cache in `kv_dtype` (f32 or bf16)."""
    from sandwich.bench import serving_peers as sp

    if name == "sandwichc":
        return sp.SandwichPeer(model_dir, cache, threads=threads, max_seq=max_seq, weights=weights,
                               kv_dtype=kv_dtype)
    if name == "hf-transformers":
        if weights != "fp32":
            raise ConfigError(f"runs fp32 weights only here (--weights {weights} compares sandwichc "
                              "with llama.cpp and OpenVINO)")
        if kv_dtype != "f32":
            raise ConfigError(f"runs an f32 KV cache only here (--kv-cache-dtype {kv_dtype} "
                              "compares sandwichc with llama.cpp and OpenVINO)")
        return sp.HfPeer(model_dir, threads=threads)
    if name == "llama.cpp":
        gguf = (model_dir if same_file and model_dir.suffix == ".gguf"
                else sp.llama_cpp_gguf(model_dir, work, weights, threads=threads))
        return sp.LlamaCppPeer(gguf, threads=threads, max_seq=max_seq, kv_dtype=kv_dtype)
    if name == "openvino":
        from sandwich.bench.openvino_llama import OpenVinoLlamaPeer

        return OpenVinoLlamaPeer(model_dir, threads=threads, max_seq=max_seq, weights=weights,
                                 kv_dtype=kv_dtype)
    raise AssertionError(name)  # run_serving_bench checked the names


PEERS = ("sandwichc", "hf-transformers", "llama.cpp", "openvino")


def run_serving_bench(*, models: list[str], prompt_lens: list[int], new_tokens: int, repeats: int,
                      threads: int, cache, work: Path, command: str, peers=PEERS,
                      weights: str = "fp32", kv_dtype: str = "f32", same_file: bool = False,
                      log=print) -> ServingResult:
    """`same_file`: llama.cpp runs a GGUF model's own file, as `--weights auto` runs it in
    sandwichc, instead of its own quantization of an F32 export to `weights`' types."""
    from sandwich.compiler.target import describe_machine
    from sandwich.models import load_model_config
    from sandwich.tuner.machine_bench import read_bandwidth_gbs
    from sandwich.tuner.quiet import other_cpu_load, warn_if_busy

    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ConfigError(f"unknown serving peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    load0 = warn_if_busy("the serving benchmark", log)
    res = ServingResult(command, datetime.date.today().isoformat(), describe_machine(), threads,
                        repeats, weights=weights, kv_dtype=kv_dtype, same_file=same_file)
    max_seq = max(prompt_lens) + new_tokens
    for model in models:
        model_dir = model_dir_for(model, work)
        model = model_dir.name if Path(model).exists() else model
        cfg = load_model_config(model_dir)
        ids = prompts(prompt_lens, cfg.vocab_size)
        resident = weights_fit(model_dir, len(peers), weights=weights)
        if not resident:
            log(f"{model}: sandwichc and one peer in memory at a time (each peer loaded, warmed "
                "up, timed and closed per round)")
        res.per_round_load[model] = not resident
        makers = {name: functools.partial(_make_peer, name, model_dir, threads=threads,
                                          max_seq=max_seq, cache=cache, work=work, weights=weights,
                                          kv_dtype=kv_dtype, same_file=same_file)
                  for name in peers}
        t = time_peers(makers, ids, new_tokens, repeats, anchor="sandwichc", resident=resident,
                       read_probe=lambda: read_bandwidth_gbs(threads), log=log)
        res.skipped += [f"{model}/{s}" for s in t.skipped]
        reference = {n: r[0].ids for n, r in t.timed.get("sandwichc", {}).items()}
        for name, per_len in t.timed.items():
            for n, (first, ttft, tpot) in per_len.items():
                same = first.ids == reference[n] if n in reference and name != "sandwichc" else None
                vs = t.paired.get(name, {}).get(n, (None, None))
                res.rows.append(ServingRow(model, name, n, new_tokens, ttft, tpot, same,
                                           t.reads.get(name), *vs))
                log(f"{model} {name:<16} prompt {n:>5}: TTFT {ttft:9.1f} ms  TPOT {tpot:8.2f} ms  "
                    f"(read {t.reads.get(name, 0.0):.1f} GB/s)"
                    + (f"  paired vs sandwichc: TTFT x{vs[0]:.2f} TPOT x{vs[1]:.2f}" if vs[0] else ""))
    if any(r.peer == "llama.cpp" for r in res.rows):  # ran: installed (a missing one is skipped)
        from sandwich.bench.serving_peers import llama_cpp_build

        res.peer_builds["llama.cpp"] = llama_cpp_build()
    res.other_load = (load0, other_cpu_load())
    return res


def _weights_line(weights: str, peers: set[str], same_file: bool = False) -> str:
    """The report's words on the weights of the systems in `peers` (those with rows)."""
    if same_file:
        return (f"{weights} weights (the GGUF file's own format, as `--weights auto` runs it; "
                "llama.cpp on the same file) and ")
    if weights == "fp32":
        return "fp32 weights and "
    from sandwich.bench.serving_peers import llama_cpp_output_type
    from sandwich.weight_formats import parse_weights

    how = ["sandwichc"]
    if "llama.cpp" in peers:
        output = llama_cpp_output_type(weights)
        how.append(f"llama.cpp: {parse_weights(weights).base.ggml_type} made by llama.cpp's own "
                   "quantizer from the F32 GGUF, every tensor in that type"
                   + (f" but the output matrix, {output}" if output else ""))
    if "openvino" in peers and parse_weights(weights).base.bits == 16:
        how.append("OpenVINO: the fp32 graph under its CPU plugin's bf16 inference precision "
                   "(weights kept in bf16, its MatMuls and its other ops in bf16)")
    elif "openvino" in peers:
        how.append("OpenVINO: sandwichc's int values and scales as its weight compression (int "
                   "constants its CPU plugin dequantizes inside FullyConnected; its default dynamic "
                   "int8 quantization of activations, groups of 32, where it applies)")
    return f"{weights} weights ({'; '.join(how)}) and "


def _gguf_words(weights: str, same_file: bool) -> str:
    """What each system makes of a GGUF model's tensors in this run."""
    if same_file:
        return ("a GGUF model's own file for sandwichc, its blocks as stored where the format "
                "holds them, and for llama.cpp as it is")
    peers = "llama.cpp reads {}an F32 GGUF written from the same tensors; OpenVINO a graph built from them"
    if weights == "fp32":
        return "a GGUF model is dequantized to fp32 by each; " + peers.format("")
    return (f"a GGUF model's tensors already in {weights}'s blocks run as stored in sandwichc and "
            "OpenVINO, the others are quantized from their values; "
            + peers.format("its own quantization of "))


def write_report(res: ServingResult, md: Path, js: Path) -> None:
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res.to_json(), indent=1))
    weights = _weights_line(res.weights, {r.peer for r in res.rows}, res.same_file)
    lines = [
        "# Serving latency: sandwichc vs "
        + ", ".join(dict.fromkeys(r.peer for r in res.rows if r.peer != "sandwichc")),
        "",
        f"Regenerate: `{res.command}`",
        "",
        f"- machine: {res.machine}; {res.threads} threads for every system; {weights}"
        f"{res.kv_dtype.replace('f32', 'fp32')} KV caches everywhere (llama.cpp's and OpenVINO's "
        f"default to f16 / u8); date {res.date}",
        "- one request at a time, greedy, the same checkpoint and prompt ids (random) for every "
        f"system ({_gguf_words(res.weights, res.same_file)}); the median of "
        f"{res.repeats} rounds, each running every system in turn (one at a time, 0.2 s "
        "apart), after a warm-up of each prompt length",
        "- weights in each system's own memory (llama.cpp without mmap, HF's tensors copied "
        "out of the mapped file): this VM reclaims mapped file pages while other systems run"
        + ("; " + ", ".join(m for m, v in res.per_round_load.items() if v)
           + ": every system loaded and closed within each round, as all copies do not fit "
           "in memory at once" if any(res.per_round_load.values()) else ""),
        "- TTFT = prompt ids in to first new token out (prefill + argmax); TPOT = mean time of "
        "each later token",
        f"- other processes used {100 * res.other_load[0]:.0f}% of the CPUs at the start and "
        f"{100 * res.other_load[1]:.0f}% at the end",
    ]
    if res.skipped:
        lines.append(f"- skipped: {'; '.join(res.skipped)}")
    lines += [f"- {peer}: {build}" for peer, build in res.peer_builds.items()]
    lines.append("- read GB/s: the machine's streaming-read bandwidth measured right after the "
                 "system's runs (median over the rounds); decode is memory-bound, so TPOTs "
                 "taken minutes apart differ by that bandwidth's drift")
    lines.append("- x sandwichc (paired): sandwichc runs the same prompt right before or after "
                 "each peer run (alternating), so both see the same bandwidth; the median over "
                 "the rounds of peer / sandwichc (above 1: the peer is slower)")
    lines += ["", "| model | prompt | new tokens | system | TTFT ms | TPOT ms | read GB/s | "
              "TTFT x sandwichc (paired) | TPOT x sandwichc (paired) | same ids as sandwichc |",
              "|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in sorted(res.rows, key=lambda r: (r.model, r.prompt_len, r.peer != "sandwichc", r.peer)):
        same = "" if r.same_ids_as_sandwichc is None else ("yes" if r.same_ids_as_sandwichc else "no")
        read, ttft_x, tpot_x = (("" if v is None else f"{v:{f}}") for v, f in (
            (r.read_gbs, ".1f"), (r.ttft_vs_sandwichc, ".2f"), (r.tpot_vs_sandwichc, ".2f")))
        lines.append(f"| {r.model} | {r.prompt_len} | {r.new_tokens} | {r.peer} | {r.ttft_ms:.1f} | "
                     f"{r.tpot_ms:.2f} | {read} | {ttft_x} | {tpot_x} | {same} |")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines) + "\n")
