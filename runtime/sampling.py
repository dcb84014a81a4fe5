"""Token selection per request: greedy argmax, or seeded sampling with temperature/top-k/top-p,
after the logit adjustments OpenAI-style clients send (logit_bias, presence and frequency
penalties, and vLLM's repetition_penalty) and, for a structured reply, its grammar's mask.

Each request owns its own `np.random.Generator` and draws exactly one uniform number per
token, so its ids depend only on its seed, its own logits and its own tokens, never on what
else is batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sandwich.errors import ConfigError

if TYPE_CHECKING:
    from sandwich.runtime.structured import Constraint

_NUCLEUS_START = 64  # candidates tried first when top_p is set without top_k
PENALTY_RANGE = 2.0  # presence and frequency penalties, as OpenAI bounds them
BIAS_RANGE = 100.0  # a logit_bias value, as OpenAI bounds it


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 mean no cut.

    The adjustments, applied in this order to a copy of the logits before the pick (greedy
    too): `logit_bias` adds its value to its token's logit; `repetition_penalty` r divides a
    positive logit by r and multiplies a negative one by r for every token of the prompt or
    the reply so far (HF's and vLLM's); then OpenAI's penalties subtract
    count * frequency_penalty + presence_penalty from each token the reply holds `count`
    times; while the reply holds fewer than `min_tokens` tokens, the `suppress` ids (the
    request's stop ids) cannot be picked (vLLM's min_tokens). 0, 0, 1.0 and no bias leave
    the logits as they are."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, value) pairs
    min_tokens: int = 0
    suppress: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def adjusts(self) -> bool:
        """Whether any adjustment changes the logits."""
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or (self.min_tokens and self.suppress))

    def problem(self) -> str | None:
        """Why these parameters are invalid, or None."""
        if not np.isfinite(self.temperature) or self.temperature < 0:
            return f"temperature must be >= 0 (0 = greedy), got {self.temperature}"
        if self.top_k < 0:
            return f"top_k must be >= 0 (0 = no cut), got {self.top_k}"
        if not 0.0 < self.top_p <= 1.0:
            return f"top_p must be in (0, 1], got {self.top_p}"
        for name in ("presence_penalty", "frequency_penalty"):
            x = getattr(self, name)
            if not -PENALTY_RANGE <= x <= PENALTY_RANGE:  # NaN fails both comparisons
                return f"{name} must be in [-{PENALTY_RANGE:g}, {PENALTY_RANGE:g}], got {x}"
        if not (np.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            return f"repetition_penalty must be > 0 (1 = none), got {self.repetition_penalty}"
        if self.min_tokens < 0:
            return f"min_tokens must be >= 0, got {self.min_tokens}"
        for token, value in self.logit_bias:
            if token < 0:
                return f"logit_bias token id must be >= 0, got {token}"
            if not -BIAS_RANGE <= value <= BIAS_RANGE:
                return f"logit_bias value must be in [-{BIAS_RANGE:g}, {BIAS_RANGE:g}], got {value}"
        return None


class Sampler:
    """Picks the next token of one request from its logits row (float32, vocab)."""

    def __init__(self, params: SamplingParams, scratch: np.ndarray | None = None,
                 prompt: Sequence[int] = (), constraint: Constraint | None = None) -> None:
        why = params.problem()
        if why:
            raise ConfigError(why)
        self.params = params
        # any integer seeds (OpenAI's is an int64; numpy takes only seeds >= 0): a negative one
        # by its 64-bit two's complement, so -1 is as reproducible as 1
        self.rng = np.random.default_rng(params.seed % (1 << 64))
        self._scratch = scratch  # (2, vocab) float64, shared by the engine's samplers
        self._adjust = _Adjustments(params, prompt) if params.adjusts else None
        # a structured reply's grammar (runtime/structured.py): last, on the adjusted row
        self.constraint = constraint
        self._masked: np.ndarray | None = None

    def __call__(self, row: np.ndarray) -> int:
        """The next token from a logits row (left as it is: logprobs read it after)."""
        p = self.params
        raw = row
        if self._adjust is not None:
            row = self._adjust(row)
        if self.constraint is not None:
            if row is raw:  # the mask goes on a copy of its own
                if self._masked is None or self._masked.shape != raw.shape:
                    self._masked = np.empty_like(raw)
                row = self._masked
                np.copyto(row, raw)
            row = self.constraint.mask(row, raw)
        if p.greedy:
            token = int(np.argmax(row))
        else:
            vocab = row.shape[0]
            k = p.top_k if 0 < p.top_k < vocab else vocab
            token = self._full(row) if k == vocab and p.top_p >= 1.0 else self._cut(row, k)
        if self._adjust is not None:
            self._adjust.saw(token)
        if self.constraint is not None:
            self.constraint.advance(token)
        return token

    def _weights(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """exp((row - max) / T) into the first scratch row; the second is free for a CDF."""
        vocab = row.shape[0]
        if self._scratch is None or self._scratch.shape[1] < vocab:
            self._scratch = np.empty((2, vocab))
        w, other = self._scratch[0, :vocab], self._scratch[1, :vocab]
        np.subtract(row, row.max(), out=w)
        np.multiply(w, 1.0 / self.params.temperature, out=w)
        np.exp(w, out=w)
        return w, other

    def _full(self, row: np.ndarray) -> int:
        """Inverse-CDF sampling over the whole vocabulary in preallocated scratch rows."""
        vocab = row.shape[0]
        w, cdf = self._weights(row)
        np.cumsum(w, out=cdf)
        u = self.rng.random() * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), vocab - 1))

    def _cut(self, row: np.ndarray, k: int) -> int:
        """Top-k, then top-p on the renormalised top-k (HF's order). Without top_k the nucleus
        is found by growing a top-n candidate set until it holds top_p of the mass, so a
        peaked distribution only sorts a few dozen logits."""
        p, vocab = self.params, row.shape[0]
        m, inv_t = float(row.max()), 1.0 / p.temperature
        total = None
        if k == vocab:  # top_p alone: the normaliser is the whole vocabulary
            total = float(self._weights(row)[0].sum())
        n = k if total is None else min(_NUCLEUS_START, vocab)
        while True:
            idx = np.argpartition(row, vocab - n)[vocab - n:] if n < vocab else np.arange(vocab)
            idx = idx[np.argsort(-row[idx], kind="stable")]
            w = np.exp((row[idx].astype(np.float64) - m) * inv_t)
            cum = np.cumsum(w)
            mass = p.top_p * (cum[-1] if total is None else total)
            if total is None or cum[-1] >= mass or n >= vocab:
                break
            n = min(16 * n, vocab)
        keep = min(int(np.searchsorted(cum, mass, side="left")) + 1, len(idx))
        u = self.rng.random() * cum[keep - 1]
        return int(idx[min(int(np.searchsorted(cum[:keep], u, side="right")), keep - 1)])


class _Adjustments:
    """One request's logit adjustments (SamplingParams' order), into its own copy of the row;
    it counts the reply's tokens as they are picked."""

    def __init__(self, p: SamplingParams, prompt: Sequence[int]) -> None:
        self.p = p
        bias: dict[int, float] = {}
        for token, value in p.logit_bias:  # a repeated id: its last value, as a JSON object reads
            bias[int(token)] = float(value)
        self.bias_ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        self.bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.prompt = np.unique(np.asarray(prompt, dtype=np.int64))
        self.suppress = np.unique(np.asarray(p.suppress, dtype=np.int64))
        self.counts: dict[int, int] = {}
        self.picked = 0
        self._row: np.ndarray | None = None

    def saw(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        self.picked += 1

    def __call__(self, row: np.ndarray) -> np.ndarray:
        p, vocab = self.p, row.shape[0]
        if self._row is None or self._row.shape != row.shape:
            self._row = np.empty_like(row)
        out = self._row
        np.copyto(out, row)
        if len(self.bias_ids):
            if int(self.bias_ids.max()) >= vocab:
                raise ConfigError(f"logit_bias token id {int(self.bias_ids.max())} is outside "
                                  f"the vocabulary [0, {vocab})")
            out[self.bias_ids] += self.bias
        seen = np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))
        if p.repetition_penalty != 1.0:
            ids = np.union1d(self.prompt[self.prompt < vocab], seen)
            x = out[ids]
            out[ids] = np.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
        if len(seen) and (p.frequency_penalty or p.presence_penalty):
            n = np.fromiter(self.counts.values(), dtype=np.float32, count=len(seen))
            out[seen] -= n * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
        if self.picked < p.min_tokens and len(self.suppress):
            out[self.suppress[self.suppress < vocab]] = -np.inf
        return out
