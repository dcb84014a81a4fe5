"""The search's Roof-Surface bound (issue 26): an upper bound on the GFLOPS one candidate
schedule can reach at M, so that the search drops a candidate whose bound falls below the best
GFLOPS it has already measured at that M, instead of building, checking and timing it.

The machine's Roof-Surface bound (tuner/roofsurface.py) is the same for every schedule of a
format, M, N and K; what a schedule adds is how it shares the work among the threads. Its
busiest thread streams `weight_imbalance` times an even share of the weights and does that
times its rows' share of the products, and the others wait for it, so the schedule's bound is
the machine's MEM and VEC terms over the first and its MTX term over the second. It keeps
Eq. 1's min of the three where the reports add the VEC and MTX times (Machine.shared): the
looser bound prunes less, and never a candidate that could have won."""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.tuner import roofsurface as rs
from sandwich.tuner.machine_model import MachineModel
from sandwich.tuner.space import m_thread_blocks, weight_imbalance
from sandwich.types import KernelSchedule
from sandwich.weight_formats import format_of


def busiest_shares(s: KernelSchedule, m: int, n: int, k: int) -> tuple[float, float]:
    """How much more than an even share the busiest thread streams of the weights and does
    of the products (1.0 each when even); the rows go as `space.m_thread_blocks` splits them."""
    weights = weight_imbalance(s, n, k)
    per_thread, last, tail = m_thread_blocks(s, m)
    mu_m, t_m = s.micro_kernel.mu_m, s.polymerization.t_m
    rows = max(per_thread * mu_m, last * mu_m + tail) * t_m / m
    return weights, weights * max(1.0, rows)


@dataclass(frozen=True)
class CandidateBound:
    """The bound of any schedule of one (N, K, dtype) GEMM on this machine's rates."""

    rates: rs.HostRates
    n: int
    k: int
    dtype: str
    bf16_dot: bool

    def __call__(self, s: KernelSchedule, m: int) -> float:
        """The bound in GFLOPS of schedule `s` at M."""
        fmt = format_of(self.dtype).name
        sig = rs.kernel_signature(fmt, self.rates.lanes, k=self.k, bf16_dot=self.bf16_dot)
        terms = rs.rates(self.rates.machine(m, fmt, k=self.k), sig)
        weights, work = busiest_shares(s, m, self.n, self.k)
        ops = min(terms["MEM"] / weights, terms["VEC"] / weights, terms["MTX"] / work)
        return rs.gemm_flops_per_op(self.rates.lanes, m) * ops / 1e9


def tune_rates(model: MachineModel, threads: int) -> rs.HostRates:
    """Rates for the search's bounds, from the machine model measured once per CPU: its
    one-core FMA peak and DRAM read times the threads (neither grows faster than the cores,
    so the bound stays an upper bound); the dot products' and the dequantization sequences'
    rates are measured now, in a fraction of a second."""
    return rs.calibrate(threads, lanes=model.lanes, read_gbs=model.dram_read_gbs * threads,
                        peak_gflops=model.peak_gflops * threads)
