"""What the dynamic-shape baselines share: the problem, the per-M choice, and a fitted cost model.

DietCode-, Roller- and MikPoly-style tuners get the same micro-kernel candidates, the same
GEMM template and the same injected `measure(schedule, m)` as sandwich-kernel (Sandwich §8.2);
they differ only in how they build slices and polymerizations.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sandwich.errors import ConfigError
from sandwich.tuner.measure import Measure
from sandwich.tuner.space import clamp, polymerizations, slice_caps, useful
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization


@dataclass(frozen=True)
class Problem:
    """One (N, K) GEMM op and the machine facts a baseline may use."""

    n: int
    k: int
    pack_n: int
    threads: int
    micro_kernels: tuple[MicroKernel, ...]
    l1_bytes: int = 48 << 10
    l2_bytes: int = 2 << 20


@dataclass(frozen=True)
class Choice:
    """The schedule a baseline runs at one M, and what choosing it cost at that M."""

    m: int
    schedule: KernelSchedule
    trials: int  # measurements made for this M (0: chosen by the cost model alone)
    seconds: float


def fixed_slice(mk: MicroKernel) -> ComputeSlice:
    """The shape-independent slice compiled with each fixed micro-kernel (4 x 4 tiles, 256 deep)."""
    return ComputeSlice(4 * mk.mu_m, 4 * mk.mu_n, 256)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def features(m: int, n: int, k: int, mk: MicroKernel, sl: ComputeSlice,
             pl: Polymerization) -> tuple[float, float]:
    """(flops, bytes) of the busiest thread: rows and columns padded to whole micro-kernels,
    its W share read once per b_m block of rows, and split-K partial sums written and summed."""
    rows = _cdiv(_cdiv(m, mk.mu_m), pl.t_m) * mk.mu_m
    cols = _cdiv(_cdiv(n, mk.mu_n), pl.t_n) * mk.mu_n
    depth = _cdiv(k, pl.t_k)
    flops = 2.0 * rows * cols * depth
    w_bytes = 4.0 * cols * depth * _cdiv(rows, max(1, min(sl.b_m, rows)))
    red_bytes = 8.0 * pl.t_k * rows * cols if pl.t_k > 1 else 0.0
    return flops, w_bytes + red_bytes


@dataclass(frozen=True)
class CostModel:
    """seconds = flops * s_per_flop + bytes * s_per_byte, fitted to a few measured runs."""

    s_per_flop: float
    s_per_byte: float

    def seconds(self, feats: tuple[float, float]) -> float:
        return feats[0] * self.s_per_flop + feats[1] * self.s_per_byte


def fit(samples: Sequence[tuple[tuple[float, float], float]]) -> CostModel:
    """Least squares over (features, seconds), both coefficients kept non-negative."""
    if not samples:
        raise ConfigError("the cost model needs at least one measured sample")
    x = np.array([f for f, _ in samples], dtype=np.float64)
    y = np.array([s for _, s in samples], dtype=np.float64)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    if coef.min() < 0 or not np.all(np.isfinite(coef)):
        # one term alone: keep whichever explains the samples better
        fits = []
        for j in range(2):
            c = float(x[:, j] @ y / max(x[:, j] @ x[:, j], 1e-300))
            fits.append((float(np.sum((x[:, j] * c - y) ** 2)), j, c))
        _, j, c = min(fits)
        coef = np.zeros(2)
        coef[j] = c
    return CostModel(float(coef[0]), float(coef[1]))


def schemes(p: Problem, m: int, mk: MicroKernel) -> list[Polymerization]:
    """Polymerizations that give every thread work, as sandwich-kernel's search uses."""
    return [pl for pl in polymerizations(p.threads) if useful(pl, m, p.n, p.k, mk)] \
        or [Polymerization(1, 1, 1)]


def default_poly(p: Problem, m: int, mk: MicroKernel) -> Polymerization:
    """All threads along the dimension with more micro-kernel tiles (sandwich's default too)."""
    if p.n // mk.mu_n >= max(1, m // mk.mu_m):
        return Polymerization(1, p.threads, 1)
    return Polymerization(p.threads, 1, 1)


def schedule(p: Problem, mk: MicroKernel, sl: ComputeSlice, pl: Polymerization,
             m: int) -> KernelSchedule:
    """A schedule whose slice is clamped so every thread of `pl` still has work at this M."""
    return KernelSchedule(mk, clamp(sl, slice_caps(m, p.n, p.k, mk, pl)), pl, p.pack_n)


class DynamicTuner(ABC):
    """A baseline: shape-independent work once (`prepare`), then a schedule per M (`choose`)."""

    name = ""

    def __init__(self, problem: Problem, measure: Measure, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not problem.micro_kernels:
            raise ConfigError(f"{self.name}: no micro-kernel candidates for N={problem.n}")
        self.p = problem
        self.measure = measure
        self.clock = clock
        self.offline_trials = 0
        self.offline_seconds = 0.0
        self._prepared = False

    def _gflops(self, sched: KernelSchedule, m: int) -> float:
        res = self.measure(sched, m)
        return res.gflops if res.ok else 0.0

    def prepare(self) -> None:
        """Run the offline step once (profiling, fitting); its cost is amortised over all M."""
        if self._prepared:
            return
        t0 = self.clock()
        self.offline_trials = self._offline()
        self.offline_seconds = self.clock() - t0
        self._prepared = True

    def _offline(self) -> int:
        """Shape-independent work; returns the number of measurements it made."""
        return 0

    def choose(self, m: int) -> Choice:
        self.prepare()
        t0 = self.clock()
        sched, trials = self._choose(m)
        return Choice(m, sched, trials, self.clock() - t0)

    @abstractmethod
    def _choose(self, m: int) -> tuple[KernelSchedule, int]:
        """The schedule for this M and how many measurements choosing it took."""

    def tune(self, ms: Sequence[int]) -> list[Choice]:
        return [self.choose(m) for m in ms]


def profile_samples(tuner: DynamicTuner, mk: MicroKernel,
                    sample_ms: Sequence[int]) -> tuple[list[tuple[tuple[float, float], float]], int]:
    """Measure the fixed micro-kernel at each sample M under both one-dimension schemes."""
    p = tuner.p
    samples, trials = [], 0
    pls = [Polymerization(1, p.threads, 1), Polymerization(p.threads, 1, 1)]
    for m in sample_ms:
        for pl in dict.fromkeys(pls):
            sched = schedule(p, mk, fixed_slice(mk), pl, m)
            res = tuner.measure(sched, m)
            trials += 1
            if res.ok and res.seconds > 0:
                sl = sched.slice
                samples.append((features(m, p.n, p.k, mk, sl, pl), res.seconds))
    return samples, trials


def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0

