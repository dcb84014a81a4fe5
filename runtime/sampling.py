"""Token selection per request: greedy argmax, or seeded sampling with temperature/top-k/top-p.

Each request owns its own `np.random.Generator` and draws exactly one uniform number per
token, so its ids depend only on its seed and its own logits, never on what else is batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sandwich.errors import ConfigError

_NUCLEUS_START = 64  # candidates tried first when top_p is set without top_k


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 mean no cut."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def problem(self) -> str | None:
        """Why these parameters are invalid, or None."""
        if not np.isfinite(self.temperature) or self.temperature < 0:
            return f"temperature must be >= 0 (0 = greedy), got {self.temperature}"
        if self.top_k < 0:
            return f"top_k must be >= 0 (0 = no cut), got {self.top_k}"
        if not 0.0 < self.top_p <= 1.0:
            return f"top_p must be in (0, 1], got {self.top_p}"
        return None


class Sampler:
    """Picks the next token of one request from its logits row (float32, vocab)."""

    def __init__(self, params: SamplingParams, scratch: np.ndarray | None = None) -> None:
        why = params.problem()
        if why:
            raise ConfigError(why)
        self.params = params
        # any integer seeds (OpenAI's is an int64; numpy takes only seeds >= 0): a negative one
        # by its 64-bit two's complement, so -1 is as reproducible as 1
        self.rng = np.random.default_rng(params.seed % (1 << 64))
        self._scratch = scratch  # (2, vocab) float64, shared by the engine's samplers

    def __call__(self, row: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(row))
        vocab = row.shape[0]
        k = p.top_k if 0 < p.top_k < vocab else vocab
        if k == vocab and p.top_p >= 1.0:
            return self._full(row)
        return self._cut(row, k)

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
