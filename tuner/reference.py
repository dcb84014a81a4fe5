"""The float64 numpy reference every kernel is checked against, on one BLAS thread.

A multi-threaded OpenBLAS call leaves its worker threads spinning for a while afterwards;
on a small machine they steal the cores of whatever kernel is timed next. One thread
spawns no workers, so checking never disturbs the timing that follows it."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits


def reference_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    with threadpool_limits(limits=1, user_api="blas"):
        return a.astype(np.float64) @ w.astype(np.float64)


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
