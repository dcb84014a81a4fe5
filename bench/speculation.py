"""Speculative decoding by prompt lookup (runtime/speculate.py) against a token-a-step decode:
one engine, the same model, threads and greedy requests, speculation off and on in
alternating runs (which goes first alternates too). The tasks are chat prompts whose replies
copy their context to different degrees (a proofread paragraph, an edited function, a quoted
passage) and one that copies nothing (a story), as the README says speculation pays only in
the first kind. Reported per task and draft length: the reply's tokens, TPOT off and on
(medians over the rounds), the paired speedup, the share of drafted tokens taken, forward
passes per token, and whether the replies are the same ids in every round. With a llama.cpp
peer, the same prompts also run on llama.cpp (llama-cpp-python, an F32 GGUF of the same
weights, the same threads) a token a step and with its own prompt-lookup decoding
(`LlamaPromptLookupDecoding`, the same draft length), in the same rounds."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandwich.errors import ConfigError
from sandwich.runtime.engine import Request
from sandwich.runtime.speculate import Speculation

SETTLE_S = 0.2  # before each timed run, as the other serving benchmarks wait

PARAGRAPH = ("The procesor reads its instructons from memmory, but a cache keeps the data it "
             "used most recently close by, so that the next acess is fast. When the data is "
             "not in the cache, the core waits for main memory, which takes hundreds of cycles.")
FUNCTION = ("def add(items):\n    x = 0\n    for i in items:\n        if i > 0:\n            x += i\n"
            "    return x\n")
TASKS = (
    ("proofread", f"Fix the spelling mistakes in this paragraph and write it out in full:\n\n{PARAGRAPH}"),
    ("edit code", f"Rename the variable x to total in this Python function and write out the whole "
                  f"function:\n\n{FUNCTION}"),
    ("quote", f"Repeat this text word for word:\n\n{PARAGRAPH}"),
    ("story", "Write a short story about a dragon who learns to cook."),
)


@dataclass
class SpecRow:
    task: str
    draft: int
    prompt_tokens: int
    tokens: int  # the reply's tokens (the first round's)
    tpot_off_ms: float  # medians over the rounds
    tpot_on_ms: float
    speedup: float  # median over the rounds of off / on, each pair from the same round
    taken: float  # drafted tokens the sampler took, of all drafted
    passes_per_token: float  # forward passes (decode steps) per decoded token, speculating
    same_ids: bool  # the replies are the same ids, off and on, in every round
    llama_cpp_off_ms: float | None = None  # the peer's TPOT, a token a step and with its lookup
    llama_cpp_on_ms: float | None = None
    llama_cpp_speedup: float | None = None  # median of each round's off / on
    llama_cpp_same_ids: bool | None = None  # its replies equal ours in every round (both modes)


@dataclass
class SpecResult:
    command: str
    machine: str
    model: str
    threads: int
    max_new_tokens: int
    rounds: int
    rows: list[SpecRow] = field(default_factory=list)


class LlamaCppLookup:
    """llama.cpp on a GGUF: a prompt's greedy reply and its TPOT, a token a step, or with
    llama-cpp-python's prompt-lookup decoding guessing `draft` tokens."""

    def __init__(self, gguf: Path, *, threads: int, n_ctx: int, draft: int = 0) -> None:
        from sandwich.bench.serving_peers import _llama

        extra = {}
        if draft:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            extra["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=draft)
        self.llm = _llama(gguf, threads=threads, n_ctx=n_ctx, **extra)
        self.reply([1, 2, 3], 2, ())  # untimed: buffers, pages

    def reply(self, prompt, max_new_tokens: int, stop) -> tuple[tuple[int, ...], float]:
        self.llm.reset()
        ids, times = [], []
        for t in self.llm.generate(list(prompt), top_k=1, temp=0.0):
            times.append(time.perf_counter())
            ids.append(int(t))
            if t in stop or len(ids) >= max_new_tokens:
                break
        tpot = (times[-1] - times[0]) / (len(ids) - 1) * 1e3 if len(ids) > 1 else 0.0
        return tuple(ids), tpot

    def close(self) -> None:
        self.llm.close()


def run_speculation_bench(engine, tok, *, drafts: list[int], max_new_tokens: int, rounds: int,
                          command: str, machine: str, model: str, threads: int,
                          peers: dict[int, LlamaCppLookup] | None = None) -> SpecResult:
    """`peers`: llama.cpp by draft length (0: a token a step), for each length in `drafts`."""
    res = SpecResult(command, machine, model, threads, max_new_tokens, rounds)
    for task, text in TASKS:
        prompt = tuple(tok.encode(tok.render_chat([{"role": "user", "content": text}])))
        req = Request(prompt=prompt, max_new_tokens=max_new_tokens, stop=tuple(sorted(tok.stop_ids)))
        why = engine.problem(req)
        if why:
            raise ConfigError(f"task {task!r}: {why}")
        for k in drafts:
            offs, ons, ratios, same, taken, passes = [], [], [], True, [], []
            cpp: list[tuple[float, float]] = []
            cpp_same = True
            ids = None
            for r in range(rounds):
                pair = {}
                for on in ((False, True) if r % 2 == 0 else (True, False)):
                    engine.speculation = Speculation(draft=k) if on else None
                    time.sleep(SETTLE_S)
                    engine.stats.drafted = engine.stats.accepted = engine.stats.steps = 0
                    engine.stats.decode_tokens = 0
                    (out,) = engine.run([req])
                    if out.error:
                        raise RuntimeError(f"{task}: {out.error}")
                    pair[on] = out
                    if on:
                        st = engine.stats
                        taken.append(st.accepted / st.drafted if st.drafted else 0.0)
                        passes.append(st.steps / max(1, st.decode_tokens))
                ids = ids or pair[False].ids
                same &= pair[False].ids == pair[True].ids == ids
                offs.append(pair[False].tpot_ms)
                ons.append(pair[True].tpot_ms)
                ratios.append(pair[False].tpot_ms / pair[True].tpot_ms if pair[True].tpot_ms else 0.0)
                if peers:
                    runs = {}
                    for d in ((0, k) if r % 2 == 0 else (k, 0)):
                        time.sleep(SETTLE_S)
                        runs[d] = peers[d].reply(prompt, max_new_tokens, req.stop)
                    cpp.append((runs[0][1], runs[k][1]))
                    cpp_same &= runs[0][0] == runs[k][0] == ids
            engine.speculation = None
            row = SpecRow(task, k, len(prompt), len(ids or ()), statistics.median(offs),
                          statistics.median(ons), statistics.median(ratios),
                          statistics.median(taken), statistics.median(passes), same)
            if cpp:
                row.llama_cpp_off_ms = statistics.median(a for a, _ in cpp)
                row.llama_cpp_on_ms = statistics.median(b for _, b in cpp)
                row.llama_cpp_speedup = statistics.median(a / b if b else 0.0 for a, b in cpp)
                row.llama_cpp_same_ids = cpp_same
            res.rows.append(row)
    return res


def write_report(res: SpecResult, md: Path, js: Path) -> None:
    md.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(asdict(res), indent=1))
    lines = [f"# Speculative decoding by prompt lookup: {res.model}", "",
             f"Regenerate: `{res.command}`", "",
             f"- machine: {res.machine}; {res.threads} threads; greedy, at most "
             f"{res.max_new_tokens} new tokens; {res.rounds} rounds, speculation off and on "
             f"alternating (which goes first alternates), one engine",
             "- TPOT: (last token - first token) / (tokens - 1), median over the rounds; "
             "speedup: the median of each round's off / on",
             "- taken: drafted tokens the sampler took, of all drafted; passes per token: decode "
             "steps per decoded token while speculating (1.0 without)", "",
             "| task | draft | prompt | reply tokens | TPOT off ms | TPOT on ms | speedup | taken "
             "| passes / token | same ids |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res.rows:
        lines.append(f"| {r.task} | {r.draft} | {r.prompt_tokens} | {r.tokens} | {r.tpot_off_ms:.2f} "
                     f"| {r.tpot_on_ms:.2f} | {r.speedup:.2f} | {r.taken:.0%} | "
                     f"{r.passes_per_token:.2f} | {'yes' if r.same_ids else 'NO'} |")
    if any(r.llama_cpp_off_ms is not None for r in res.rows):
        lines += ["", "llama.cpp (llama-cpp-python, an F32 GGUF of the same weights, f32 KV cache, "
                  "the same threads and prompts, in the same rounds; its prompt lookup is "
                  "`LlamaPromptLookupDecoding` with the same draft length):", "",
                  "| task | draft | llama.cpp TPOT off ms | on ms | speedup | ours on ms | llama.cpp on / "
                  "ours on | its ids = ours |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in res.rows:
            lines.append(f"| {r.task} | {r.draft} | {r.llama_cpp_off_ms:.2f} | {r.llama_cpp_on_ms:.2f} | "
                         f"{r.llama_cpp_speedup:.2f} | {r.tpot_on_ms:.2f} | "
                         f"{r.llama_cpp_on_ms / r.tpot_on_ms:.2f} | "
                         f"{'yes' if r.llama_cpp_same_ids else 'no'} |")
    md.write_text("\n".join(lines) + "\n")
