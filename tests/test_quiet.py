"""The busy-machine check the tuner and the benchmarks run before timing anything."""

from sandwich.tuner import quiet


def test_busy_warning_only_above_the_threshold():
    assert quiet.busy_warning(quiet.BUSY_FRACTION, "x") == ""
    msg = quiet.busy_warning(0.5, "the benchmark")
    assert "50% of the CPUs" in msg and "the benchmark" in msg


def test_warn_if_busy_logs_and_returns_the_share(monkeypatch):
    logged = []
    monkeypatch.setattr(quiet, "other_cpu_load", lambda: 0.6)
    assert quiet.warn_if_busy("tuning", logged.append) == 0.6
    assert len(logged) == 1 and "60%" in logged[0]
    monkeypatch.setattr(quiet, "other_cpu_load", lambda: 0.0)
    assert quiet.warn_if_busy("tuning", logged.append) == 0.0 and len(logged) == 1


def test_other_cpu_load_is_a_share():
    assert 0.0 <= quiet.other_cpu_load(interval=0.05) <= 1.0
