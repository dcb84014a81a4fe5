"""DietCode-, Roller- and MikPoly-style baselines (issue 5) driven by a fake measure: exact visits."""

import pytest

from sandwich.bench.baselines.dietcode import DietCode
from sandwich.bench.baselines.dynamic import Problem, features, fit
from sandwich.bench.baselines.mikpoly import MikPoly
from sandwich.bench.baselines.roller import Roller, scale_up
from sandwich.errors import ConfigError
from sandwich.tuner.measure import MeasureResult
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

MK1, MK4 = MicroKernel(1, 64), MicroKernel(4, 64)


class FakeMeasure:
    """Seconds from the cost model's own features (so a fit recovers them exactly), MK1 10% slower."""

    def __init__(self, n=128, k=128):
        self.n, self.k = n, k
        self.calls = []

    def __call__(self, s, m):
        self.calls.append((s, m))
        flops, nbytes = features(m, self.n, self.k, s.micro_kernel, s.slice, s.polymerization)
        sec = (flops * 1e-11 + nbytes * 1e-10) * (1.1 if s.micro_kernel == MK1 else 1.0)
        return MeasureResult(2.0 * m * self.n * self.k / sec / 1e9, sec)


def _problem(**kw):
    d = dict(n=128, k=128, pack_n=64, threads=2, micro_kernels=(MK1, MK4))
    d.update(kw)
    return Problem(**d)


def _ks(mk, sl, pl):
    return KernelSchedule(mk, ComputeSlice(*sl), Polymerization(*pl), 64)


# offline profiling of both cost-model baselines: each micro-kernel with its fixed slice
# (4x4 tiles, 256 deep, clamped to the shape) at M=16 and M=256 under both one-dim splits
OFFLINE = [
    (_ks(MK1, (4, 64, 128), (1, 2, 1)), 16), (_ks(MK1, (4, 128, 128), (2, 1, 1)), 16),
    (_ks(MK1, (4, 64, 128), (1, 2, 1)), 256), (_ks(MK1, (4, 128, 128), (2, 1, 1)), 256),
    (_ks(MK4, (16, 64, 128), (1, 2, 1)), 16), (_ks(MK4, (8, 128, 128), (2, 1, 1)), 16),
    (_ks(MK4, (16, 64, 128), (1, 2, 1)), 256), (_ks(MK4, (16, 128, 128), (2, 1, 1)), 256),
]


def test_fit_recovers_a_linear_cost():
    samples = [((f, b), f * 2e-11 + b * 3e-10) for f, b in ((1e6, 1e4), (4e6, 1e4), (1e6, 8e4))]
    model = fit(samples)
    assert model.s_per_flop == pytest.approx(2e-11) and model.s_per_byte == pytest.approx(3e-10)
    with pytest.raises(ConfigError):
        fit([])


def test_dietcode_profiles_offline_only_and_shares_one_micro_kernel():
    meas = FakeMeasure()
    tuner = DietCode(_problem(), meas)
    choices = tuner.tune([1, 64, 256])
    assert meas.calls == OFFLINE  # every visit is offline; no shape is profiled
    assert tuner.offline_trials == 8 and all(c.trials == 0 for c in choices)
    assert {c.schedule.micro_kernel for c in choices} == {MK4}  # the faster one, for every M
    # M=1: N split beats split-K (no partial sums to add); M=256: the M and N splits tie in
    # the model (same flops and W bytes per thread) and the first scheme in order wins
    assert choices[0].schedule == _ks(MK4, (4, 64, 128), (1, 2, 1))
    assert choices[2].schedule == _ks(MK4, (16, 64, 128), (1, 2, 1))


def test_mikpoly_picks_the_micro_kernel_per_shape_without_profiling_it():
    meas = FakeMeasure()
    tuner = MikPoly(_problem(), meas)
    choices = tuner.tune([1, 256])
    assert meas.calls == OFFLINE
    assert all(c.trials == 0 for c in choices)
    # M=1: the 1-row kernel wastes no padded rows; M=256: the 4-row kernel reads W less often
    assert choices[0].schedule == _ks(MK1, (1, 64, 128), (1, 2, 1))
    assert choices[1].schedule == _ks(MK4, (16, 64, 128), (1, 2, 1))


def test_roller_scale_up_grows_by_intensity_within_each_level():
    whole = ComputeSlice(64, 128, 128)
    # (4,64,16) fills 5376 B: nothing fits L1; in L2 (7000 B) only (8,64,16) = 6656 B fits
    assert scale_up(MK4, whole, (5376, 7000)) == ComputeSlice(8, 64, 16)
    # (12,64,16) = 7936 B has the highest intensity of the three steps
    assert scale_up(MK4, whole, (5376, 8000)) == ComputeSlice(12, 64, 16)
    # b_m capped at 4 rows: a K step (1.68 flop/B) beats an N step (1.56)
    assert scale_up(MK4, ComputeSlice(4, 128, 128), (5376, 10000)) == ComputeSlice(4, 64, 32)


def test_roller_measures_its_top_candidates_at_each_m():
    meas = FakeMeasure()
    tuner = Roller(_problem(l1_bytes=2 * 5376, l2_bytes=2 * 7000), meas)
    c = tuner.choose(64)
    # MK1 grows to 4 rows in L1 and 9 in L2 (6976 B); MK4 to 8 rows; both replicated along M
    cands = [_ks(MK1, (9, 64, 16), (2, 1, 1)), _ks(MK4, (8, 64, 16), (2, 1, 1))]
    assert meas.calls == [(s, 64) for s in cands] and c.trials == 2
    assert c.schedule == max(cands, key=lambda s: meas(s, 64).gflops)
    assert tuner.offline_trials == 0
    meas.calls.clear()
    Roller(_problem(l1_bytes=2 * 5376, l2_bytes=2 * 7000), meas, top_k=1).choose(64)
    assert meas.calls == [(cands[0], 64)]


def test_baselines_need_micro_kernels():
    with pytest.raises(ConfigError):
        Roller(_problem(micro_kernels=()), FakeMeasure())
