"""The search's Roof-Surface bound (issue 26): a candidate whose bound cannot beat the best
GFLOPS measured at its M is never built or timed, and the bound of a schedule is the
machine's Roof-Surface bound over its busiest thread's share."""

import dataclasses

import pytest

from sandwich.tuner import roofsurface as rs
from sandwich.tuner import search_bound as sb
from sandwich.tuner.machine_bench import DEQUANT_KINDS
from sandwich.tuner.measure import MeasureResult
from sandwich.tuner.search import SandwichSearch, SearchSettings
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

MKS = [MicroKernel(1, 64), MicroKernel(2, 64), MicroKernel(4, 64)]


def _sched(mu_m=4, b_m=4, b_n=64, b_k=256, pl=(1, 2, 1)):
    return KernelSchedule(MicroKernel(mu_m, 64), ComputeSlice(b_m, b_n, b_k), Polymerization(*pl), 64)


def test_busiest_shares_of_weights_and_products():
    even = _sched(b_n=64, pl=(1, 2, 1))
    assert sb.busiest_shares(even, 8, 1024, 512) == (1.0, 1.0)
    # 3 slices of 384 columns over 2 N-threads: the first streams 2 of them
    weights, work = sb.busiest_shares(_sched(b_n=384, pl=(1, 2, 1)), 8, 1152, 512)
    assert weights == pytest.approx(4 / 3) and work == pytest.approx(4 / 3)
    # M = 8 in 6-row blocks over 2 M-threads: the first takes the block, the second the 2 tail
    # rows, so the busiest does 6 of the 4 rows an even split gives each
    weights, work = sb.busiest_shares(_sched(mu_m=6, b_m=6, pl=(2, 1, 1)), 8, 1024, 512)
    assert weights == 1.0 and work == pytest.approx(1.5)


def _rates(mbw=40e9, fma=7e9, lanes=16):
    return rs.HostRates(threads=2, lanes=lanes, mbw=mbw, fma_vector_ops=fma,
                        vos=dict.fromkeys(DEQUANT_KINDS, 2 * fma), bf16_dot_ops=fma,
                        int8_dot_ops=fma)


@pytest.mark.parametrize("dtype, m", [("float32", 1), ("float32", 512), ("int8-g32", 8),
                                      ("int4-g32", 512), ("bf16", 1)])
def test_an_even_schedule_takes_the_machines_bound_and_an_uneven_one_less(dtype, m):
    rates = _rates()
    bound = sb.CandidateBound(rates, 1024, 512, dtype, bf16_dot=True)
    fmt = {"float32": "fp32"}.get(dtype, dtype)
    eq1 = dataclasses.replace(rates.machine(m, fmt, k=512), shared=False)  # the looser min
    machine = rs.bound(eq1, rs.kernel_signature(fmt, 16, k=512), rs.gemm_flops_per_op(16, m))
    assert bound(_sched(), m) == pytest.approx(machine.flops / 1e9)
    uneven = _sched(b_n=384, pl=(1, 2, 1))  # N = 1152 for it: 3 slices on 2 threads
    assert sb.CandidateBound(rates, 1152, 512, dtype, True)(uneven, m) < \
        sb.CandidateBound(rates, 1152, 512, dtype, True)(_sched(), m)


def _search(bound=None, margin=0.25):
    """GFLOPS from a formula in which split-K costs half and anything else as much as the
    tile's rows allow: a bound that knows this drops the split-K candidates."""
    calls = []

    def measure(s, m):
        calls.append((s, m))
        g = 100.0 * min(m, s.micro_kernel.mu_m) / 4 * (0.5 if s.polymerization.t_k > 1 else 1.0)
        return MeasureResult(g, 1e-3)

    search = SandwichSearch(n=1024, k=512, pack_n=64, micro_kernels=MKS, threads=2,
                            measure=measure, settings=SearchSettings(bound_margin=margin),
                            bound=bound)
    return search, calls


def _split_k_bound(s, m):
    """An upper bound of the formula above: split-K can reach 55 GFLOPS at most."""
    return 55.0 if s.polymerization.t_k > 1 else 1000.0


def test_search_drops_candidates_whose_bound_cannot_win():
    free, free_calls = _search()
    bounded, calls = _search(_split_k_bound, margin=0.25)
    for m in (1, 4, 8):
        assert free.tune_m(m).schedule == bounded.tune_m(m).schedule  # the same winners
    def split_k(c):
        return sum(s.polymerization.t_k > 1 and m >= 2 for s, m in c)

    # past M = 1 (best 25 GFLOPS there: a 55 GFLOPS bound could win, so split-K is timed),
    # split-K is timed only before a candidate above 55 / 1.25 GFLOPS has been measured
    assert split_k(calls) < split_k(free_calls)
    assert bounded.pruned > 0 and len(calls) < len(free_calls)
    assert all(s.polymerization.t_k > 1 and m >= 2 for s, m in bounded._pruned)


def test_the_margin_keeps_a_candidate_whose_bound_is_just_below_the_best():
    # split-K's bound of 55 is within 100% of M = 4's 100 GFLOPS: with that margin it is timed
    wide, calls = _search(_split_k_bound, margin=1.0)
    wide.tune_m(4)
    assert wide.pruned == 0 and any(s.polymerization.t_k > 1 for s, _ in calls)


def test_tune_bounds_candidates_only_with_a_machine_model(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from sandwich.tuner import tune
    from sandwich.tuner.budget import get_budget
    from sandwich.types import GemmOp

    op = GemmOp("o", 1024, 512)
    cache = SimpleNamespace(dir=tmp_path, cpu=SimpleNamespace(bf16_dot=True), fingerprint="f")
    assert tune.candidate_bound(cache, get_budget("tiny"), op, 2) is None  # no machine model
    model = SimpleNamespace(lanes=16, dram_read_gbs=20.0, peak_gflops=100.0)
    monkeypatch.setattr(tune, "machine_model", lambda *a, **kw: model)
    monkeypatch.setattr(tune, "tune_rates", lambda model, threads: _rates())
    bound = tune.candidate_bound(cache, get_budget("default"), op, 2)
    assert bound.n == 1024 and bound.k == 512 and bound.dtype == "float32"
    assert bound(_sched(), 512) > 0


def test_tune_rates_scale_the_one_core_model_by_the_threads(monkeypatch):
    from types import SimpleNamespace

    seen = {}
    monkeypatch.setattr(rs, "calibrate", lambda threads, **kw: seen.update(kw, threads=threads))
    sb.tune_rates(SimpleNamespace(lanes=16, dram_read_gbs=20.0, peak_gflops=100.0), 2)
    assert seen == {"threads": 2, "lanes": 16, "read_gbs": 40.0, "peak_gflops": 200.0}
