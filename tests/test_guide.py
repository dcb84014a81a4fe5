"""Issue 29, item 2: the cost model inside the sandwich search. On a known speed, the guided
search measures far fewer candidates and finds winners as fast as the unguided one; it measures
everything until the model has enough data; bad settings are one-line errors; a real tune runs
guided end to end and says what it measured."""

import math
from dataclasses import replace

import numpy as np
import pytest
from schedule_fakes import AVX2, CONSTANTS, speed, synthetic

from sandwich.errors import ConfigError
from sandwich.tuner.budget import BUDGETS
from sandwich.tuner.cost_model import spearman
from sandwich.tuner.guide import Guides, GuideSettings, ModelGuide
from sandwich.tuner.measure import MeasureResult
from sandwich.tuner.search import SandwichSearch
from sandwich.tuner.space import micro_kernels
from sandwich.tuner.trial_log import Sample

N, K = 1536, 768  # not among the synthetic shapes the model is trained on: a new shape
MS = (1, 2, 4, 8, 16, 45, 128, 512)


@pytest.fixture(scope="module")
def prior():
    return synthetic()


def _tune(guide, budget="default"):
    """Search N x K at every M of MS with the known speed; (distinct candidates measured,
    the winners' true GFLOPS, the search)."""
    b = BUDGETS[budget]
    # every M searched afresh: past refine_from a round holds one micro-kernel's slices only,
    # and the rank correlation checked below is the guide's across micro-kernels
    search = SandwichSearch(n=N, k=K, pack_n=32, micro_kernels=micro_kernels(AVX2, 32, widths=b.mk_widths),
                            threads=2, settings=replace(b.settings, refine_from=None), guide=guide,
                            measure=lambda s, m: MeasureResult(speed(s, m, N, K), 1e-3))
    wins, seen = [], 0
    for m in MS:
        wins.append(speed(search.tune_m(m).schedule, m, N, K))
        if guide is not None:
            guide.observe([Sample(t.schedule, t.m, N, K, t.gflops) for t in search.trials[seen:]], "op")
            seen = len(search.trials)
    return len(search.measured), wins, search


def test_the_guided_search_measures_fewer_candidates_for_the_same_winners(prior):
    plain, plain_wins, _ = _tune(None)
    guide = ModelGuide(GuideSettings(measure_share=0.25, explore=0.0), prior=prior, constants=CONSTANTS)
    guided, guided_wins, search = _tune(guide)
    assert guided <= plain / 2.5, (guided, plain)
    ratios = [g / p for g, p in zip(guided_wins, plain_wins, strict=True)]
    assert math.exp(np.mean(np.log(ratios))) >= 0.97 and min(ratios) >= 0.9, ratios
    assert search.predicted_only > 0
    assert guide.stats.ranked > 0 and "op" in guide.stats.rho_by_shape
    # the model it ends with ranks fresh candidates of each M in order (the rank correlation on
    # the search's last M alone, a handful of close slices, swings with any change of the search)
    from schedule_fakes import candidates

    rng = np.random.default_rng(5)
    rhos = []
    for m in MS:
        fresh = candidates(rng, m, N, K, count=24)
        rhos.append(spearman(guide.model.predict([Sample(s, m, N, K) for s in fresh]),
                             [speed(s, m, N, K) for s in fresh]))
    assert np.mean(rhos) >= 0.8 and min(rhos) >= 0.5, rhos


def test_without_enough_data_the_guide_measures_everything(prior):
    plain, plain_wins, plain_search = _tune(None, "quick")
    guide = ModelGuide(GuideSettings(measure_share=0.25, min_samples=10**6), prior=prior[:50])
    guided, guided_wins, search = _tune(guide, "quick")
    assert guide.model is None and search.predicted_only == 0
    assert (guided, guided_wins) == (plain, plain_wins)
    assert [t.schedule for t in search.trials] == [t.schedule for t in plain_search.trials]


def test_a_round_measures_its_top_share_and_explores_the_rest(prior):
    rng = np.random.default_rng(3)
    from schedule_fakes import candidates

    round_ = candidates(rng, 64, N, K, count=12)
    ranked = ModelGuide(GuideSettings(measure_share=0.25, explore=0.0), prior=prior, constants=CONSTANTS)
    picked = ranked.choose(round_, 64, N, K)
    assert sum(picked) == 3
    best = max(range(12), key=lambda i: speed(round_[i], 64, N, K))
    scores = ranked.model.predict([Sample(s, 64, N, K) for s in round_])
    assert all(picked[i] == (scores[i] >= sorted(scores)[-3]) for i in range(12))
    assert picked[best] or speed(round_[best], 64, N, K) < 1.1 * max(
        speed(s, 64, N, K) for s, p in zip(round_, picked, strict=True) if p)
    assert sum(ranked.choose(round_, 64, N, K, keep=5)) == 5
    everything = ModelGuide(GuideSettings(measure_share=0.25, explore=1.0), prior=prior, constants=CONSTANTS)
    assert all(everything.choose(round_, 64, N, K))


