"""What a client asks of the engine and what it gets back (the engine, the schedules, the
benchmarks and the HTTP server all speak these)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from sandwich.errors import SandwichError
from sandwich.runtime.logprobs import TokenLogprob
from sandwich.runtime.sampling import SamplingParams
from sandwich.runtime.structured import Structure


class RequestError(SandwichError):
    """A request cannot be served (the engine reports it and keeps serving the others)."""


@dataclass(frozen=True)
class Request:
    """One generation request; temperature 0 = greedy, else seeded sampling."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[int, ...] = ()
    rid: int | str | None = None
    logprobs: int | None = None  # None: none; k: each token's log-probability and the k likeliest
    prompt_logprobs: int | None = None  # the same for each prompt token after the first
    # logit adjustments before each pick (runtime/sampling.py): none by default
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0  # the stop ids cannot end the reply before this many tokens
    structure: Structure | None = None  # what the reply must parse as (runtime/structured.py)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed,
                              presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty,
                              logit_bias=self.logit_bias, min_tokens=self.min_tokens,
                              suppress=self.stop)


@dataclass(frozen=True)
class Result:
    """What a finished request reports; times are engine-clock seconds, latencies ms.

    finish is 'stop' (a stop token, kept as the last id, or a structured reply's grammar
    complete), 'length' (max_new_tokens) or 'error' (then `error` says why). TTFT counts
    from arrival, so queueing is included; TPOT is (finish - first token) / (tokens - 1),
    0.0 for a single token. token_times holds each token's engine-clock time, so every
    inter-token gap (TBT) is kept: a mean hides the stall a prefill puts between two tokens."""

    rid: int | str | None
    ids: tuple[int, ...]
    finish: str
    ttft_ms: float
    tpot_ms: float
    arrival_s: float
    finish_s: float
    prompt_len: int
    ticket: int = 0  # the engine's submission number
    error: str | None = None
    token_times: tuple[float, ...] = ()  # engine-clock seconds, one per id
    logprobs: tuple[TokenLogprob, ...] = ()  # one per id when the request asked for them
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # one per prompt token after the first, if asked

    @property
    def tbt_ms(self) -> tuple[float, ...]:
        """Every gap between consecutive tokens, in ms (len(ids) - 1 values)."""
        return tuple((b - a) * 1e3 for a, b in pairwise(self.token_times))

    @property
    def e2e_ms(self) -> float:
        """Arrival to the last token (queueing included)."""
        return (self.finish_s - self.arrival_s) * 1e3
