"""Continuous batching over an executor: each iteration a scheduling policy (runtime/schedule/)
decides the prefill work and decodes every running sequence in one call; a slot is released
the moment its sequence finishes.

The executor is duck-typed: `start(prompt) -> (slot, logits_row)`, `decode(slots, tokens) ->
logits (B, vocab)`, `release(slot)`, `kv.max_batch`, `kv.max_seq`; hybrid schedules also use
`reserve()` and `iterate(slots, tokens, work)`, splitwise `adopt(n)`. The single-process
`Executor` and the tensor-parallel one both qualify. A bad request becomes an error result
and never stops the others; requests beyond max_batch wait in the queue.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from sandwich.errors import SandwichError
from sandwich.runtime.logprobs import MAX_TOP, TokenLogprob, token_logprob
from sandwich.runtime.phases import PhaseSwitcher
from sandwich.runtime.prefill_work import PrefillWork
from sandwich.runtime.request import Request, RequestError, Result
from sandwich.runtime.sampling import Sampler
from sandwich.runtime.schedule.base import Schedule
from sandwich.runtime.schedule.sandwich import SandwichSchedule
from sandwich.runtime.speculate import Drafter, Speculation
from sandwich.runtime.structured import Grammars


@dataclass
class EngineStats:
    steps: int = 0  # decode calls
    prefills: int = 0
    decode_tokens: int = 0
    max_running: int = 0
    errors: int = 0
    phase_switches: int = 0  # prefill <-> decode transitions
    phase_applied: int = 0  # transitions that changed the CPU set or thread count
    drafted: int = 0  # speculative decoding: tokens guessed, and those the sampler took
    accepted: int = 0


@dataclass
class _Seq:
    req: Request
    arrival: float
    ticket: int
    sampler: Sampler | None = None
    slot: int = -1
    ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # engine clock at each token
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asks
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    first: float = 0.0
    drafter: Drafter | None = None  # speculative decoding's guesses (runtime/speculate.py)


class Engine:
    """FIFO continuous batching; `step()` returns the requests that finished in it."""

    def __init__(self, executor, *, phases: PhaseSwitcher | None = None,
                 vocab_size: int | None = None, max_queue: int | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 on_token: Callable[[int, int, TokenLogprob | None], None] | None = None,
                 schedule: Schedule | None = None, grammars: Grammars | None = None,
                 speculation: Speculation | None = None) -> None:
        self.ex, self.clock = executor, clock
        # structured replies' grammars over the model's tokenizer (None: such requests fail)
        self.grammars = grammars
        # prompt-lookup drafts checked in each decode step (runtime/speculate.py); an executor
        # without `verify` (tensor-parallel, a TP change between phases) decodes a token a step
        self.speculation = speculation
        self.schedule = schedule or SandwichSchedule()
        # (ticket, token id, its log-probability if asked) as each token is sampled: streaming
        self.on_token = on_token
        # (ticket, the prompt's logprobs) once a prompt that asks for them is prefilled
        self.on_prompt: Callable[[int, tuple[TokenLogprob, ...]], None] | None = None
        self.max_batch, self.max_seq = executor.kv.max_batch, executor.kv.max_seq
        self.vocab_size = vocab_size or _vocab_of(executor)
        self.phases = phases or PhaseSwitcher.default()
        self.max_queue = max_queue
        self.stats = EngineStats()
        self._queue: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._done: list[Result] = []
        self._tickets = 0
        # one scratch for every sampler: sampling is sequential within a step
        self._scratch = np.empty((2, self.vocab_size or 1))

    # -- public API ----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._queue or self._running or self._done or self.schedule.busy)

    @property
    def running(self) -> int:
        return len(self._running)

    def submit(self, req: Request, *, arrival: float | None = None) -> int:
        """Queue a request (arrival defaults to now) and return its ticket; an invalid request
        is answered by the next `step()` with an error result."""
        self._tickets += 1
        seq = _Seq(req, self.clock() if arrival is None else arrival, self._tickets)
        why = self.problem(req)
        if why is None and self.max_queue is not None and len(self._queue) >= self.max_queue:
            why = f"queue full ({self.max_queue} waiting requests); retry later or raise max_queue"
        if why is None:
            try:
                grammar = None if req.structure is None else self.grammars.constraint(req.structure)
                seq.sampler = Sampler(req.sampling, self._scratch, req.prompt, grammar)
            except SandwichError as e:
                why = str(e)
        if why is not None:
            self.fail(seq, why)
        else:
            self._queue.append(seq)
        return seq.ticket

    def step(self) -> list[Result]:
        """One iteration of the schedule (by default: admit waiting requests into free slots,
        each prefilled whole, then one decode step for all)."""
        self.schedule.step(self)
        out, self._done = self._done, []
        return out

    def run(self, requests: Iterable[Request]) -> list[Result]:
        """Serve requests that all arrive now; results in submission order."""
        tickets = [self.submit(r) for r in requests]
        done: dict[int, Result] = {}
        while self.busy:
            done.update((r.ticket, r) for r in self.step())
        return [done[t] for t in tickets]

    def cancel(self, ticket: int) -> bool:
        """Drop a waiting or running request (its client went away) and free its slot at
        once; no result is reported for it. False if the ticket is not in the engine."""
        for seq in self._queue:
            if seq.ticket == ticket:
                self._queue.remove(seq)
                return True
        for seq in self._running:
            if seq.ticket == ticket:
                self._release(seq)
                self._running.remove(seq)
                return True
        return self.schedule.cancel(ticket)

    def warm_up(self) -> None:
        """Run one tiny request so lazy kernel loading stays out of the measurements, then
        reset the statistics."""
        n = min(2, self.max_seq)
        self.run([Request(prompt=(0,) * n, max_new_tokens=min(2, self.max_seq - n + 1))])
        self.stats = EngineStats()
        self.phases.switches = self.phases.applied = 0

    def problem(self, req: Request) -> str | None:
        """Why a request can never be served here, or None."""
        n, new = len(req.prompt), req.max_new_tokens
        if n < 1:
            return "empty prompt: a request needs at least one prompt token"
        if n > self.max_seq:
            return f"prompt of {n} tokens is longer than max_seq={self.max_seq}; shorten it or raise max_seq"
        if self.vocab_size:
            bad = [t for t in req.prompt if not 0 <= t < self.vocab_size]
            if bad:
                return f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
            # a stop id outside could never be sampled: the request would run to its length
            for what, ids in (("stop", req.stop), ("logit_bias", [t for t, _ in req.logit_bias])):
                bad = [t for t in ids if not 0 <= t < self.vocab_size]
                if bad:
                    return f"{what} token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
        if req.structure is not None and self.grammars is None:
            return ("a structured reply needs the model's tokenizer, which this engine was not "
                    "given (the server and `sandwichc generate` give it)")
        if new < 1:
            return f"max_new_tokens must be >= 1, got {new}"
        if req.min_tokens > new:
            return f"min_tokens ({req.min_tokens}) must not exceed max_new_tokens ({new})"
        for what, k in (("logprobs", req.logprobs), ("prompt logprobs", req.prompt_logprobs)):
            if k is not None and not 0 <= k <= MAX_TOP:
                return f"{what} must be 0 to {MAX_TOP} (the likeliest tokens shown), got {k}"
        need = self.schedule.scores_with
        if req.prompt_logprobs is not None and not (need and hasattr(self.ex, need)):
            where = f"{self.schedule.name} across processes" if need else self.schedule.name
            return (f"prompt logprobs (echo) need one process that both prefills and decodes "
                    f"(sandwich, chunked or layered, no --tp); this engine runs {where}")
        if n + new - 1 > self.max_seq:  # the last token is sampled, never written to the cache
            return (f"prompt of {n} tokens + {new} new tokens needs {n + new - 1} cache positions, "
                    f"beyond max_seq={self.max_seq}; lower max_new_tokens or raise max_seq")
        return None

    # -- what a schedule drives (runtime/schedule/) ----------------------------------------
    @property
    def waiting(self) -> deque[_Seq]:
        """Requests not yet handed to the executor, oldest first."""
        return self._queue

    @property
    def free_slots(self) -> int:
        """Batch slots that no running sequence holds (a schedule subtracts its own)."""
        return self.max_batch - len(self._running)

    def prefill(self, seq: _Seq) -> None:
        """Prefill a whole prompt in a free slot and sample its first token."""
        self.enter("prefill")
        try:
            if seq.req.prompt_logprobs is None:
                slot, row = self.ex.start(list(seq.req.prompt))
            else:
                slot, row, seq.prompt_logprobs = self.ex.start_scored(list(seq.req.prompt),
                                                                      seq.req.prompt_logprobs)
                if self.on_prompt is not None:
                    self.on_prompt(seq.ticket, tuple(seq.prompt_logprobs))
        except SandwichError as e:
            self.fail(seq, str(e))
            return
        self.begin(seq, slot, row)

    def begin(self, seq: _Seq, slot: int, row: np.ndarray) -> None:
        """A prompt is in `slot` with its last-token logits `row`: sample the first token."""
        self.stats.prefills += 1
        seq.slot = slot
        self._running.append(seq)
        self.stats.max_running = max(self.stats.max_running, len(self._running))
        self._append(seq, seq.sampler(row), row)  # type: ignore[misc]
        seq.first = self.clock()
        seq.times.append(seq.first)
        self._retire()

    def decode(self) -> None:
        """One token for every running sequence, in one executor call; with speculation, the
        drafted tokens too, in the same call, and as many tokens as the sampler takes."""
        self.enter("decode")
        run = self._running
        drafts = self._drafts()
        try:
            if drafts is not None:
                rows = self.ex.verify([s.slot for s in run],
                                      [[s.ids[-1], *d] for s, d in zip(run, drafts, strict=True)])
            else:
                logits = self.ex.decode([s.slot for s in run], [s.ids[-1] for s in run])
        except SandwichError as e:
            self._fail_running(f"decode step failed: {e}")
            return
        if drafts is not None:
            self._take(rows, drafts)
        else:
            self._sample(logits)

    def _drafts(self) -> list[list[int]] | None:
        """Each running sequence's guessed next tokens (never past its max_new_tokens), or
        None when speculation is off or nothing is guessed."""
        spec, run = self.speculation, self._running
        if spec is None or not spec.draft or not hasattr(self.ex, "verify"):
            return None
        room = getattr(self.ex, "max_tokens", 0) - len(run)  # rows one forward pass holds
        out = []
        for s in run:
            if s.drafter is None or s.drafter.spec != spec:
                s.drafter = Drafter(spec)
            k = min(spec.draft, s.req.max_new_tokens - len(s.ids) - 1, room)
            d = s.drafter.propose(s.req.prompt + tuple(s.ids), k) if k > 0 else []
            room -= len(d)
            out.append(d)
        return out if any(out) else None

    def _take(self, rows: np.ndarray, drafts: list[list[int]]) -> None:
        """Sample each sequence's rows in order while the picks equal its drafts (so the
        tokens are those a token-a-step decode picks: the same rows, the same draws); drop
        the positions of the drafts not taken; retire the finished."""
        self.stats.steps += 1
        now, o = self.clock(), 0
        for s, d in zip(self._running, drafts, strict=True):
            took = 0
            for j in range(len(d) + 1):
                token = s.sampler(rows[o + j])  # type: ignore[misc]
                self._append(s, token, rows[o + j])
                s.times.append(now)
                self.stats.decode_tokens += 1
                if j == len(d) or token != d[j] or self._ends(s):
                    break
                took += 1
            self.ex.trim(s.slot, len(d) - took)
            s.drafter.taken(len(d), took)  # type: ignore[union-attr]
            self.stats.drafted += len(d)
            self.stats.accepted += took
            o += len(d) + 1
        self._retire(now)

    def hybrid(self, work: PrefillWork | None) -> np.ndarray | None:
        """One iteration: a token for every running sequence and, in the same forward pass,
        `work` (part of a prompt's prefill). Returns the prompt's last-token logits once it
        has gone through every layer, else None. A failure fails every running sequence and
        is raised for the schedule to fail its prompt."""
        self.enter("decode" if work is None else "prefill")
        run = self._running
        try:
            logits = self.ex.iterate([s.slot for s in run], [s.ids[-1] for s in run], work)
        except SandwichError as e:
            self._fail_running(f"iteration failed: {e}")
            raise
        self._sample(logits[: len(run)])
        return logits[len(run)] if logits.shape[0] > len(run) else None

    def enter(self, phase: str) -> None:
        self.phases.enter(phase)
        self.stats.phase_switches = self.phases.switches
        self.stats.phase_applied = self.phases.applied

    # -- the loop ------------------------------------------------------------------------
    def _sample(self, logits: np.ndarray) -> None:
        """Sample the running sequences' tokens from their logits rows; retire the finished."""
        run = self._running
        if not run:
            return
        self.stats.steps += 1
        self.stats.decode_tokens += len(run)
        for i, s in enumerate(run):
            self._append(s, s.sampler(logits[i]), logits[i])  # type: ignore[misc]
        now = self.clock()  # one read per step, as before: it is also the finish time
        for s in run:
            s.times.append(now)
        self._retire(now)

    def _fail_running(self, why: str) -> None:
        for s in self._running:
            self._release(s)
            self.fail(s, why)
        self._running = []

    def _append(self, seq: _Seq, token: int, row: np.ndarray) -> None:
        seq.ids.append(token)
        lp = None
        if seq.req.logprobs is not None:
            lp = token_logprob(row, token, seq.req.logprobs)
            seq.logprobs.append(lp)
        if self.on_token is not None:
            self.on_token(seq.ticket, token, lp)

    def _retire(self, now: float | None = None) -> None:
        """Finish every running sequence that hit a stop token or its length; free its slot."""
        now, keep = self.clock() if now is None else now, []
        for s in self._running:
            grammar = getattr(s.sampler, "constraint", None)
            if grammar is not None and grammar.error:
                self._release(s)
                self.fail(s, grammar.error)
                continue
            if not self._ends(s):
                keep.append(s)
                continue
            stop = s.ids[-1] in s.req.stop or (grammar is not None and grammar.done)
            self._release(s)
            n = len(s.ids)
            tpot = (now - s.first) / (n - 1) * 1e3 if n > 1 else 0.0
            self._done.append(Result(rid=s.req.rid, ids=tuple(s.ids), finish="stop" if stop else "length",
                                     ttft_ms=(s.first - s.arrival) * 1e3, tpot_ms=tpot, arrival_s=s.arrival,
                                     finish_s=now, prompt_len=len(s.req.prompt), ticket=s.ticket,
                                     token_times=tuple(s.times), logprobs=tuple(s.logprobs),
                                     prompt_logprobs=tuple(s.prompt_logprobs)))
        self._running = keep

    @staticmethod
    def _ends(s: _Seq) -> bool:
        """Whether the sequence's last token ends it: a stop id, its length, or its grammar
        complete or broken."""
        grammar = getattr(s.sampler, "constraint", None)
        return (s.ids[-1] in s.req.stop or len(s.ids) >= s.req.max_new_tokens
                or (grammar is not None and (grammar.done or grammar.error is not None)))

    def _release(self, seq: _Seq) -> None:
        if seq.slot >= 0:
            self.ex.release(seq.slot)
            seq.slot = -1

    def fail(self, seq: _Seq, why: str) -> None:
        """Answer a request with an error result (the others go on)."""
        self.stats.errors += 1
        now = self.clock()
        self._done.append(Result(rid=seq.req.rid, ids=tuple(seq.ids), finish="error", ttft_ms=0.0,
                                 tpot_ms=0.0, arrival_s=seq.arrival, finish_s=now,
                                 prompt_len=len(seq.req.prompt), ticket=seq.ticket, error=why,
                                 token_times=tuple(seq.times)))


def _vocab_of(executor) -> int | None:
    """The vocabulary size if the executor exposes its model config (both executors do)."""
    cfg = getattr(executor, "cfg", None) or getattr(getattr(executor, "model", None), "config", None)
    return getattr(cfg, "vocab_size", None)


__all__ = ["Engine", "EngineStats", "Request", "RequestError", "Result"]  # requests re-exported