def test_the_model_retrains_as_the_search_measures(prior):
    guide = ModelGuide(GuideSettings(measure_share=0.5, min_samples=100, retrain_every=100),
                       prior=prior[:120], constants=CONSTANTS)
    assert guide.stats.trainings == 1
    guide.observe(prior[120:170], "a")
    assert guide.stats.trainings == 1  # 50 new: not yet
    guide.observe(prior[170:230], "a")
    assert guide.stats.trainings == 2 and len(guide.samples) == 230
    assert "a" in guide.stats.rho_by_shape


def test_the_model_is_kept_beside_the_database_and_reused(tmp_path, prior):
    path = tmp_path / "cost_model" / "f.json"
    first = ModelGuide(GuideSettings(measure_share=0.5), prior=prior, constants=CONSTANTS, path=path)
    first.save()
    again = ModelGuide(GuideSettings(measure_share=0.5), prior=prior, constants=CONSTANTS, path=path)
    assert again.stats.trainings == 0 and again.model is not None  # loaded, not retrained
    path.write_bytes(b"garbage")
    damaged = ModelGuide(GuideSettings(measure_share=0.5), prior=prior, constants=CONSTANTS, path=path)
    assert damaged.stats.trainings == 1  # a damaged file is retrained, never trusted


@pytest.mark.parametrize("share,explore", [(0.0, 0.1), (1.5, 0.1), (-0.2, 0.1), (0.5, -0.1), (0.5, 2.0)])
def test_bad_settings_are_one_line_errors(share, explore):
    with pytest.raises(ConfigError, match="--measure-share|--explore"):
        GuideSettings(measure_share=share, explore=explore)


def test_a_real_tune_runs_guided_and_reports_what_it_skipped(tmp_path):
    """Tiny budget, TVM kernels: the guide, trained on the first M's trials, ranks the rest."""
    from sandwich.models import load_model_config
    from sandwich.payload import make_payload
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.kernel_cache import KernelCache
    from sandwich.tuner.shared_tuning import tune_shapes
    from sandwich.tuner.tune import unique_shapes

    cache = KernelCache(tmp_path)
    shapes = [s for s in unique_shapes(make_payload(load_model_config("llama-160m"), tp=1, seq_max=48))
              if s[0] == ["o"]]
    guides = Guides(GuideSettings(measure_share=0.34, explore=0.0, min_samples=8, retrain_every=8,
                                  trees=20), cache_dir=tmp_path, fingerprint=cache.fingerprint)
    [report] = tune_shapes(shapes, seq_max=48, threads=2, budget=get_budget("tiny"), cache=cache,
                           progress=False, guides=guides)
    assert report.predicted_only > 0 and guides.trainings() >= 1
    assert report.candidates <= report.trials and report.model_seconds > 0
    assert report.measure_seconds >= report.compile_seconds > 0
    assert (tmp_path / "cost_model" / f"{cache.fingerprint}.json").is_file()
    assert not cache.verify()


def test_the_default_budget_tunes_guided_unless_told_otherwise(tmp_path, monkeypatch):
    from sandwich.tuner import shared_tuning
    from sandwich.tuner.budget import get_budget

    assert get_budget("default").share(None) == 0.25 and get_budget("default").share(1.0) == 1.0
    assert get_budget("quick").share(None) == 1.0 and get_budget("full").share(0.5) == 0.5
    seen = []
    monkeypatch.setattr(shared_tuning, "tune_shared", lambda shapes, **kw: seen.append(kw["guides"]) or [])

    class _Cache:
        dir, fingerprint = tmp_path, "fp"

    for name in ("default", "quick"):  # first-use tuning passes no guides: the budget decides
        shared_tuning.tune_shapes([], seq_max=8, threads=2, budget=get_budget(name), cache=_Cache(),
                                  progress=False)
    assert [g.settings.measure_share for g in seen] == [0.25, 1.0]
    assert seen[0].settings.active and seen[1]("float32") is None


@pytest.mark.parametrize("flags,match", [(["--measure-share", "0"], "--measure-share must be in"),
                                         (["--measure-share", "0.5", "--explore", "1.5"], "--explore must be in")])
def test_tune_refuses_a_bad_share_in_one_line_before_tuning(tmp_path, capsys, flags, match):
    from sandwich.cli import main

    assert main(["tune", "--model", "llama-160m", "--plan", "off", "--budget", "tiny",
                 "--cache-dir", str(tmp_path), *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
    assert not (tmp_path / "tuning.sqlite").exists()
