"""A stand-in executor for the engine, its loop and the HTTP server: scheduling, timing and
the wire format are tested without compiling kernels."""

import time
from types import SimpleNamespace

import numpy as np

from sandwich.runtime.kv_cache import KVCache


class FakeExecutor:
    """Next token = last token + 1: enough to check the scheduling and the timing logic."""

    def __init__(self, max_batch=2, max_seq=16, vocab=50, step_s=0.0):
        self.kv = KVCache(layers=1, max_batch=max_batch, max_seq=max_seq, kv_heads=1, head_dim=1)
        self.cfg = SimpleNamespace(vocab_size=vocab)
        self.starts: list[tuple[float, tuple]] = []
        self.clock = lambda: 0.0
        self.step_s = step_s  # wall time each call sleeps, so a test can act mid-generation

    def _row(self, tok):
        row = np.zeros(self.cfg.vocab_size, np.float32)
        row[(tok + 1) % len(row)] = 1.0
        return row

    def start(self, prompt):
        self.starts.append((self.clock(), tuple(prompt)))
        slot = self.kv.alloc()
        self.kv.lens[slot] = len(prompt)
        return slot, self._row(prompt[-1])

    def start_scored(self, prompt, top):
        """`start`, and each prompt token's logprob under the row of the token before it."""
        from sandwich.runtime.logprobs import token_logprob

        scored = [token_logprob(self._row(a), b, top) for a, b in zip(prompt[:-1], prompt[1:], strict=True)]
        return (*self.start(prompt), scored)

    def decode(self, slots, tokens):
        time.sleep(self.step_s)
        for s in slots:
            self.kv.lens[s] += 1
        return np.stack([self._row(t) for t in tokens])

    def release(self, slot):
        self.kv.free(slot)


class SpeculatingExecutor(FakeExecutor):
    """The fake with speculative decoding's two calls: every row's logits, then a trim."""

    max_tokens = 64

    def verify(self, slots, tokens):
        for s, t in zip(slots, tokens, strict=True):
            self.kv.check_room(s, len(t))
            self.kv.lens[s] += len(t)
        return np.stack([self._row(t) for ts in tokens for t in ts])

    def trim(self, slot, n):
        self.kv.trim(slot, n)


class RandomExecutor(FakeExecutor):
    """Logits drawn at random, seeded by the last token: every token is possible, so a
    grammar's mask decides what is picked."""

    def _row(self, tok):
        return np.random.default_rng(tok).standard_normal(self.cfg.vocab_size).astype(np.float32)
