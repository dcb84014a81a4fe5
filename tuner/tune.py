"""`sandwichc tune`: search every GEMM of a payload over its M range and fill the kernel cache.

Each searched M is committed as soon as it is found (record + verified `.so`), so a killed
tune resumes from its committed records; a second run finds everything and only re-checks
the kernel files.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from sandwich.compiler.gemm_dsl import amx8_schedules, amx_panel, amx_schedules
from sandwich.errors import BuildError, ConfigError
from sandwich.payload import Payload
from sandwich.tuner.budget import Budget
from sandwich.tuner.guide import ModelGuide
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.tuner.machine_model import machine_model
from sandwich.tuner.roofsurface import HostRates, dequantization
from sandwich.tuner.rpc_measure import RpcMeasure, RpcTarget
from sandwich.tuner.rpc_pool import RpcPool
from sandwich.tuner.search import MResult, SandwichSearch
from sandwich.tuner.search_bound import CandidateBound, tune_rates
from sandwich.tuner.space import Isa, decode_batch_tile, micro_kernels, pack_width
from sandwich.tuner.trial_log import Sample
from sandwich.tuner.tvm_measure import TvmMeasure
from sandwich.types import AMX_OPS, GemmOp, KernelSchedule, MicroKernel, TuneRecord


@dataclass
class OpReport:
    """What tuning one (N, K) cost and found."""

    names: list[str]
    n: int
    k: int
    dtype: str = "float32"  # the weight format (a GEMM dtype)
    searched: int = 0
    cached: int = 0
    rebuilt: int = 0
    trials: int = 0  # timings, the re-timings of finalists included
    candidates: int = 0  # distinct (schedule, M) measured
    predicted_only: int = 0  # candidates the cost model ranked out, never measured
    bounded_out: int = 0  # candidates whose Roof-Surface bound could not win, never measured
    rho: float = float("nan")  # the cost model's rank correlation on the last searched M
    seconds: float = 0.0
    compile_seconds: float = 0.0  # building and checking kernels against numpy
    measure_seconds: float = 0.0  # inside the measure calls: compile, check and time
    model_seconds: float = 0.0  # training and querying the cost model
    rpc_retries: int = 0  # remote calls run again on another server (a server died or hung)
    results: list[MResult] = field(default_factory=list)


def unique_shapes(payload: Payload) -> list[tuple[list[str], GemmOp]]:
    """Ops that share (N, K) share kernels: tune each shape once, over the M of all of them."""
    shapes: dict[tuple[int, int, str], tuple[list[str], GemmOp]] = {}
    for op in payload.ops:
        key = (op.n, op.k, op.dtype)
        if key in shapes:
            names, first = shapes[key]
            m_max = None if None in (first.m_max, op.m_max) else max(first.m_max, op.m_max)
            shapes[key] = ([*names, op.name], replace(first, m_max=m_max))
        else:
            shapes[key] = ([op.name], op)
    return list(shapes.values())


def op_samples(op: GemmOp, budget: Budget, seq_max: int) -> list[int]:
    """The M values searched for one op: an op the runtime serves only up to `op.m_max` rows
    (lm_head: a batch) is searched up to there, then once more at 4x that, whose schedule
    covers the rest up to seq_max: `perplexity` runs every row through lm_head, and the
    schedule of M = 64 stretched to 1024 rows ran at 0.80-0.84 of one searched at 256
    (Sheared-LLaMA-1.3B on Zen 3), while a search at 256 refines the last winner in seconds."""
    if op.m_max is None or op.m_max >= seq_max:
        return budget.m_samples(seq_max)
    return budget.m_samples(op.m_max) + [min(seq_max, 4 * op.m_max)]


def _ranges(samples: list[int], seq_max: int) -> dict[int, int]:
    """Each sampled M covers up to the next sample."""
    return {m: (samples[i + 1] - 1 if i + 1 < len(samples) else seq_max) for i, m in enumerate(samples)}


def _ensure_kernel(cache: KernelCache, measure: TvmMeasure | RpcMeasure, op: GemmOp,
                   schedule: KernelSchedule) -> bool:
    """Make sure the schedule's `.so` is in the cache and intact; True if it had to be built."""
    kf = cache.db.kernel(cache.fingerprint, op.n, op.k, op.dtype, schedule)
    if not cache.kernel_problem(kf):
        return False
    cache.store_kernel(measure.kernel(schedule), n=op.n, k=op.k, dtype=op.dtype, schedule=schedule)
    return True


