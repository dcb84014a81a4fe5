"""Tuning on a model's first use (sandwich/cli/engines.py): what it tunes and how it reports."""

import argparse


class _EmptyCache:
    def records(self, n, k, dtype, threads):
        return []


def _args(model, **kw):
    base = dict(model=str(model), no_tune=False, weights="fp32", tune_budget="tiny",
                no_progress=False)
    return argparse.Namespace(**{**base, **kw})


def test_first_use_tuning_draws_a_bar_unless_told_not_to(monkeypatch, tiny_config, capsys):
    from sandwich.cli import engines
    from sandwich.tuner import shared_tuning

    calls = []
    monkeypatch.setattr(shared_tuning, "tune_shapes",
                        lambda shapes, **kw: calls.append((len(shapes), kw["progress"])))
    for quiet in (False, True):
        engines.ensure_tuned(_args(tiny_config.parent, no_progress=quiet), _EmptyCache(), 2)
    engines.ensure_tuned(_args(tiny_config.parent, no_tune=True), _EmptyCache(), 2)
    assert [p for _, p in calls] == [True, False] and all(n > 0 for n, _ in calls)
    assert "on first use" in capsys.readouterr().err


def test_bench_formats_tunes_without_a_bar_when_told(monkeypatch, tiny_config):
    """`bench formats --no-progress` reaches the tuning it starts for what the cache lacks."""
    from types import SimpleNamespace

    from sandwich.bench import formats
    from sandwich.tuner import shared_tuning

    calls = []
    monkeypatch.setattr(shared_tuning, "tune_shapes",
                        lambda shapes, **kw: calls.append((len(shapes), kw["progress"])))
    monkeypatch.setattr(formats, "measure_machine",
                        lambda threads: SimpleNamespace(read_gbs=1.0, peak_gflops=1.0))
    monkeypatch.setattr(formats, "_time_row", lambda *a: None)
    monkeypatch.setattr(formats.rs, "calibrate", lambda threads, lanes, **measured: (
        formats.rs.HostRates(threads=threads, lanes=lanes, mbw=1e9, fma_vector_ops=1e9, vos={})))
    cache = SimpleNamespace(cpu=SimpleNamespace(model="cpu", mcpu="x", lanes_f32=16),
                            records=lambda *a: [])
    for quiet in (False, True):
        formats.run_formats(models=[str(tiny_config.parent)], formats=[], ms=[], threads=2,
                            cache=cache, budget="tiny", seq_max=16, command="c",
                            log=lambda msg: None, progress=not quiet)
    assert [p for _, p in calls] == [True, False] and all(n > 0 for n, _ in calls)
