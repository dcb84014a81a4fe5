"""Wall-clock timing shared by the tuner, the benchmarks and the peers: warm-up, repeats, median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Median and spread of one callable's run time, in seconds."""

    median_s: float
    min_s: float
    repeats: int


def time_callable(
    fn: Callable[[], object],
    *,
    warmup: int = 2,
    repeat: int = 7,
    min_repeat_s: float = 0.02,
    max_number: int = 1000,
    max_total_s: float | None = None,
) -> Timing:
    """Time `fn` after `warmup` calls; each repeat runs it enough times to last `min_repeat_s`.

    With `max_total_s`, repeats stop early (after at least 3) once that much time is spent:
    long kernels need fewer samples for the same confidence."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, min(max_number, int(min_repeat_s / one)))
    samples: list[float] = []
    start = time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
        if max_total_s is not None and len(samples) >= 3 and time.perf_counter() - start > max_total_s:
            break
    return Timing(median_s=statistics.median(samples), min_s=min(samples), repeats=len(samples))


def gflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9 if seconds > 0 else 0.0
