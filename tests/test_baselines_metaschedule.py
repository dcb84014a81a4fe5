"""MetaSchedule baseline (issue 5): a few real trials on a small GEMM, then resume from its database."""

import pytest

from sandwich.errors import ConfigError


@pytest.mark.tvm
def test_metaschedule_tunes_checks_times_and_resumes(tmp_path):
    from sandwich.bench.baselines import metaschedule as msb
    from sandwich.compiler.target import detect_cpu

    cpu = detect_cpu()
    threads = msb.tvm_threads()  # conftest sets TVM_NUM_THREADS before TVM starts
    settings = msb.MsSettings(trials=8, trials_per_iter=8, runner_min_repeat_ms=5)
    batches = []
    res = msb.tune_and_time(m=16, n=64, k=64, cpu=cpu, threads=threads, work_root=tmp_path,
                            settings=settings, timing={"repeat": 3, "min_repeat_s": 0.005},
                            on_batch=batches.append)
    assert (res.m, res.n, res.k) == (16, 64, 64)
    assert res.trials == 8 and sum(batches) == 8
    assert res.gflops > 0 and res.tune_s > 0
    wd = msb.work_dir_for(tmp_path, 16, 64, 64, threads)
    assert (wd / "database_tuning_record.json").is_file()
    # a rerun with the same budget finds every trial in the database: no new tuning
    db, seconds, trials = msb.tune(m=16, n=64, k=64, cpu=cpu, threads=threads, work_dir=wd,
                                   settings=settings, on_batch=batches.append)
    assert trials == 8 and seconds == pytest.approx(res.tune_s) and sum(batches) == 8


def test_metaschedule_rejects_a_bad_budget(tmp_path):
    from sandwich.bench.baselines import metaschedule as msb
    from sandwich.compiler.target import detect_cpu

    with pytest.raises(ConfigError):
        msb.tune(m=16, n=64, k=64, cpu=detect_cpu(), threads=2, work_dir=tmp_path,
                 settings=msb.MsSettings(trials=0))
