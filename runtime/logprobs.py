"""Log-probabilities of sampled tokens, for clients that ask for them (OpenAI's `logprobs`).

They are the model's own: the log-softmax of the raw logits row, before temperature, top-k
or top-p shape the sampling (vLLM's default, `raw_logprobs`), so a reply's figures mean
the same whatever the sampling settings were, and a greedy reply's are comparable with
`sandwichc perplexity`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP = 20  # OpenAI's limit on top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's log-probability and the `top` most likely tokens at its step
    (id, log-probability), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """The log-softmax along the last axis, in float64 and stable for any logits' scale."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def token_logprob(row: np.ndarray, token: int, top: int) -> TokenLogprob:
    """`token`'s log-probability under the softmax of `row`, and the `top` most likely
    tokens' (equal ones in id order)."""
    logp = log_softmax(row)
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        top = min(top, logp.shape[0])
        ids = np.argpartition(-logp, top - 1)[:top]
        ids = ids[np.lexsort((ids, -logp[ids]))]
        best = tuple((int(i), float(logp[i])) for i in ids)
    return TokenLogprob(int(token), float(logp[token]), best)
