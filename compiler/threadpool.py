"""TVM's CPU thread pool, as the runtime resizes and pins it when a phase or a rank changes
its CPU set (TVM sizes the pool once, from TVM_NUM_THREADS, unless told again)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

SHARE_ALL_CORES = -3  # tvm ThreadGroup::kSpecifyThreadShareAllCore


def tvm_pool() -> tuple[Callable[[int, list[str]], None], int] | None:
    """(configure(nthreads, cpus), pool size) of TVM's thread pool, or None without TVM."""
    try:
        import tvm
    except ImportError:
        return None
    config = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    num = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
    if config is None or num is None:
        return None
    size = int(os.environ.get("TVM_NUM_THREADS") or num())
    return (lambda n, cpus: config(SHARE_ALL_CORES, n, cpus)), size


def pin_pool(cpus: Sequence[int]) -> None:
    """Resize TVM's thread pool to len(cpus) threads sharing those cores."""
    import tvm

    f = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if f is not None:
        f(SHARE_ALL_CORES, len(cpus), [str(c) for c in cpus])
