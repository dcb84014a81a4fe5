"""Is anything else using the CPUs? Timings taken on a busy machine are slow and noisy.

With 2 cores, one other busy process halves a 2-thread kernel and scrambles the ranking of
a search; the tuner and the benchmarks say so rather than store figures that look clean.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BUSY_FRACTION = 0.15  # other processes using more than this share of all CPUs = busy


def other_cpu_load(interval: float = 0.5) -> float:
    """Share of all CPUs (0..1) used by other processes over `interval` seconds."""
    import psutil

    me = psutil.Process()
    mine0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()
    total = psutil.cpu_percent(interval=interval) / 100.0  # blocks for `interval`
    mine = (sum(me.cpu_times()[:2]) - mine0) / max(time.perf_counter() - t0, 1e-3)
    return max(0.0, total - mine / (psutil.cpu_count() or 1))


def busy_warning(load: float, what: str) -> str:
    """A one-line warning when `load` (from other_cpu_load) is above BUSY_FRACTION, else ''."""
    if load <= BUSY_FRACTION:
        return ""
    return (f"warning: other processes use {100 * load:.0f}% of the CPUs; {what} will be slower "
            f"and noisier than on a quiet machine")


def warn_if_busy(what: str, log: Callable[[str], object]) -> float:
    """Measure other processes' CPU share, log the warning if the machine is busy, and
    return the share (the benchmarks record it)."""
    load = other_cpu_load()
    warning = busy_warning(load, what)
    if warning:
        log(warning)
    return load
