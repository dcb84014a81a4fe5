"""Perplexity of a text over non-overlapping windows of `ctx` tokens: the windows of HF's
perplexity guide with stride = max_length. Each window is scored from scratch and its first
token is context only, so a text of n tokens scores n - windows tokens."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.logprobs import log_softmax


@dataclass(frozen=True)
class Perplexity:
    perplexity: float
    tokens: int  # tokens scored
    windows: int
    nll: float  # summed negative log-likelihood (nats)


def next_token_logprobs(logits: np.ndarray, next_ids: Sequence[int]) -> np.ndarray:
    """Log-probability of next_ids[i] under the softmax of logits[i] (float64, stable)."""
    logp = log_softmax(logits)
    return logp[np.arange(len(next_ids)), np.asarray(next_ids)]


def windows(n: int, ctx: int) -> list[tuple[int, int]]:
    """[begin, end) of each window; a last window of one token has nothing to score."""
    if ctx < 2:
        raise ConfigError(f"--ctx must be >= 2, got {ctx}")
    return [(b, min(b + ctx, n)) for b in range(0, n, ctx) if min(b + ctx, n) - b >= 2]


def perplexity(ids: Sequence[int], ctx: int, score: Callable[[Sequence[int]], np.ndarray],
               on_window: Callable[[], object] | None = None) -> Perplexity:
    """`score(window)` gives the log-probability of each of window[1:]."""
    spans = windows(len(ids), ctx)
    if not spans:
        raise ConfigError(f"the text has {len(ids)} token(s): perplexity needs at least 2")
    nll, count = 0.0, 0
    for b, e in spans:
        logp = np.asarray(score(ids[b:e]), np.float64)
        nll -= float(logp.sum())
        count += logp.size
        if on_window is not None:
            on_window()
    return Perplexity(math.exp(nll / count), count, len(spans), nll)
