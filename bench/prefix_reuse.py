"""A chat's turns with and without prefix reuse (runtime/kv_cache.py): two engines on the same
model and threads, one reusing what a finished turn left in its slot and one prefilling every
prompt whole, the turns alternating between them (which goes first alternates too). Each
turn's prompt is the whole conversation in the model's chat template, as a chat client sends
it, so with reuse only the new message and the template around it are prefilled. Reported
per turn: the prompt, the tokens each engine prefilled, both TTFTs (median over the rounds,
each round a new conversation) and the paired ratio, and whether the greedy replies agree.
With `choices` > 1, each round then asks for that many sampled choices of the last turn's
prompt at once (OpenAI's `n`): with reuse the later choices copy the first one's positions.
Each timed run starts 0.2 s after the last one ended, so no system runs while another's
threads still spin.
With a llama.cpp peer, the same prompts also run on llama.cpp (llama-cpp-python, an F32 GGUF
of the same weights, the same threads), once keeping its context between turns as its server
does (its own prefix match decodes only the rest) and once reset before each prompt."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sandwich.errors import SandwichError
from sandwich.runtime.engine import Request

SETTLE_S = 0.2  # before each timed run: the last system's spinning threads go idle (bench serving's)

QUESTIONS = (
    "What is a CPU cache, in two sentences?",
    "Why does a matrix multiply run faster when its tiles fit in that cache?",
    "How is that different on a GPU?",
    "Which of these matters most when a language model generates one token at a time?",
    "Summarize what we discussed as three bullet points.",
    "Thank you. What should I read next on this topic?",
)


@dataclass
class TurnRow:
    turn: int
    prompt_tokens: int
    prefilled_reuse: int  # prompt tokens the reusing engine prefilled (the rest it found kept)
    ttft_whole_ms: float  # medians over the rounds
    ttft_reuse_ms: float
    speedup: float  # median over the rounds of whole / reuse, each pair from the same turn
    same_reply: bool  # the greedy replies agree in every round
    llama_cpp_whole_ms: float | None = None  # the peer's TTFT, reset before the prompt
    llama_cpp_reuse_ms: float | None = None  # and keeping its context from the last turn


@dataclass
class ChoicesRow:
    """`choices` sampled replies of one prompt, submitted together."""

    choices: int
    prompt_tokens: int
    copied: int  # positions the reusing engine copied into the later choices' slots, per round
    last_ttft_whole_ms: float  # the last choice's TTFT (it waits for every prefill before it)
    last_ttft_reuse_ms: float
    speedup: float
    # seeded alike: choices whose sampled tokens agree with and without reuse, of all (a draw
    # near a boundary can flip on the logits' rounding: the copied prompt's last token is
    # prefilled alone, about 1e-6 apart)
    agree: int
    total: int


@dataclass
class PrefixResult:
    command: str
    machine: str
    model: str
    threads: int
    max_new_tokens: int
    rounds: int
    rows: list[TurnRow] = field(default_factory=list)
    choices: ChoicesRow | None = None

    def to_json(self) -> dict:
        return asdict(self)


def check_turns(turns: int) -> None:
    if not 1 <= turns <= len(QUESTIONS):
        raise SandwichError(f"--turns must be 1 to {len(QUESTIONS)}, got {turns}")


class LlamaCppTurns:
    """llama.cpp on a GGUF: a prompt's TTFT, its context then set to the prompt and our
    reply (all but its last token, as our slot keeps it), so the next turn's prompt finds
    the same prefix in both systems; `keep` False resets it before each prompt instead."""

    def __init__(self, gguf: Path, *, threads: int, n_ctx: int, keep: bool) -> None:
        from sandwich.bench.serving_peers import _llama

        self.llm, self.keep = _llama(gguf, threads=threads, n_ctx=n_ctx), keep
        next(iter(self.llm.generate([1, 2, 3], top_k=1, temp=0.0)))  # untimed: buffers, pages
        self.llm.reset()

    def new_conversation(self) -> None:
        self.llm.reset()

    def turn(self, prompt: tuple[int, ...], reply: tuple[int, ...]) -> float:
        """The prompt's TTFT in ms (its prefix reused when kept)."""
        if not self.keep:
            self.llm.reset()
        time.sleep(SETTLE_S)
        t0 = time.perf_counter()
        next(iter(self.llm.generate(list(prompt), top_k=1, temp=0.0)))
        ttft = (time.perf_counter() - t0) * 1e3
        if self.keep:
            self.llm.eval(list(reply[:-1]))  # its context: the prompt and our reply, as our slot
        return ttft

    def close(self) -> None:
        self.llm.close()