class _Clocked:
    """A measure that keeps the wall time spent in it, for `tune --stats`."""

    def __init__(self, measure: TvmMeasure | RpcMeasure) -> None:
        self.measure, self.seconds = measure, 0.0
        if hasattr(measure, "many"):  # the search batches a round only for a measure that can
            self.many = self._many

    def __call__(self, schedule: KernelSchedule, m: int):
        t0 = time.perf_counter()
        try:
            return self.measure(schedule, m)
        finally:
            self.seconds += time.perf_counter() - t0

    def _many(self, items):
        t0 = time.perf_counter()
        try:
            return self.measure.many(items)
        finally:
            self.seconds += time.perf_counter() - t0


def _append_trials(path, search: SandwichSearch, start: int) -> int:
    """Append the trials since `start` (one JSON line each: M, phase, schedule, GFLOPS)."""
    with open(path, "a") as f:
        for t in search.trials[start:]:
            f.write(json.dumps({"m": t.m, "phase": t.phase, "schedule": t.schedule.key(),
                                "gflops": round(t.gflops, 3)}) + "\n")
    return len(search.trials)


def panel_probe(cache: KernelCache, budget: Budget,
                log: Callable[[str], None] = lambda _: None) -> dict[int, float] | None:
    """The machine model's GFLOPS of each panel width's tallest tile, where the budget
    measures a machine model (the tiny budget of the tests goes by the register file alone)."""
    if not budget.machine_model:
        return None
    model = machine_model(cache.dir, cache.cpu, cache.fingerprint, log=log)
    return model.panel_gflops if model else None


_RATES: dict[tuple[str, int], HostRates] = {}  # the bounds' rates, measured once per process


def candidate_bound(cache: KernelCache, budget: Budget, op: GemmOp,
                    threads: int) -> CandidateBound | None:
    """The Roof-Surface bound the search drops candidates by, where the budget measures a
    machine model (its rates come from it) and the kernels run on this machine."""
    if not budget.machine_model:
        return None
    model = machine_model(cache.dir, cache.cpu, cache.fingerprint)
    if model is None:
        return None
    key = (cache.fingerprint, threads)
    if key not in _RATES:
        _RATES[key] = tune_rates(model, threads)
    return CandidateBound(_RATES[key], op.n, op.k, op.dtype, cache.cpu.bf16_dot)


def weight_pack(cache: KernelCache, n: int, budget: Budget,
                log: Callable[[str], None] = lambda _: None) -> int:
    """The panel width an (N, K)'s weights are packed in for every M (space.pack_width)."""
    return _pack_n(cache, n, budget, panel_probe(cache, budget, log))


def _pack_n(cache: KernelCache, n: int, budget: Budget, panels: dict[int, float] | None) -> int:
    cpu = cache.cpu
    return pack_width(n, Isa(cpu.lanes_f32, cpu.vector_registers), rows=budget.settings.skinny_m,
                      panel_gflops=panels)


def _batch_tile(isa: Isa, op: GemmOp, pack_n: int, budget: Budget,
                bf16_dot: bool) -> MicroKernel | None:
    """The decode batch's tile (space.decode_batch_tile) where op's format converts each
    weight vector in the tile before its products, else None."""
    if op.dtype == "float32" or dequantization(op.dtype, op.k, bf16_dot=bf16_dot).ops == 0:
        return None
    return decode_batch_tile(isa, pack_n, budget.settings.skinny_m)


def tune_op(*, names: list[str], op: GemmOp, seq_max: int, threads: int, budget: Budget,
            cache: KernelCache, on_step: Callable[[int], None] = lambda _: None,
            remote: RpcTarget | RpcPool | None = None,
            guide: ModelGuide | None = None) -> OpReport:
    """Tune one (N, K) over the budget's M samples, resuming from committed records;
    with `remote`, every candidate is checked and timed on that tracker's servers (several
    at once with a pool, which a tune of many shapes opens once: `open_pool`); with
    `guide`, the cost model picks which candidates of each round are measured."""
    t0 = time.perf_counter()
    cpu = cache.cpu
    isa = Isa(cpu.lanes_f32, cpu.vector_registers)
    op = replace(op, n=cache.kernel_n(op.n))  # a vocabulary of 49153 tunes 49168
    panels = panel_probe(cache, budget)  # once: it packs the weights and picks the tiles
    pack_n = _pack_n(cache, op.n, budget, panels)
    # a width the AMX kernel's blocks divide, where it can run (bf16, int8, int4)
    pack_n = amx_panel(n=op.n, k=op.k, pack_n=pack_n, cpu=cpu, dtype=op.dtype)
    if not pack_n:
        raise ConfigError(f"GEMM {op.name}: N={op.n} is not a multiple of the vector width "
                          f"{isa.lanes}; pad the model dimension")
    if remote is not None and op.dtype != "float32":
        raise ConfigError(f"tune --rpc measures fp32 weights only so far, not {op.dtype}")
    with open_pool(remote, cache=cache, threads=threads, seq_max=seq_max) as remote:
        timing = dict(repeat=budget.repeat, min_repeat_ms=budget.min_repeat_ms)
        if isinstance(remote, RpcPool):
            measure = remote.shape(op.n, op.k, pack_n, **timing)
        elif remote is not None:
            measure = RpcMeasure(cpu, threads, op.n, op.k, pack_n, seq_max, remote, cache.fingerprint,
                                 **timing)
        else:
            measure = TvmMeasure(cpu, threads, op.n, op.k, pack_n, seq_max, dtype=op.dtype,
                                 repeat=budget.repeat, min_repeat_s=budget.min_repeat_ms / 1e3)
        bound = None if remote is not None else candidate_bound(cache, budget, op, threads)
        return _tune_shape(measure, names=names, op=op, pack_n=pack_n, panels=panels,
                           seq_max=seq_max, threads=threads, budget=budget, cache=cache, on_step=on_step,
                           guide=guide, t0=t0, bound=bound)


