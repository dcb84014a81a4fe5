"""The float64 numpy reference every kernel is checked against, on one BLAS thread.

A multi-threaded OpenBLAS call leaves its worker threads spinning for a while afterwards;
on a small machine they steal the cores of whatever kernel is timed next. One thread
spawns no workers, so checking never disturbs the timing that follows it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits


def reference_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    with threadpool_limits(limits=1, user_api="blas"):
        return a.astype(np.float64) @ w.astype(np.float64)


class ReferenceRows:
    """The float64 reference of A[:m] @ W for any m up to len(A), each row computed once.

    A tune checks every new slice at several M on one A and one W; computing the product
    afresh for each check cost more than building the kernels (lm_head of a 1.3B model:
    1.7 s per check at M = 500 on one core, against 0.2 s for an LLVM build). `rows` maps
    rows of A to what the kernel multiplies (it must work row by row, as the 16-bit
    activation rounding does)."""

    def __init__(self, a: np.ndarray, w: np.ndarray,
                 rows: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.a, self.w, self.rows = a, w, rows
        self.done = 0
        self._w64: np.ndarray | None = None
        self._out: np.ndarray | None = None

    def __call__(self, m: int) -> np.ndarray:
        if not 0 < m <= len(self.a):
            raise ValueError(f"reference rows for M={m}: A has {len(self.a)}")
        if m > self.done:
            if self._w64 is None:
                self._w64 = self.w.astype(np.float64)
                self._out = np.empty((len(self.a), self.w.shape[1]), np.float64)
            a = self.a[self.done:m]
            a = self.rows(a) if self.rows is not None else a
            with threadpool_limits(limits=1, user_api="blas"):
                np.matmul(np.asarray(a, np.float64), self._w64, out=self._out[self.done:m])
            self.done = m
        return self._out[:m]


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                        causal: bool) -> np.ndarray:
    """q [Sq, H, D], k/v [Sk, KVH, D] -> [Sq, H, D] in float64; GQA by repeating KV heads;
    causal aligns the last query with the last key."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, 1).astype(np.float64), np.repeat(v, group, 1).astype(np.float64)
    with threadpool_limits(limits=1, user_api="blas"):
        s = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) * scale
        if causal:
            sq, sk = q.shape[0], k.shape[0]
            s = np.where(np.arange(sk)[None] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v)
