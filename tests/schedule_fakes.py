"""A known speed for GEMM schedules, and candidates measured at it: what the cost model and
the guided search are tested on, without timing anything."""

import numpy as np

from sandwich.tuner.space import Isa, clamp, micro_kernels, polymerizations, slice_caps, useful
from sandwich.tuner.trial_log import Sample
from sandwich.types import ComputeSlice, KernelSchedule

AVX2 = Isa(8, 16)
CONSTANTS = {"lanes": 8, "registers": 16, "peak_gflops": 90.0, "accumulators": 8,
             "l1d_bytes": 32 << 10, "l2_bytes": 512 << 10, "llc_bytes": 32 << 20,
             "l1_read_gbs": 100.0, "l2_read_gbs": 70.0, "dram_read_gbs": 14.0}
SHAPES = ((768, 768), (2304, 768), (768, 3072))
MS = (1, 2, 3, 4, 6, 8, 16, 24, 32, 64, 96, 128, 256, 512)


def speed(s: KernelSchedule, m: int, n: int, k: int) -> float:
    """A known GFLOPS of a schedule: FMA chains filled, loads per FMA, the busiest thread's
    share, a weight slice past half of L2, a DRAM bound while M is small."""
    mk, sl, pl = s.micro_kernel, s.slice, s.polymerization
    acc = mk.mu_m * mk.mu_n / 8
    loads = (mk.mu_m + mk.mu_n / 8) / acc
    blocks = -(-m // mk.mu_m)
    rows = min(-(-blocks // pl.t_m) * mk.mu_m, m) * pl.t_m / m
    cols = -(-(n // mk.mu_n) // pl.t_n) * pl.t_n * mk.mu_n / n
    spill = max(1.0, sl.b_k * sl.b_n * 4 / (256 << 10))
    compute = 90.0 * pl.threads * min(1.0, acc / 8) / (1 + 0.5 * loads) / (rows * cols * spill)
    compute /= 1 + 2.0 * (m % mk.mu_m) / m + 0.3 * (pl.t_k - 1)
    bound = m / 2 * 14.0 * pl.threads if m <= 8 else 1e9
    return 1 / (1 / compute + 1 / bound)


def candidates(rng, m: int, n: int, k: int, count: int = 16) -> list[KernelSchedule]:
    out = []
    pairs = [(mk, pl) for mk in micro_kernels(AVX2, 32) for pl in polymerizations(2)
             if useful(pl, m, n, k, mk)]
    for _ in range(count):
        mk, pl = pairs[rng.integers(len(pairs))]
        want = ComputeSlice(mk.mu_m * int(rng.integers(1, 5)), mk.mu_n * int(rng.integers(1, 9)),
                            16 * int(rng.integers(4, 41)))
        out.append(KernelSchedule(mk, clamp(want, slice_caps(m, n, k, mk, pl)), pl, 32))
    return out


def synthetic(seed: int = 0, noise: float = 0.03) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [Sample(s, m, n, k, speed(s, m, n, k) * float(np.exp(rng.normal(0, noise))),
                   source=f"n{n}_k{k}_float32_t2")
            for n, k in SHAPES for m in MS for s in candidates(rng, m, n, k)]


