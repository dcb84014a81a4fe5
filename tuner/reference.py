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
