"""Weight formats side by side (issue 26): one model's tuned GEMMs in each format, in one run
with the same threads. Decode rows (M <= 8) stream their weights from beyond the LLC and are
reported in stored bytes per second against the streaming read of the same moment; larger M
in GFLOPS, with weights of 1/8 of the LLC or more also read from DRAM (as the tuner times
them and as a model reads them: each layer's weights evict the last's); every row also as a
speedup over the fp32 kernel of the same op and M timed in the same pass, and against its
Roof-Surface bound (tuner/roofsurface.py) on this machine's measured rates."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from sandwich.bench.baselines.measure import measure_runner
from sandwich.bench.compare import TIMING
from sandwich.bench.gemm import bound_runner, moment_read
from sandwich.bench.machine import measure_machine
from sandwich.compiler.gemm_runner import aligned_empty
from sandwich.errors import ConfigError
from sandwich.tuner import roofsurface as rs
from sandwich.tuner.machine_bench import read_bandwidth_gbs
from sandwich.tuner.streaming import from_dram, rotation_copies
from sandwich.tuner.trial_log import parse_schedule_key
from sandwich.tuner.tvm_measure import kernel_rows, kernel_weights
from sandwich.types import AMX8_OP, AMX_OPS
from sandwich.weight_formats import dequantize, gemm_dtype, parse_format, quantize

DECODE_MAX_M = 8
MODEL_CHECK = 0.15  # a MEM-bound row's time within 15% of the model's bound


@dataclass
class FormatRow:
    model: str
    op: str
    n: int
    k: int
    weights: str
    m: int
    us: float  # median time of one call
    gflops: float
    stored_mb: float  # what one call reads of the weights: values, scales, minimums
    schedule: str
    rotated: bool = False  # timed over copies beyond the LLC: the weights come from DRAM
    stored_gbs: float | None = None  # decode rows: stored bytes / time
    read_gbs: float | None = None  # the streaming read around this row's timing
    # a row whose weights stay in a cache: the read of a buffer of their size right after it
    cache_read_gbs: float | None = None
    pct_read: float | None = None
    speedup_vs_fp32: float | None = None
    bound_gflops: float | None = None  # the Roof-Surface bound, and what sets it
    bound_by: str | None = None  # MEM, VEC or MTX
    pct_bound: float | None = None
    pct_bound_range: tuple[float, float] | None = None  # over the passes; the row is their median


@dataclass
class FormatsResult:
    command: str
    machine: str
    threads: int
    read_gbs: float
    passes: int = 1
    rows: list[FormatRow] = field(default_factory=list)

    def model_check(self) -> tuple[int, int]:
        """How many of the rows the model calls MEM-bound sit within MODEL_CHECK of their
        bound (the issue's check of the model where memory bounds it), and how many there are."""
        mem = [r for r in self.rows if r.bound_by == "MEM"]
        return sum(abs(r.pct_bound - 100) <= 100 * MODEL_CHECK for r in mem), len(mem)

    def to_json(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "rows": [asdict(r) for r in self.rows]}


def run_formats(*, models: list[str], formats: list[str], ms: list[int], threads: int, cache,
                budget: str, seq_max: int, command: str, log: Callable[[str], None],
                progress: bool = True, passes: int = 1) -> FormatsResult:
    """Tune what the cache lacks (resumable, with a progress bar unless not `progress`), then
    time every (model, op, M) in every format, `passes` interleaved times, each row against
    its own moment's read where it streams from DRAM, and keep the pass of median % of
    bound."""
    if passes < 1:
        raise ConfigError(f"--passes must be >= 1, got {passes}")
    from sandwich.models import load_model_config
    from sandwich.payload import make_payload
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.shared_tuning import tune_shapes
    from sandwich.tuner.tune import unique_shapes

    limits = measure_machine(threads)
    host = rs.calibrate(threads, lanes=cache.cpu.lanes_f32, read_gbs=limits.read_gbs,
                        peak_gflops=limits.peak_gflops)
    log(f"Roof-Surface rates: FMA {host.fma_vector_ops / 1e9:.2f} G/s"
        + (f", vdpbf16ps {host.bf16_dot_ops / 1e9:.2f} G/s" if host.bf16_dot_ops else "")
        + (f", dot8 {host.int8_dot_ops / 1e9:.2f} G/s" if host.int8_dot_ops else "")
        + (f" ({host.narrow_dot_ops / 1e9:.2f} on 4- to 6-bit values)" if host.narrow_dot_ops else "")
        + (f", AMX tiles {host.amx_flops / 1e9:.0f} GFLOPS" if host.amx_flops else "")
        + "".join(f", {kind} {rate / 1e9:.2f} G/s" for kind, rate in host.vos.items()))
    res = FormatsResult(command, f"{cache.cpu.model} ({cache.cpu.mcpu})", threads, limits.read_gbs,
                        passes)
    formats = ["fp32", *(f for f in formats if parse_format(f).name != "fp32")]
    for model in models:
        cfg = load_model_config(model)
        ops: dict[str, dict[str, object]] = {}  # op name -> format -> its GEMM shape
        for fmt in formats:
            shapes = unique_shapes(make_payload(cfg, seq_max=seq_max, weights=fmt))
            missing = [(names, op) for names, op in shapes
                       if not cache.records(op.n, op.k, op.dtype, threads)]
            if missing:
                log(f"tuning {len(missing)} {fmt} GEMM shape(s) of {cfg.name} ({budget} budget)")
                tune_shapes(missing, seq_max=seq_max, threads=threads, budget=get_budget(budget),
                            cache=cache, progress=progress)
            for names, op in shapes:
                ops.setdefault("+".join(names), {})[fmt] = op
        rows = []
        for name, by_fmt in ops.items():
            for m in ms:
                rows += _paired_rows(by_fmt, passes, partial(_timed_row, cache, limits, host,
                                                             cfg.name, name, m, threads))
                for row in rows[-len(by_fmt):]:
                    log(_line(row))
        order = [parse_format(f).name for f in formats]
        res.rows += sorted(rows, key=lambda r: order.index(r.weights))  # a table per format
    within, mem = res.model_check()
    log(f"model check: {within} of {mem} MEM-bound rows within {MODEL_CHECK:.0%} of their bound")
    return res


def _paired_rows(by_fmt: dict, passes: int, time_row: Callable[[str, object], FormatRow]
                 ) -> list[FormatRow]:
    """One op at one M in every format, timed in interleaved passes (the formats in order,
    then backwards: A B C, C B A, ...), so each `x fp32` pairs timings seconds apart: the
    ratio of fp32's time to the format's within each pass, the median over the passes."""
    fmts = list(by_fmt)
    runs: dict[str, list[FormatRow]] = {f: [] for f in fmts}
    for p in range(passes):
        for fmt in fmts if p % 2 == 0 else fmts[::-1]:
            runs[fmt].append(time_row(fmt, by_fmt[fmt]))
    out = []
    for fmt in fmts:
        row = _median_pass(runs[fmt])
        if "fp32" in runs:
            row.speedup_vs_fp32 = float(np.median([b.us / r.us for b, r in
                                                   zip(runs["fp32"], runs[fmt], strict=True)]))
        out.append(row)
    return out


def _median_pass(runs: list[FormatRow]) -> FormatRow:
    """The pass of median % of bound (the lower middle of an even count), with the range; of
    median GFLOPS for a row without a bound (the AMX kernel's where the machine has no AMX rate)."""
    bounded = all(r.pct_bound is not None for r in runs)
    ranked = sorted(runs, key=lambda r: r.pct_bound if bounded else r.gflops)
    row = ranked[(len(ranked) - 1) // 2]
    if len(runs) > 1 and bounded:
        row.pct_bound_range = (ranked[0].pct_bound, ranked[-1].pct_bound)
    return row


def _timed_row(cache, limits, host: rs.HostRates, model: str, name: str, m: int, threads: int,
               fmt: str, op) -> FormatRow:
    """A row timed, and its Roof-Surface bound."""
    row = _time_row(cache, limits, model, name, op, fmt, m, threads)
    _roof(row, host, cache.cpu)
    return row


def _time_row(cache, limits, model: str, name: str, op, fmt: str, m: int,
              threads: int) -> FormatRow:
    rng = np.random.default_rng(m)
    w = rng.standard_normal((op.k, op.n), dtype=np.float32)
    ref = w  # what the kernel computes on
    if gemm_dtype(fmt) != "float32":  # quantized once: every copy packs the same values
        w = quantize(w, fmt)
        ref = dequantize(w)
    a = aligned_empty((m, op.k))
    a[...] = rng.standard_normal((m, op.k), dtype=np.float32)
    gemm = cache.gemm(n=op.n, k=op.k, dtype=op.dtype, threads=threads)
    out = aligned_empty((m, op.n))
    first = gemm.pack(w)
    stored = first.nbytes
    rotated = from_dram(m, stored, limits.llc_bytes, skinny_m=DECODE_MAX_M)
    handles = [first] + [gemm.pack(w) for _ in range(rotation_copies(stored, limits.llc_bytes) - 1)] \
        if rotated else [first]
    decode = m <= DECODE_MAX_M
    before = moment_read(limits) if decode else None
    sched = gemm.schedule_for(m)
    rows = kernel_rows(op.dtype, op.k, sched.op)
    t = measure_runner(name, bound_runner(gemm, out), a, kernel_weights(ref, op.dtype, sched.op),
                       handles, ref_a=rows(a) if rows else None, **TIMING)
    row = FormatRow(model, name, op.n, op.k, parse_format(fmt).name, m, t.timing.median_s * 1e6,
                    t.gflops, stored / 1e6, sched.key(), rotated)
    if decode:
        read = (before + moment_read(limits)) / 2
        row.stored_gbs = stored / t.timing.median_s / 1e9
        row.read_gbs, row.pct_read = read, 100 * row.stored_gbs / read
    elif not rotated:
        row.cache_read_gbs = read_bandwidth_gbs(limits.threads, size_bytes=stored, repeat=3)
    return row


def _roof(row: FormatRow, host: rs.HostRates, cpu) -> None:
    """The row's Roof-Surface bound: MBW is the read of its own moment for a decode row (the
    bandwidth drifts within seconds), for a row whose weights stay in a cache the read of a
    buffer of their size (that cache's bandwidth, not DRAM's), the start's for the others. A
    row the AMX kernel runs has AMX's tile rate for its MTX term (vdpbf16ps' is several times
    below it); on int weights its VEC term is their rounding to bf16, once per chunk of the
    schedule's b_m rows (rs.amx_signature); with byte products (AMX8_OP) its per-row scaling
    and per-block work (rs.amx8_signature)."""
    s = parse_schedule_key(row.schedule)
    amx = s.op in AMX_OPS
    if amx and not host.amx_flops:
        return
    mbw = row.read_gbs or row.cache_read_gbs
    rates = dataclasses.replace(host, mbw=mbw * 1e9) if mbw else host
    if s.op == AMX8_OP:
        sig = rs.amx8_signature(row.weights, cpu.lanes_f32, m=row.m, k=row.k)
    elif amx and parse_format(row.weights).quantized:
        sig = rs.amx_signature(row.weights, cpu.lanes_f32, m=row.m, rows=s.slice.b_m,
                               t_m=s.polymerization.t_m, k=row.k)
    else:
        sig = rs.kernel_signature(row.weights, cpu.lanes_f32, k=row.k, bf16_dot=cpu.bf16_dot)
    b = rs.bound(rates.machine(row.m, row.weights, k=row.k, amx=amx), sig,
                 rs.gemm_flops_per_op(cpu.lanes_f32, row.m))
    row.bound_gflops, row.bound_by = b.flops / 1e9, b.resource
    row.pct_bound = 100 * row.gflops / row.bound_gflops


def _line(r: FormatRow) -> str:
    read = (f", {r.stored_gbs:.1f} GB/s stored = {r.pct_read:.0f}% of the read"
            if r.stored_gbs is not None else ", weights from DRAM" if r.rotated else "")
    bound = f", {r.pct_bound:.0f}% of its {r.bound_by} bound" if r.bound_by else ""
    if r.pct_bound_range:
        bound += f" ({r.pct_bound_range[0]:.0f}-{r.pct_bound_range[1]:.0f}% over the passes)"
    return (f"{r.model} {r.op:<8} {r.weights:<14} M={r.m:<5} {r.us:9.1f} us "
            f"{r.gflops:7.1f} GFLOPS{read}{bound}")


def write_report(res: FormatsResult, md: Path, js: Path) -> None:
    within, mem = res.model_check()
    for p in (md, js):
        p.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res.to_json(), indent=1))
    lines = ["# Weight formats: the tuned GEMMs of each format, one run\n",
             f"- command: `{res.command}`",
             f"- machine: {res.machine}, {res.threads} threads; streaming read {res.read_gbs:.1f} "
             f"GB/s at the start (each decode row is taken against the read measured just "
             f"before and after it)",
             "- decode rows (M <= 8), and larger M where the weights are 1/8 of the LLC or more "
             "(`from`), cycle over copies of the weights 8x the LLC (twice an LLC past 128 MiB), so they stream from DRAM as "
             "in a model and as the tuner timed them; `stored` counts the bytes a call reads of "
             "the weights (values, scales, minimums); each kernel is checked against numpy on the weights it stores before it "
             "is timed; `x fp32` is the fp32 kernel's time over this one's, same op and M, "
             "both timed in the same pass seconds apart (the median over the passes)",
             "- bound: the Roof-Surface bound (`sandwichc roofsurface`) on the FMA, dot-product "
             "and dequantization rates measured at the start (a row the AMX kernel runs, "
             "schedule `amx_...`: AMX's tile rate as its MTX, and on int weights their rounding "
             "to bf16 once per chunk of its b_m rows as VEC; `amx8_...`, byte products: AMX's tile "
             "rate as MTX, the per-row scaling of each block's sums and int4's nibble split "
             "as VEC), with a decode row's own moment "
             "read as MBW, for a row from `cache` the read of a buffer the size of its weights "
             "(that cache's bandwidth), the start's for the other DRAM rows; the VEC and MTX "
             "times add (the dequantization and the products share the vector ports; the AMX "
             "kernel rounds before its tiles run): bound = min(MEM, 1 / (1 / VEC + 1 / MTX)), "
             "named by the resource that sets it",
             f"- passes: each op and M timed {res.passes} time(s) in every format, the formats "
             "in interleaved order (A B C, C B A); the table shows the pass of median % of "
             "bound, and the range over the passes",
             f"- model check: {within} of {mem} rows the model calls MEM-bound are within "
             f"{MODEL_CHECK:.0%} of their bound\n",
             "| model | op | N x K | weights | M | from | us | GFLOPS | stored MB | stored GB/s "
             "| % of read | bound GFLOPS | bound by | % of bound | range | x fp32 | schedule |",
             "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in res.rows:
        gbs = f"{r.stored_gbs:.1f}" if r.stored_gbs is not None else ""
        pct = f"{r.pct_read:.0f}%" if r.pct_read is not None else ""
        sp = f"{r.speedup_vs_fp32:.2f}" if r.speedup_vs_fp32 else ""
        bound = (f"{r.bound_gflops:.0f} | {r.bound_by} | {r.pct_bound:.0f}%" if r.bound_by
                 else " | | ")
        spread = (f"{r.pct_bound_range[0]:.0f}-{r.pct_bound_range[1]:.0f}%"
                  if r.pct_bound_range else "")
        lines.append(f"| {r.model} | {r.op} | {r.n} x {r.k} | {r.weights} | {r.m} | "
                     f"{'DRAM' if r.rotated else 'cache'} | {r.us:.1f} | "
                     f"{r.gflops:.1f} | {r.stored_mb:.2f} | {gbs} | {pct} | {bound} | {spread} | "
                     f"{sp} | `{r.schedule}` |")
    md.write_text("\n".join(lines) + "\n")
