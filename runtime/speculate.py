"""Prompt-lookup drafts for speculative decoding (llama.cpp's lookup decoding, vLLM's n-gram
speculator). A sequence's next tokens are guessed as those that followed the latest earlier
occurrence of its last n tokens (n from `ngram` down to 1) in its prompt and reply; one
forward pass checks every guess (a decode step reads the weights once, whatever its rows),
and the sampler takes the guesses while they equal what it picks. The reply is therefore the
one that decoding a token at a time gives, greedy or seeded; what speculation changes is how
many tokens a weight read yields, which pays where replies copy their context (edits,
summaries, code, RAG answers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sandwich.errors import ConfigError

MAX_WAIT = 16  # steps a sequence waits, at most, after a step whose drafts all failed


@dataclass(frozen=True)
class Speculation:
    """`draft` tokens guessed per step at most (0: off); suffixes of up to `ngram` tokens
    looked up."""

    draft: int = 0
    ngram: int = 3

    def __post_init__(self) -> None:
        if self.draft < 0 or self.ngram < 1:
            raise ConfigError(f"speculation needs draft >= 0 and ngram >= 1, got draft "
                              f"{self.draft} and ngram {self.ngram}")

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the context's
        longest suffix (of at most `ngram` tokens) found in it; [] when none recurs."""
        ctx = np.asarray(context, dtype=np.int64)
        n_ctx = len(ctx)
        if k < 1:
            return []
        for n in range(min(self.ngram, n_ctx - 1), 0, -1):
            starts = n_ctx - n  # windows starting before the suffix's own start
            hit = ctx[:starts] == ctx[starts]
            for j in range(1, n):
                hit &= ctx[j: starts + j] == ctx[starts + j]
            found = np.flatnonzero(hit)
            if len(found):
                i = int(found[-1]) + n
                return ctx[i: i + k].tolist()
        return []


class Drafter:
    """One sequence's drafts. A reply that does not copy its context still finds its last
    token earlier now and then, and checking a wrong guess costs a little more than a plain
    step: so after a step whose drafts all failed it guesses again only after 1, 2, 4, ...
    (at most MAX_WAIT) steps; a draft taken resets the wait."""

    def __init__(self, spec: Speculation) -> None:
        self.spec, self.wait, self.backoff = spec, 0, 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if self.wait > 0:
            self.wait -= 1
            return []
        return self.spec.propose(context, k)

    def taken(self, drafted: int, took: int) -> None:
        if not drafted:
            return
        if took:
            self.backoff = 0
        else:
            self.backoff = min(2 * self.backoff or 1, MAX_WAIT)
            self.wait = self.backoff
