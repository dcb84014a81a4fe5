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
