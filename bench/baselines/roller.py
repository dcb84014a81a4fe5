"""Roller-style baseline (Zhu et al., OSDI 2022): scale up the slice one cache level at a time, then scale out.

Reimplemented: Roller's rTile construction. Starting from the register tile (the micro-kernel),
the tile grows greedily with a constant step per dimension (a micro-kernel row, a micro-kernel
column, a cache line of K) at one memory level at a time, L1 then L2, always taking the step
that raises the tile's compute intensity (flops per byte of its footprint) most while the
footprint fits that level; then the tile is replicated across all cores along the spatial
dimension with more tiles (no split-K). Roller ranks the resulting candidates with its
micro-performance model and profiles only the top few.
Simplified: the performance model that ranks candidates is the tile's compute intensity alone,
and the top `top_k` candidates (one per micro-kernel) are measured at each M.
"""

from __future__ import annotations

from dataclasses import astuple

from sandwich.bench.baselines.dynamic import DynamicTuner
from sandwich.tuner.space import K_UNIT, slice_caps
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

FILL = 0.5  # a tile may use this share of a cache level (the rest for other data)


def footprint(t: tuple[int, int, int]) -> int:
    """Bytes of the A, W and C blocks of a (b_m, b_n, b_k) tile, fp32."""
    b_m, b_n, b_k = t
    return 4 * (b_m * b_k + b_k * b_n + b_m * b_n)


def intensity(t: tuple[int, int, int]) -> float:
    return 2.0 * t[0] * t[1] * t[2] / footprint(t)


def scale_up(mk: MicroKernel, caps: ComputeSlice, levels: tuple[int, ...]) -> ComputeSlice:
    """Grow from the register tile, one cache level at a time, one constant step at a time."""
    steps = (mk.mu_m, mk.mu_n, K_UNIT)
    limit = astuple(caps)
    cur = (min(mk.mu_m, limit[0]), min(mk.mu_n, limit[1]), min(K_UNIT, limit[2]))
    for capacity in levels:
        while True:
            grown = []
            for d in range(3):
                t = list(cur)
                t[d] = min(cur[d] + steps[d], limit[d])
                if t[d] != cur[d] and footprint(tuple(t)) <= capacity:
                    grown.append(tuple(t))
            if not grown:
                break
            cur = max(grown, key=intensity)  # ties: the first dimension in (m, n, k) order
    return ComputeSlice(*cur)


def scale_out(m: int, n: int, sl: ComputeSlice, threads: int) -> Polymerization:
    """Replicate the tile over all cores along the spatial dimension with more tiles."""
    if -(-m // sl.b_m) >= -(-n // sl.b_n):
        return Polymerization(threads, 1, 1)
    return Polymerization(1, threads, 1)


class Roller(DynamicTuner):
    """Per M: one scaled-up, scaled-out candidate per micro-kernel; measure the top_k by intensity."""

    name = "roller"

    def __init__(self, *args, top_k: int = 4, fill: float = FILL, **kw) -> None:
        super().__init__(*args, **kw)
        self.top_k = top_k
        self.levels = (int(fill * self.p.l1_bytes), int(fill * self.p.l2_bytes))

    def candidate(self, mk: MicroKernel, m: int) -> KernelSchedule:
        p = self.p
        whole = slice_caps(m, p.n, p.k, mk, Polymerization(1, 1, 1))
        sl = scale_up(mk, whole, self.levels)
        pl = scale_out(m, p.n, sl, p.threads)
        caps = slice_caps(m, p.n, p.k, mk, pl)  # every core gets a tile
        sl = ComputeSlice(min(sl.b_m, caps.b_m), min(sl.b_n, caps.b_n), sl.b_k)
        return KernelSchedule(mk, sl, pl, p.pack_n)

    def ranked(self, m: int) -> list[KernelSchedule]:
        """Candidates by modelled intensity, best first (stable: micro-kernel order on ties)."""
        fitting = [mk for mk in self.p.micro_kernels if mk.mu_m <= m] or \
            [min(self.p.micro_kernels, key=lambda mk: mk.mu_m)]
        cands = list(dict.fromkeys(self.candidate(mk, m) for mk in fitting))
        return sorted(cands, key=lambda s: -intensity(astuple(s.slice)))

    def _choose(self, m: int) -> tuple[KernelSchedule, int]:
        top = self.ranked(m)[: self.top_k]
        speeds = [(self._gflops(s, m), -i, s) for i, s in enumerate(top)]
        g, _, best = max(speeds, key=lambda x: (x[0], x[1]))
        return best, len(top)
