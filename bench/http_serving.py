"""`sandwichc bench http`: what the OpenAI server costs over the engine it wraps, and what
continuous batching gives concurrent clients. One run, one machine, same threads: the
in-process engine and `sandwichc serve` as its own process, driven by the official `openai`
client (streaming): one request at a time through each in turn, then many clients at once."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import threading
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
        # keep reading what it writes: a pipe nobody reads fills up and stalls the server
        threading.Thread(target=self.log.extend, args=(self.proc.stderr,), daemon=True).start()
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
    paired: tuple[float, float] = (0.0, 0.0)  # median over rounds of HTTP / engine (TTFT, TPOT)
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


async def _paired(url: str, model: str, engine_run, prompt: list[int], max_tokens: int,
                  repeats: int, settle_s: float = 0.2):
    """One request through HTTP and one through the in-process engine per round, alternating
    which goes first, a pause before each (the other's idle threads go to sleep): both see
    the same machine state, which on this VM drifts by tens of percent within seconds."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    await stream_once(client, model, prompt, 2)  # warm the connection and the prefill kernels
    http, engine = [], []
    for r in range(repeats):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            await asyncio.sleep(settle_s)
            if which == 0:
                http.append(await stream_once(client, model, prompt, max_tokens))
            else:
                engine.append(engine_run())
    await client.close()
    return http, engine


async def _concurrent(url: str, model: str, prompts: list[list[int]], max_tokens: int,
                      clients: int) -> tuple[list[Stream], float]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    many = await asyncio.gather(*(stream_once(client, model, prompts[i % len(prompts)], max_tokens)
                                  for i in range(clients)), return_exceptions=True)
    wall = time.perf_counter() - t0
    await client.close()
    return [s for s in many if isinstance(s, Stream)], wall


def engine_runner(engine, tok, prompt: list[int], max_tokens: int):
    """`run() -> (ttft_ms, tpot_ms, text)` of the in-process engine on the same request."""
    from sandwich.runtime.engine import Request

    req = Request(prompt=tuple(prompt), max_new_tokens=max_tokens, stop=tuple(sorted(tok.stop_ids)))

    def run():
        (res,) = engine.run([req])
        if res.error:
            raise SandwichError(f"the in-process engine failed: {res.error}")
        return res.ttft_ms, res.tpot_ms, tok.decode(res.ids)

    return run


def run_http_bench(*, model: str, text: str, prompt_len: int, max_tokens: int, repeats: int,
                   clients: int, max_batch: int, threads: int, cache_dir: Path, make_engine,
                   command: str, machine: str, log=print) -> HttpBenchResult:
    """`make_engine(max_batch, max_seq)` builds the in-process engine (tuning on first use).
    Engine and server are loaded together but never run at once: the single-request rounds
    alternate between them, then the engine is dropped for the concurrent run."""
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
    # the rounds repeat one prompt: both sides prefill it whole (no prefix reuse)
    args = ["--model", model, "--cache-dir", str(cache_dir), "--max-batch", str(max_batch),
            "--max-seq", str(max_seq), "--no-tune", "--threads", str(threads), "--no-prefix-cache"]
    env = os.environ | {"TVM_NUM_THREADS": str(threads)}
    name = served_name(model)
    engine = make_engine(max_batch, max_seq)  # tunes on first use, before the server starts
    engine.ex.set_prefix_cache(False)
    with ServerProcess(args, env=env) as srv:
        log(f"{repeats} rounds of one request ({prompt_len}-token prompt, {max_tokens} new "
            f"tokens) through HTTP and through the in-process engine, alternating")
        single, direct = asyncio.run(_paired(srv.url, name, engine_runner(engine, tok, prompts[0],
                                                                           max_tokens), prompts[0],
                                             max_tokens, repeats))
        del engine  # its memory and threads go before the concurrent run
        gc.collect()
        log(f"{clients} concurrent streaming clients")
        many, wall = asyncio.run(_concurrent(srv.url, name, prompts, max_tokens, clients))
    res.engine = Latency.of([(t, p) for t, p, _ in direct])
    res.http = Latency.of([(s.ttft_ms, s.tpot_ms) for s in single])
    res.paired = (statistics.median(s.ttft_ms / d[0] for s, d in zip(single, direct, strict=True)),
                  statistics.median(s.tpot_ms / d[1] for s, d in zip(single, direct, strict=True)))
    res.same_text_as_engine = all(s.text == d[2] for s, d in zip(single, direct, strict=True))
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
        f"| HTTP / engine, paired | {res.paired[0]:.3f} | {res.paired[1]:.3f} | | |", "",
        "Paired: each round runs the request through HTTP and through the engine back to back "
        "(alternating which goes first); the ratio is the median over the rounds of the two "
        "runs' ratio, so both sides of each ratio saw the same machine state.", "",
        f"Same text over HTTP as from the engine: {'yes' if res.same_text_as_engine else 'NO'}.", "",
        f"{res.clients} concurrent streaming clients (max_batch {res.max_batch}): "
        f"{res.concurrent_finished}/{res.clients} finished in {res.concurrent_wall_s:.1f} s; "
        f"aggregate {res.concurrent_tokens_per_s:.1f} tokens/s vs one client's "
        f"{res.single_tokens_per_s:.1f} tokens/s: **{res.speedup:.2f}x**.",
    ]
    lines += [f"- {n}" for n in res.notes]
    md.write_text("\n".join(lines) + "\n")
