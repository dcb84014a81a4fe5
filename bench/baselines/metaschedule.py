"""Ansor's successor, TVM MetaSchedule, tuning one static fp32 GEMM: the static-autotuner peer.

It is the real thing: `ms.tune_tir` with the XGBoost cost model and evolutionary search over
MetaSchedule's own CPU space (multi-level tiling, parallel/vectorize/unroll), its local
builder and runner. Only the workload is ours: a plain GEMM C[M, N] = A[M, K] @ W[K, N].

W is kept in the plain (K, N) layout, the GEMM Ansor tunes in its paper and tutorials:
MetaSchedule picks its own tiles, so a fixed panel width of ours would constrain its search
rather than help it, and the row-major W already gives its vectorised N loop unit stride.
(Layout rewriting of W is off: `tune_tir` would time the rewrite inside every call.)

The JSON database lives in one work_dir per shape and thread count; a rerun counts the
records already there and only runs the remaining trials, so an interrupted run resumes.
Tuning seconds are saved after each measured batch, so they survive an interruption too.
The search runs in a child process; the best kernel is compiled, checked and timed in the
caller's process, beside the other methods.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.bench.baselines.measure import check_gemm, random_gemm
from sandwich.compiler.target import CpuInfo, tvm_target
from sandwich.errors import BuildError, ConfigError
from sandwich.tuner.timing import Timing, gflops, time_callable

PROGRESS = "sandwich_progress.json"


@dataclass(frozen=True)
class MsSettings:
    """Trial budget and measurement knobs of one MetaSchedule run."""

    trials: int = 800
    trials_per_iter: int = 64
    seed: int = 0
    runner_timeout_s: float = 30.0
    runner_number: int = 3
    runner_repeat: int = 1
    runner_min_repeat_ms: int = 50
    console_log: bool = False  # MetaSchedule's per-batch tables on stdout (always in work_dir/logs)


@dataclass(frozen=True)
class MsResult:
    """The best kernel MetaSchedule found for one shape and what the search cost."""

    m: int
    n: int
    k: int
    gflops: float
    tune_s: float
    trials: int
    timing: Timing


def gemm_primfunc(m: int, n: int, k: int):
    """The static GEMM as a schedulable (s_tir) PrimFunc, W in plain (K, N) layout."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def main(a: T.handle, w: T.handle, c: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        A = T.match_buffer(a, (m, k), "float32")
        W = T.match_buffer(w, (k, n), "float32")
        C = T.match_buffer(c, (m, n), "float32")
        for i, j, r in T.grid(m, n, k):
            with T.sblock("C"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vr] * W[vr, vj]

    return main


def x86_intrinsics_only() -> None:
    """Register only the x86 tensor intrinsics, not every backend's.

    MetaSchedule imports `tvm.s_tir.tensor_intrin` in every TuneContext and every build
    worker, and that package registers every backend's intrinsics: CUDA's alone take ~50 s
    on this machine, in each new worker process, which made every build time out. An fp32
    GEMM on x86 can use none of them (x86's are int8 VNNI/AMX, kept so the search is unchanged).
    """
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    assert spec is not None
    sys.modules[name] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
    importlib.import_module(name + ".x86")


def build_without_foreign_intrinsics(mod, target, params):
    """MetaSchedule's default build (builder/local_builder.py), minus the import above."""
    x86_intrinsics_only()
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def work_dir_for(root: Path, m: int, n: int, k: int, threads: int) -> Path:
    return Path(root) / f"m{m}_n{n}_k{k}_t{threads}"


def _set_threads(threads: int) -> None:
    """Runs first in each runner/builder worker: TVM sizes its pool from this when it starts."""
    os.environ["TVM_NUM_THREADS"] = str(threads)


def _progress(work_dir: Path) -> dict:
    p = work_dir / PROGRESS
    return json.loads(p.read_text()) if p.is_file() else {"seconds": 0.0}