@contextmanager
def open_pool(remote: RpcTarget | RpcPool | None, *, cache: KernelCache, threads: int,
              seq_max: int) -> Iterator[RpcTarget | RpcPool | None]:
    """A pool of RPC workers for `remote.workers` > 1, closed on leaving; anything else as
    it is (an open pool stays open: whoever opened it closes it)."""
    if not isinstance(remote, RpcTarget) or remote.workers <= 1:
        yield remote
        return
    with RpcPool(remote, cpu=cache.cpu, threads=threads, seq_max=seq_max,
                 fingerprint=cache.fingerprint,
                 log=lambda line: print(line, file=sys.stderr, flush=True)) as pool:
        yield pool


def _tune_shape(measure: TvmMeasure | RpcMeasure | RpcPool, *, names: list[str], op: GemmOp,
                pack_n: int, panels: dict[int, float] | None, seq_max: int, threads: int,
                budget: Budget, cache: KernelCache, on_step: Callable[[int], None],
                guide: ModelGuide | None, t0: float,
                bound: CandidateBound | None = None) -> OpReport:
    """tune_op's search over the M samples, once its measure is made (`panels`: the
    machine model's panel probe, which rules narrow tiles in or out; `bound`: the
    Roof-Surface bound that drops candidates which cannot win)."""
    isa = Isa(cache.cpu.lanes_f32, cache.cpu.vector_registers)
    samples = op_samples(op, budget, seq_max)
    m_hi = _ranges(samples, seq_max)
    report = OpReport(names, op.n, op.k, op.dtype)
    clocked = _Clocked(measure)
    model_s0 = _model_seconds(guide)
    search = SandwichSearch(n=op.n, k=op.k, pack_n=pack_n,
                            micro_kernels=micro_kernels(isa, pack_n, widths=budget.mk_widths,
                                                        panel_gflops=panels),
                            threads=threads, measure=clocked, settings=budget.settings,
                            dtype=op.dtype, guide=guide, bound=bound, lanes=isa.lanes,
                            batch_tile=_batch_tile(isa, op, pack_n, budget, cache.cpu.bf16_dot),
                            caches=(cache.cpu.l1d_bytes, cache.cpu.l2_bytes))
    records = cache.records(op.n, op.k, op.dtype, threads)
    if any(r.record.schedule.pack_n != pack_n for r in records):
        # tuned for another weight layout (an older sandwichc): every M shares one packing,
        # so they go before the first new record is stored, or the cache would mix layouts
        cache.db.delete_records(cache.fingerprint, op.n, op.k, op.dtype, threads)
        records = []
    stored = {r.record.m_lo: r for r in records if r.record.m_lo in m_hi}
    # the search replays its own family's winners; an M an AMX kernel won is left out of its
    # window, as if not searched (its tiles are not the family's to refine)
    search.resume([MResult(m, r.record.schedule, r.record.gflops, r.record.trials,
                           r.record.seconds, r.reused, r.stable) for m, r in stored.items()
                   if r.record.schedule.op not in AMX_OPS])
    tiles = isinstance(measure, TvmMeasure)
    amx = (amx_schedules(n=op.n, k=op.k, pack_n=pack_n, threads=threads, cpu=cache.cpu,
                         dtype=op.dtype) if tiles else [])
    amx8 = (amx8_schedules(n=op.n, k=op.k, pack_n=pack_n, threads=threads, cpu=cache.cpu,
                           dtype=op.dtype) if tiles else [])
    log = cache.dir / "logs" / cache.fingerprint / f"n{op.n}_k{op.k}_{op.dtype}_t{threads}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    logged = 0
    for m in samples:
        if m in stored:
            report.cached += 1
            report.rebuilt += _ensure_kernel(cache, measure, op, stored[m].record.schedule)
            on_step(1)
            continue
        res = search.tune_m(m)
        if guide is not None:
            guide.observe([Sample(t.schedule, t.m, op.n, op.k, t.gflops, t.phase)
                           for t in search.trials[logged:]], "+".join(names))
        logged = _append_trials(log, search, logged)
        # not at decode's Ms: a 32-row block of tiles would be mostly padding there, W streams
        # from DRAM, and an int format's products would change from 8-bit to bf16 activations
        # with the batch (the family won every M below 64 in SmolLM2's and Sheared's int
        # tunes); byte products keep the family's 8-bit activations, but per 32 values of K
        # and row they still scale the block's sums on the vector units (gemm_amx_int8.sw),
        # and the family ran ahead of them at M = 4 (int4 and int8 11008 x 2048, SPR VM)
        tried = [*amx, *amx8] if m > budget.settings.skinny_m else []
        if tried:
            res, failed = _amx_or_family(clocked, tried, res)
            for sched, why in failed.items():  # checked before timing: never used
                print(f"warning: GEMM {op.name}: AMX schedule {sched.key()} is left out: {why}",
                      file=sys.stderr, flush=True)
            amx = [s for s in amx if s not in failed]
            amx8 = [s for s in amx8 if s not in failed]
        if res.gflops <= 0:
            raise BuildError(f"GEMM {op.name} N={op.n} K={op.k}: no schedule built and verified "
                             f"at M={m}; see `sandwichc info` for the target")
        _ensure_kernel(cache, measure, op, res.schedule)
        rec = TuneRecord(cache.fingerprint, "+".join(names), op.n, op.k, op.dtype, m, m_hi[m],
                         res.schedule, res.gflops, res.trials, res.seconds)
        cache.db.put_record(rec, threads=threads, reused=res.reused, stable=res.stable)
        report.searched += 1
        report.trials += res.trials
        report.results.append(res)
        on_step(1)
    cache.db.checkpoint()  # this shape's records into the database file, out of the WAL
    report.seconds = time.perf_counter() - t0
    report.compile_seconds = measure.compile_seconds
    report.measure_seconds = clocked.seconds
    report.candidates, report.predicted_only = len(search.measured), search.predicted_only
    report.bounded_out = search.pruned
    report.model_seconds = _model_seconds(guide) - model_s0
    if guide is not None:
        report.rho = guide.stats.rho_by_shape.get("+".join(names), float("nan"))
    report.rpc_retries = getattr(measure, "retries", 0)
    return report


