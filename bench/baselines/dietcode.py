"""DietCode-style baseline (Zheng et al., MLSys 2022): shared micro-kernels + a cost model, no per-shape profiling.

Reimplemented: DietCode's shape-generic micro-kernels, profiled offline on a few sample
shapes, and a cost model fitted to those samples that dispatches each dynamic shape at run
time without measuring it.
Simplified for this CPU template: a "micro-kernel" is one of sandwich-kernel's register
tiles with a fixed, shape-independent slice (`fixed_slice`); the one with the best geomean
speed over the samples is shared by all shapes; the cost model is two-term (padded flops
and weight/partial-sum bytes of the busiest thread, see `dynamic.features`) instead of
DietCode's learned micro-kernel cost model, and it picks only the polymerization per shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandwich.bench.baselines.dynamic import (
    CostModel,
    DynamicTuner,
    features,
    fit,
    fixed_slice,
    geomean,
    profile_samples,
    schedule,
    schemes,
)
from sandwich.types import KernelSchedule, MicroKernel

SAMPLE_MS = (16, 256)


class DietCode(DynamicTuner):
    """One shared micro-kernel picked offline; per M the cost model picks the polymerization."""

    name = "dietcode"

    def __init__(self, *args, sample_ms: Sequence[int] = SAMPLE_MS, **kw) -> None:
        super().__init__(*args, **kw)
        self.sample_ms = tuple(sample_ms)
        self.mk: MicroKernel | None = None
        self.model: CostModel | None = None

    def _offline(self) -> int:
        trials, best = 0, (-1.0, self.p.micro_kernels[0], [])
        for mk in self.p.micro_kernels:
            samples, n = profile_samples(self, mk, self.sample_ms)
            trials += n
            speed = geomean([f[0] / s for f, s in samples])
            if speed > best[0]:
                best = (speed, mk, samples)
        _, self.mk, samples = best
        self.model = fit(samples) if samples else CostModel(1.0, 0.0)
        return trials

    def _choose(self, m: int) -> tuple[KernelSchedule, int]:
        assert self.mk is not None and self.model is not None
        mk, model, p = self.mk, self.model, self.p
        cands = [schedule(p, mk, fixed_slice(mk), pl, m) for pl in schemes(p, m, mk)]
        best = min(cands, key=lambda s: model.seconds(
            features(m, p.n, p.k, mk, s.slice, s.polymerization)))
        return best, 0
