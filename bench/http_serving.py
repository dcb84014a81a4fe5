"""`sandwichc bench http`: what the OpenAI server costs over the engine it wraps, and what
continuous batching gives concurrent clients. One run, one machine, same threads: the
in-process engine first, then `sandwichc serve` as its own process, driven by the official
`openai` client (streaming), one client at a time and then many at once."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandwich.errors import SandwichError

READY = re.compile(r"on http://([\d.]+):(\d+)/v1")


class ServerProcess:
    """`sandwichc serve` in a child process on 127.0.0.1 and a free port; stops (SIGINT, then
    kill) when the `with` block ends, however it ends."""

    def __init__(self, args: list[str], *, timeout_s: float = 600.0, env: dict | None = None) -> None:
        self.cmd = [sys.executable, "-m", "sandwich.cli", "serve", "--host", "127.0.0.1",
                    "--port", "0", *args]
        self.timeout_s, self.env = timeout_s, env
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log: list[str] = []

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(self.cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env=self.env)
        deadline = time.monotonic() + self.timeout_s
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # tuning bars and warnings come first
            self.log.append(line)
            m = READY.search(line)
            if m:
                self.url = f"http://{m[1]}:{m[2]}"
                break
            if time.monotonic() > deadline:
                break
        if not self.url:
            self.__exit__(None, None, None)
            raise SandwichError(f"`sandwichc serve` did not start: {''.join(self.log[-3:]).strip()}")
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass(frozen=True)
class Stream:
    """One streamed completion as its client saw it."""

    ttft_ms: float
    tpot_ms: float
    tokens: int
    text: str
    wall_s: float


@dataclass(frozen=True)
class Latency:
    """Medians over repeats, with the (min, max) spread."""

    ttft_ms: float
    tpot_ms: float
    ttft_spread: tuple[float, float]
    tpot_spread: tuple[float, float]

    @staticmethod
    def of(pairs: list[tuple[float, float]]) -> Latency:
        t, p = [a for a, _ in pairs], [b for _, b in pairs]
        return Latency(statistics.median(t), statistics.median(p), (min(t), max(t)), (min(p), max(p)))


@dataclass
class HttpBenchResult:
    machine: str
    command: str
    model: str
    threads: int
    prompt_len: int
    max_tokens: int
    repeats: int
    clients: int
    max_batch: int
    engine: Latency | None = None
    http: Latency | None = None
    single_tokens_per_s: float = 0.0
    concurrent_tokens_per_s: float = 0.0
    concurrent_finished: int = 0
    concurrent_wall_s: float = 0.0
    same_text_as_engine: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.concurrent_tokens_per_s / self.single_tokens_per_s if self.single_tokens_per_s else 0.0

    def to_json(self) -> dict:
        return asdict(self) | {"concurrency_speedup": self.speedup}


async def stream_once(client, model: str, prompt: list[int], max_tokens: int) -> Stream:
    """A greedy streamed completion; TPOT from the usage token count, since one text delta
    may carry several tokens (held-back UTF-8)."""
    t0 = time.perf_counter()
    first, last, parts, tokens = 0.0, 0.0, [], 0
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True})
    async for ch in stream:
        now = time.perf_counter()
        if ch.usage is not None:
            tokens = ch.usage.completion_tokens
        if ch.choices and ch.choices[0].text:
            first = first or now
            last = now
            parts.append(ch.choices[0].text)
    tpot = (last - first) / (tokens - 1) * 1e3 if tokens > 1 else 0.0
    return Stream((first - t0) * 1e3, tpot, tokens, "".join(parts), time.perf_counter() - t0)


async def _drive(url: str, model: str, prompts: list[list[int]], max_tokens: int, repeats: int,
                 clients: int) -> tuple[list[Stream], list[Stream], float]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    await stream_once(client, model, prompts[0], 2)  # warm the connection
    single = [await stream_once(client, model, prompts[0], max_tokens) for _ in range(repeats)]
    t0 = time.perf_counter()
    many = await asyncio.gather(*(stream_once(client, model, prompts[i % len(prompts)], max_tokens)
                                  for i in range(clients)), return_exceptions=True)
    wall = time.perf_counter() - t0
    await client.close()
    return single, [s for s in many if isinstance(s, Stream)], wall


def engine_latency(engine, tok, prompt: list[int], max_tokens: int, repeats: int):
    """The in-process engine on the same request: (ttft, tpot) per repeat and the text."""
    from sandwich.runtime.engine import Request

    req = Request(prompt=tuple(prompt), max_new_tokens=max_tokens, stop=tuple(sorted(tok.stop_ids)))
    pairs, text = [], ""
    for _ in range(repeats):
        (res,) = engine.run([req])
        if res.error:
            raise SandwichError(f"the in-process engine failed: {res.error}")
        pairs.append((res.ttft_ms, res.tpot_ms))
        text = tok.decode(res.ids)
    return pairs, text


def run_http_bench(*, model: str, text: str, prompt_len: int, max_tokens: int, repeats: int,
                   clients: int, max_batch: int, threads: int, cache_dir: Path, make_engine,
                   command: str, machine: str, log=print) -> HttpBenchResult:
    """`make_engine(max_batch, max_seq)` builds the in-process engine (tuning on first use);
    it is dropped before the server process starts, so the two never share the cores."""
    import gc

    from sandwich.runtime.http_server import served_name
    from sandwich.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    ids = tok.encode(text)
    if len(ids) < prompt_len * clients:
        raise SandwichError(f"the text has {len(ids)} tokens; {clients} prompts of {prompt_len} "
                            f"need {prompt_len * clients}")
    prompts = [ids[i * prompt_len:(i + 1) * prompt_len] for i in range(clients)]
    res = HttpBenchResult(machine=machine, command=command, model=model, threads=threads,
                          prompt_len=prompt_len, max_tokens=max_tokens, repeats=repeats,
                          clients=clients, max_batch=max_batch)
    max_seq = prompt_len + max_tokens
    log(f"in-process engine: {repeats} x {prompt_len}-token prompt, {max_tokens} new tokens")
    engine = make_engine(max_batch, max_seq)
    pairs, engine_text = engine_latency(engine, tok, prompts[0], max_tokens, repeats)
    res.engine = Latency.of(pairs)
    del engine
    gc.collect()
    log(f"`sandwichc serve`: 1 client x {repeats}, then {clients} concurrent clients")
    args = ["--model", model, "--cache-dir", str(cache_dir), "--max-batch", str(max_batch),
            "--max-seq", str(max_seq), "--no-tune", "--threads", str(threads)]
    env = os.environ | {"TVM_NUM_THREADS": str(threads)}
    with ServerProcess(args, env=env) as srv:
        single, many, wall = asyncio.run(_drive(srv.url, served_name(model), prompts, max_tokens,
                                                repeats, clients))
    res.http = Latency.of([(s.ttft_ms, s.tpot_ms) for s in single])
    res.same_text_as_engine = all(s.text == engine_text for s in single)
    res.single_tokens_per_s = statistics.median(s.tokens / s.wall_s for s in single)
    res.concurrent_finished = sum(s.tokens > 0 for s in many)
    res.concurrent_wall_s = wall
    res.concurrent_tokens_per_s = sum(s.tokens for s in many) / wall
    return res


def write_report(res: HttpBenchResult, md: Path, js: Path) -> None:
    import json

    md.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res.to_json(), indent=1))
    e, h = res.engine, res.http
    assert e is not None and h is not None

    def rng(s):
        return f"{s[0]:.1f}-{s[1]:.1f}"

    lines = [
        f"# `sandwichc serve` over HTTP vs the in-process engine: {res.model}", "",
        f"Machine: {res.machine}; {res.threads} threads for both; fp32 weights.",
        f"Command: `{res.command}`", "",
        f"One greedy request, {res.prompt_len}-token prompt, {res.max_tokens} new tokens, "
        f"median of {res.repeats} (min-max). HTTP times are the official `openai` client's, "
        f"streaming: TTFT to the first text delta, TPOT from the usage token count.", "",
        "| path | TTFT ms | TPOT ms | TTFT spread | TPOT spread |", "|---|---:|---:|---:|---:|",
        f"| in-process engine | {e.ttft_ms:.1f} | {e.tpot_ms:.2f} | {rng(e.ttft_spread)} | "
        f"{rng(e.tpot_spread)} |",
        f"| HTTP, 1 client | {h.ttft_ms:.1f} | {h.tpot_ms:.2f} | {rng(h.ttft_spread)} | "
        f"{rng(h.tpot_spread)} |",
        f"| HTTP / engine | {h.ttft_ms / e.ttft_ms:.3f} | {h.tpot_ms / e.tpot_ms:.3f} | | |", "",
        f"Same text over HTTP as from the engine: {'yes' if res.same_text_as_engine else 'NO'}.", "",
        f"{res.clients} concurrent streaming clients (max_batch {res.max_batch}): "
        f"{res.concurrent_finished}/{res.clients} finished in {res.concurrent_wall_s:.1f} s; "
        f"aggregate {res.concurrent_tokens_per_s:.1f} tokens/s vs one client's "
        f"{res.single_tokens_per_s:.1f} tokens/s: **{res.speedup:.2f}x**.",
    ]
    lines += [f"- {n}" for n in res.notes]
    md.write_text("\n".join(lines) + "\n")