def _save_progress(work_dir: Path, d: dict) -> None:
    tmp = work_dir / (PROGRESS + ".tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, work_dir / PROGRESS)


def _records(work_dir: Path) -> int:
    p = work_dir / "database_tuning_record.json"
    if not p.is_file():
        return 0
    return sum(1 for line in p.read_text().splitlines() if line.strip())


def _callback(work_dir: Path, base_s: float, t0: float, on_batch: Callable[[int], None]):
    """A measure callback that saves the tuning seconds so far after every batch."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class SaveProgress(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results) -> None:
            _save_progress(work_dir, {"seconds": base_s + time.perf_counter() - t0})
            on_batch(len(measure_candidates))

    return SaveProgress()


def _db_paths(work_dir: Path) -> dict[str, str]:
    return {"path_workload": str(work_dir / "database_workload.json"),
            "path_tuning_record": str(work_dir / "database_tuning_record.json")}


def _tune_worker(m: int, n: int, k: int, cpu: CpuInfo, threads: int, work_dir: str,
                 settings: MsSettings, done: int, base_s: float) -> None:
    """The search itself, run in a child process (see `tune`)."""
    from tvm.s_tir import meta_schedule as ms

    x86_intrinsics_only()
    if not settings.console_log:  # its console handler takes this logger's level
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    wd = Path(work_dir)
    left = settings.trials - done
    init = functools.partial(_set_threads, threads)
    runner = ms.runner.LocalRunner(
        timeout_sec=settings.runner_timeout_s, initializer=init,
        evaluator_config=ms.runner.EvaluatorConfig(
            number=settings.runner_number, repeat=settings.runner_repeat,
            min_repeat_ms=settings.runner_min_repeat_ms, enable_cpu_cache_flush=False))
    builder = ms.builder.LocalBuilder(max_workers=threads, initializer=init,
                                      f_build=build_without_foreign_intrinsics)
    t0 = time.perf_counter()
    callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
    callbacks.append(_callback(wd, base_s, t0, lambda _: None))
    ms.tune_tir(
        mod=gemm_primfunc(m, n, k), target=tvm_target(cpu, threads), work_dir=work_dir,
        max_trials_global=left, num_trials_per_iter=min(settings.trials_per_iter, left),
        builder=builder, runner=runner, database=ms.database.JSONDatabase(**_db_paths(wd)),
        cost_model="xgb", strategy="evolutionary", measure_callbacks=callbacks,
        num_tuning_cores=threads, seed=settings.seed + done)
    _save_progress(wd, {"seconds": base_s + time.perf_counter() - t0})


def tune(*, m: int, n: int, k: int, cpu: CpuInfo, threads: int, work_dir: Path,
         settings: MsSettings = MsSettings(),
         on_batch: Callable[[int], None] = lambda _: None) -> tuple[object, float, int]:
    """Run the trials still missing from work_dir's database; returns (database, seconds, trials).

    The search runs in a child process, so its threads (XGBoost's, the runner's pool) and
    memory are gone before the kernels are timed in the caller's process.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.support.popen_pool import PopenPoolExecutor

    if min(m, n, k, threads, settings.trials) < 1:
        raise ConfigError(f"MetaSchedule needs positive M, N, K, threads and trials, got "
                          f"{m}x{n}x{k}, {threads} threads, {settings.trials} trials")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    done = _records(work_dir)
    if done < settings.trials:
        # the child, and the runner's worker below it, inherit the threads they time with
        os.environ["TVM_NUM_THREADS"] = str(threads)
        # TVM's own worker pool (as MetaSchedule's builder uses): no re-run of __main__
        pool = PopenPoolExecutor(max_workers=1, timeout=None)
        try:
            pool.submit(_tune_worker, m, n, k, cpu, threads, str(work_dir), settings, done,
                        float(_progress(work_dir)["seconds"])).result()
        finally:
            pool.shutdown()
        on_batch(_records(work_dir) - done)
    return (ms.database.JSONDatabase(**_db_paths(work_dir)), float(_progress(work_dir)["seconds"]),
            _records(work_dir))


def compile_best(db, *, m: int, n: int, k: int, cpu: CpuInfo, threads: int):
    """The best record of the database, compiled for this process."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    x86_intrinsics_only()
    target = tvm_target(cpu, threads)
    sch = ms.tir_integration.compile_tir(db, gemm_primfunc(m, n, k), target)
    if sch is None:
        raise BuildError(f"MetaSchedule found no valid kernel for {m}x{n}x{k}; "
                         f"delete its work_dir and tune with more trials")
    return tvm.compile(sch.mod, target=target)["main"]


def time_kernel(func, *, m: int, n: int, k: int, seed: int = 0, **timing_kw) -> Timing:
    """Check the kernel against numpy, then time it on this process's TVM thread pool."""
    import tvm

    a, w = random_gemm(m, n, k, seed=seed)
    dev = tvm.cpu(0)
    ta, tw = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(w, dev)
    tc = tvm.runtime.tensor(np.zeros((m, n), np.float32), dev)
    func(ta, tw, tc)
    check_gemm(tc.numpy(), a, w, what=f"MetaSchedule kernel {m}x{n}x{k}")
    return time_callable(lambda: func(ta, tw, tc), **timing_kw)


def tvm_threads() -> int:
    """Threads of this process's TVM pool (sized from TVM_NUM_THREADS when it started)."""
    import tvm

    return int(tvm.get_global_func("runtime.NumThreads")())


def tune_and_time(*, m: int, n: int, k: int, cpu: CpuInfo, threads: int, work_root: Path,
                  settings: MsSettings = MsSettings(), timing: dict | None = None,
                  on_batch: Callable[[int], None] = lambda _: None) -> MsResult:
    """Tune (or resume) one shape, then compile, check and time its best kernel."""
    if tvm_threads() != threads:
        raise ConfigError(f"TVM's thread pool has {tvm_threads()} threads, not {threads}: "
                          f"set TVM_NUM_THREADS={threads} before starting")
    wd = work_dir_for(work_root, m, n, k, threads)
    db, seconds, trials = tune(m=m, n=n, k=k, cpu=cpu, threads=threads, work_dir=wd,
                               settings=settings, on_batch=on_batch)
    func = compile_best(db, m=m, n=n, k=k, cpu=cpu, threads=threads)
    t = time_kernel(func, m=m, n=n, k=k, **(timing or {}))
    return MsResult(m, n, k, gflops(2.0 * m * n * k, t.median_s), seconds, trials, t)
