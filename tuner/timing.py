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
    give_up_s: float | None = None,
) -> Timing:
    """Time `fn` after `warmup` calls; each repeat runs it enough times to last `min_repeat_s`
    (found from one more call, or from the last warm-up call when that alone lasted twice as
    long: at large M one GEMM call of a big layer takes seconds).

    With `max_total_s`, repeats stop early (after at least 3) once that much time is spent:
    long kernels need fewer samples for the same confidence. With `give_up_s`, a first repeat
    slower than that is the only one: a candidate far behind the best needs no second look;
    nor does one whose long warm-up call (one that fills two repeats) was already that slow,
    which at large M halves what a loser costs (lm_head at M = 2048: 1.6 s a call)."""
    one = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        one = time.perf_counter() - t0
    if give_up_s is not None and warmup and one >= 2 * min_repeat_s and one > give_up_s:
        return Timing(median_s=one, min_s=one, repeats=1)
    if one < 2 * min_repeat_s:  # a long warm-up call already says one call fills a repeat
        t0 = time.perf_counter()
        fn()
        one = time.perf_counter() - t0
    one = max(one, 1e-7)
    number = max(1, min(max_number, int(min_repeat_s / one)))
    samples: list[float] = []
    start = time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
        if give_up_s is not None and len(samples) == 1 and samples[0] > give_up_s:
            break
        if max_total_s is not None and len(samples) >= 3 and time.perf_counter() - start > max_total_s:
            break
    return Timing(median_s=statistics.median(samples), min_s=min(samples), repeats=len(samples))


def gflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9 if seconds > 0 else 0.0