def run_prefix_bench(*, reuse, whole, tok, turns: int, max_new_tokens: int, rounds: int,
                     command: str, machine: str, model: str, threads: int, choices: int = 1,
                     peers: tuple[LlamaCppTurns, LlamaCppTurns] | None = None,
                     log: Callable[[str], None] = print) -> PrefixResult:
    """`reuse` and `whole`: engines on the same model, prefix reuse on and off (each with
    room for `choices` sequences); `peers`: llama.cpp reset before each prompt, and kept."""
    check_turns(turns)
    stop = tuple(sorted(tok.stop_ids))
    per_turn: list[list[tuple[int, int, float, float, bool]]] = [[] for _ in range(turns)]
    cpp: list[list[tuple[float, float]]] = [[] for _ in range(turns)]
    many: list[tuple[int, float, float, int]] = []
    for r in range(rounds):
        reuse.ex.set_prefix_cache(True)  # a new conversation: nothing kept from the last round
        for peer in peers or ():
            peer.new_conversation()
        messages: list[dict] = []
        for t in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[t]})
            prompt = tuple(tok.encode(tok.render_chat(messages)))
            req = Request(prompt=prompt, max_new_tokens=max_new_tokens, stop=stop)
            got = {}
            for name in (("reuse", "whole") if (r + t) % 2 == 0 else ("whole", "reuse")):
                eng = reuse if name == "reuse" else whole
                before = eng.ex.kv.reused_tokens
                time.sleep(SETTLE_S)
                (res,) = eng.run([req])
                if res.error:
                    raise SandwichError(f"turn {t + 1}: {res.error}")
                got[name] = (res, len(prompt) - (eng.ex.kv.reused_tokens - before))
            a, b = got["reuse"][0], got["whole"][0]
            per_turn[t].append((len(prompt), got["reuse"][1], b.ttft_ms, a.ttft_ms, a.ids == b.ids))
            if peers:
                cpp[t].append((peers[0].turn(prompt, a.ids), peers[1].turn(prompt, a.ids)))
            reply = [i for i in a.ids if i not in tok.stop_ids]
            messages.append({"role": "assistant", "content": tok.decode(reply)})
        if choices > 1:
            many.append(_choices(reuse, whole, req, choices, r))
    res = PrefixResult(command, machine, model, threads, max_new_tokens, rounds)
    for t, runs in enumerate(per_turn):
        row = TurnRow(t + 1, runs[-1][0], runs[-1][1], statistics.median(x[2] for x in runs),
                      statistics.median(x[3] for x in runs), statistics.median(x[2] / x[3] for x in runs),
                      all(x[4] for x in runs))
        if cpp[t]:
            row.llama_cpp_whole_ms = statistics.median(x[0] for x in cpp[t])
            row.llama_cpp_reuse_ms = statistics.median(x[1] for x in cpp[t])
        res.rows.append(row)
        log(f"turn {row.turn}: prompt {row.prompt_tokens} tokens, {row.prefilled_reuse} prefilled with "
            f"reuse; TTFT {row.ttft_whole_ms:.1f} ms whole, {row.ttft_reuse_ms:.1f} ms with reuse "
            f"({row.speedup:.2f}x){'' if row.same_reply else '; the replies differ'}"
            + (f"; llama.cpp {row.llama_cpp_whole_ms:.1f} ms whole, {row.llama_cpp_reuse_ms:.1f} ms "
               f"with its prefix match" if row.llama_cpp_reuse_ms is not None else ""))
    if many:
        c = res.choices = ChoicesRow(choices, len(req.prompt), many[-1][0],
                                     statistics.median(x[1] for x in many),
                                     statistics.median(x[2] for x in many),
                                     statistics.median(x[1] / x[2] for x in many),
                                     sum(x[3] for x in many), choices * len(many))
        log(f"{c.choices} choices of the {c.prompt_tokens}-token prompt: the last one's TTFT "
            f"{c.last_ttft_whole_ms:.1f} ms whole, {c.last_ttft_reuse_ms:.1f} ms with reuse "
            f"({c.speedup:.2f}x; {c.copied} positions copied)")
    return res