def _amx_or_family(measure: _Clocked, amx: list[KernelSchedule],
                   res: MResult) -> tuple[MResult, dict[KernelSchedule, str]]:
    """The family's winner at one M, or the fastest AMX schedule where one is faster there:
    each measured as every candidate is (built, checked against numpy, timed), after the
    search. On a Sapphire Rapids VM (2 threads) the AMX kernel ran 1300-2300 GFLOPS at
    M >= 64 against the vdpbf16ps family's 150-210; where it is not faster (a decode M
    streaming its weights, say), the family keeps the M. Not search candidates: their blocks
    come from the caches (gemm_dsl.amx_schedules), nothing to grow. Returns the winner and,
    for each AMX schedule that failed to build or to match numpy, why."""
    best, failed = res, {}
    trials, seconds = res.trials, res.seconds
    for sched in amx:
        t0 = time.perf_counter()
        got = measure(sched, res.m)
        trials, seconds = trials + 1, seconds + time.perf_counter() - t0
        if got.error:
            failed[sched] = got.error
        elif got.gflops > best.gflops:
            best = replace(res, schedule=sched, gflops=got.gflops, reused=False, stable=False)
    return replace(best, trials=trials, seconds=seconds), failed


def _model_seconds(guide: ModelGuide | None) -> float:
    return 0.0 if guide is None else guide.stats.train_seconds + guide.stats.predict_seconds


def verify_numerics(cache: KernelCache, *, n: int, k: int, ms: list[int], dtype: str = "float32",
                    threads: int | None = None, seed: int = 0) -> list[str]:
    """Run the GEMM cached for `threads` at each M against numpy; returns the failures."""
    import numpy as np

    from sandwich.tuner.reference import reference_matmul
    from sandwich.weight_formats import dequantize, quantize

    gemm = cache.gemm(n=n, k=k, dtype=dtype, threads=threads)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n), dtype=np.float32)
    if dtype != "float32":  # quantized once: packed as it is, and the reference on its values
        qw = quantize(w, dtype)
        wp, w = gemm.pack(qw), dequantize(qw)
    else:
        wp = gemm.pack(w)
    problems = []
    for m in ms:
        a = rng.standard_normal((m, k), dtype=np.float32)
        out = gemm(a, wp)
        ref = reference_matmul(a, w)
        err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
        if not np.isfinite(err) or err > 1e-4:
            problems.append(f"N={n} K={k} threads={gemm.threads} M={m}: max relative error {err:.3g}")
    return problems

