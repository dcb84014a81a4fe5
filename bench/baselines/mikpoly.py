"""MikPoly-style baseline (Sandwich ref. [59]): micro-kernels compiled ahead, polymerized per shape by a cost model.

Reimplemented: every micro-kernel is compiled and profiled ahead of time, shape-independently;
at run time a cost model chooses, for each dynamic shape, which micro-kernel to use and how
to polymerize it over the cores, without measuring that shape.
Simplified for this CPU template: the slice of each micro-kernel is fixed (`fixed_slice`),
so polymerization here is the thread split (t_m, t_n, t_k) of the template rather than
MikPoly's multi-region mix of micro-kernels; the cost model is one two-term fit per
micro-kernel (padded flops and bytes of the busiest thread, see `dynamic.features`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sandwich.bench.baselines.dynamic import (
    CostModel,
    DynamicTuner,
    features,
    fit,
    fixed_slice,
    profile_samples,
    schedule,
    schemes,
)
from sandwich.types import KernelSchedule, MicroKernel

SAMPLE_MS = (16, 256)


class MikPoly(DynamicTuner):
    """All micro-kernels profiled ahead; per M the cost model picks micro-kernel and polymerization."""

    name = "mikpoly"

    def __init__(self, *args, sample_ms: Sequence[int] = SAMPLE_MS, **kw) -> None:
        super().__init__(*args, **kw)
        self.sample_ms = tuple(sample_ms)
        self.models: dict[MicroKernel, CostModel] = {}

    def _offline(self) -> int:
        trials = 0
        for mk in self.p.micro_kernels:
            samples, n = profile_samples(self, mk, self.sample_ms)
            trials += n
            if samples:  # a micro-kernel that never built is left out
                self.models[mk] = fit(samples)
        return trials

    def _choose(self, m: int) -> tuple[KernelSchedule, int]:
        p = self.p
        models = self.models or {mk: CostModel(1.0, 0.0) for mk in p.micro_kernels}
        cands = [(model, schedule(p, mk, fixed_slice(mk), pl, m))
                 for mk, model in models.items() for pl in schemes(p, m, mk)]
        _, best = min(cands, key=lambda c: c[0].seconds(features(
            m, p.n, p.k, c[1].micro_kernel, c[1].slice, c[1].polymerization)))
        return best, 0