def _choices(reuse, whole, req: Request, n: int, r: int) -> tuple[int, float, float, int]:
    """n seeded choices of one prompt on both engines (which first alternates by round):
    positions copied, the last choice's TTFT on each, and how many choices' tokens agree."""
    reqs = [dataclasses.replace(req, temperature=0.8, seed=1000 * r + j) for j in range(n)]
    got = {}
    for name in (("reuse", "whole") if r % 2 == 0 else ("whole", "reuse")):
        eng = reuse if name == "reuse" else whole
        eng.ex.set_prefix_cache(name == "reuse")  # the conversation's slots are not the point
        before = eng.ex.kv.copied_tokens
        time.sleep(SETTLE_S)
        out = eng.run(reqs)
        if any(o.error for o in out):
            raise SandwichError(f"{n} choices: {next(o.error for o in out if o.error)}")
        got[name] = (eng.ex.kv.copied_tokens - before, max(o.ttft_ms for o in out), [o.ids for o in out])
    return (got["reuse"][0], got["whole"][1], got["reuse"][1],
            sum(a == b for a, b in zip(got["reuse"][2], got["whole"][2], strict=True)))


def write_report(res: PrefixResult, md: Path, js: Path) -> None:
    for p in (md, js):
        p.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res.to_json(), indent=1))
    lines = ["# A chat's turns with and without prefix reuse\n",
             f"- command: `{res.command}`",
             f"- machine: {res.machine}, {res.threads} threads; model {res.model}",
             f"- each turn's prompt is the whole conversation in the model's chat template; two "
             f"engines on the same model and threads, one reusing what the last turn left in its "
             f"slot, one prefilling every prompt whole, the turns alternating between them; "
             f"greedy replies of up to {res.max_new_tokens} tokens",
             f"- {res.rounds} rounds, each a new conversation; TTFT is the median over the rounds, "
             f"`x` the median of the per-turn ratios (whole / reuse)",
             "- `prefilled`: the prompt tokens the reusing engine ran through the model (the rest "
             "it found in the slot)"]
    peer = any(r.llama_cpp_reuse_ms is not None for r in res.rows)
    if peer:
        lines.append("- llama.cpp: llama-cpp-python on an F32 GGUF of the same weights, the same "
                     "threads, f32 KV cache; `whole`: reset before each prompt; `kept`: its context "
                     "kept between turns (the prompt and our reply), so its own prefix match "
                     "decodes only the rest, as its server does; TTFT = the prompt in to the "
                     "first token out, run right after ours in each turn")
    head = "| turn | prompt tokens | prefilled | TTFT whole ms | TTFT reuse ms | x | same reply |"
    rule = "|---:|---:|---:|---:|---:|---:|---|"
    if peer:
        head += " llama.cpp whole ms | llama.cpp kept ms |"
        rule += "---:|---:|"
    lines += ["", head, rule]
    for r in res.rows:
        line = (f"| {r.turn} | {r.prompt_tokens} | {r.prefilled_reuse} | {r.ttft_whole_ms:.1f} | "
                f"{r.ttft_reuse_ms:.1f} | {r.speedup:.2f} | {'yes' if r.same_reply else 'no'} |")
        if peer:
            line += f" {r.llama_cpp_whole_ms:.1f} | {r.llama_cpp_reuse_ms:.1f} |"
        lines.append(line)
    c = res.choices
    if c is not None:
        lines += ["", f"{c.choices} sampled choices of the last turn's prompt ({c.prompt_tokens} "
                  f"tokens), submitted together (OpenAI's `n`), seeded alike on both engines: the "
                  f"last choice waits for every prefill before it. TTFT of the last choice "
                  f"{c.last_ttft_whole_ms:.1f} ms whole, {c.last_ttft_reuse_ms:.1f} ms with reuse "
                  f"(x {c.speedup:.2f}; {c.copied} positions copied from the first choice's slot). "
                  f"The sampled tokens agree in {c.agree} of {c.total} choices (a draw near a "
                  f"boundary can flip: the copied prompt's last token is prefilled alone, and "
                  f"its logits differ from a whole prefill's by rounding, about 1e-6)"]
    md.write_text("\n".join(lines) + "\n")
