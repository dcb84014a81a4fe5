"""One thread owns the engine and runs its continuous batch; other threads (the HTTP server's
event loop) hand it requests and cancellations through a queue and hear back through
callbacks, so concurrent clients share one batch instead of taking turns on a lock."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sandwich.runtime.engine import Engine, Request, Result
from sandwich.runtime.logprobs import TokenLogprob


@dataclass
class Job:
    """A request in flight: `on_token(id, logprob)` per sampled token (the logprob None unless
    the request asks for them), `on_done(result)` once.

    Both callbacks run on the engine thread, so they must only hand data over (e.g.
    `loop.call_soon_threadsafe`)."""

    req: Request
    on_token: Callable[[int, TokenLogprob | None], None]
    on_done: Callable[[Result], None]
    on_prompt: Callable[[tuple[TokenLogprob, ...]], None] | None = None  # the prompt's logprobs
    ticket: int = 0
    cancelled: bool = field(default=False, repr=False)


class EngineLoop:
    """Runs `engine.step()` on its own thread while any request is in flight; idles on the
    inbox otherwise. `submit` and `cancel` are safe from any thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[tuple[str, Job | None]] = queue.SimpleQueue()
        self._jobs: dict[int, Job] = {}
        self._thread = threading.Thread(target=self._run, name="sandwichc-engine", daemon=True)
        self._error: BaseException | None = None
        engine.on_token = self._token
        engine.on_prompt = self._prompt

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the current step, drop what is left, join the thread."""
        self._inbox.put(("stop", None))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._error is None

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def submit(self, job: Job) -> Job:
        self._inbox.put(("submit", job))
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: free the job's slot at the next step boundary."""
        job.cancelled = True
        self._inbox.put(("cancel", job))

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                block = not self.engine.busy
                while True:
                    try:
                        kind, job = self._inbox.get(block=block)
                    except queue.Empty:
                        break
                    block = False
                    if kind == "stop":
                        return
                    self._handle(kind, job)  # type: ignore[arg-type]
                for res in self.engine.step():
                    done = self._jobs.pop(res.ticket, None)
                    if done is not None:
                        done.on_done(res)
        except BaseException as e:  # report to every waiting client, never die silently
            self._error = e
            for job in self._jobs.values():
                _fail(job, f"the engine stopped: {type(e).__name__}: {e}")
            self._jobs.clear()
            raise

    def _handle(self, kind: str, job: Job) -> None:
        if kind == "submit":
            if job.cancelled:
                return
            try:
                job.ticket = self.engine.submit(job.req)
            except Exception as e:  # nothing was queued: this request fails, the rest go on
                _fail(job, f"the engine refused the request: {type(e).__name__}: {e}")
                return
            self._jobs[job.ticket] = job
        elif kind == "cancel" and job.ticket and self._jobs.pop(job.ticket, None) is not None:
            self.engine.cancel(job.ticket)

    def _prompt(self, ticket: int, lps: tuple[TokenLogprob, ...]) -> None:
        job = self._jobs.get(ticket)
        if job is not None and not job.cancelled and job.on_prompt is not None:
            job.on_prompt(lps)

    def _token(self, ticket: int, token: int, lp: TokenLogprob | None) -> None:
        job = self._jobs.get(ticket)
        if job is not None and not job.cancelled:
            job.on_token(token, lp)


def _fail(job: Job, why: str) -> None:
    """Answer a job with an error result and no tokens."""
    job.on_done(Result(rid=job.req.rid, ids=(), finish="error", ttft_ms=0.0, tpot_ms=0.0,
                       arrival_s=0.0, finish_s=0.0, prompt_len=len(job.req.prompt),
                       ticket=job.ticket, error=why))
