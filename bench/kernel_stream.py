"""`sandwichc bench streaming`: a decode GEMM against the two ceilings it runs under, timed in
interleaved rounds: the streaming read (DRAM) and the same kernel on one cache-resident copy of
its weights (its compute ceiling).

A decode kernel that streams its weights reaches at most the lower of the two. When its
compute ceiling sits close to the read (int8 at M = 8 on a 2-core Zen 4), it reaches neither,
and its % of the read moves with the read, which drifts by tens of percent on a VM within
minutes. Each round times the read, the streamed kernel and the resident kernel seconds
apart (A B C C B A, bench/cache_ab.py's rounds), so a round's ratios compare one moment's
figures, and the rounds show how the share changes with the read.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sandwich.bench.baselines.measure import check_gemm, time_rotated
from sandwich.bench.cache_ab import ROTATE_MAX_M, TIMING, interleaved_rounds
from sandwich.bench.kernel_ab import build_side, check_source_args, problem, weight_copies
from sandwich.compiler.gemm_runner import aligned_empty
from sandwich.compiler.target import describe_machine, detect_cpu
from sandwich.errors import ConfigError
from sandwich.tuner.machine_bench import default_read_bytes, read_bandwidth_gbs
from sandwich.tuner.streaming import llc_bytes
from sandwich.tuner.timing import time_callable


@dataclass
class StreamRow:
    schedule: str
    n: int
    k: int
    m: int
    stored_mb: float  # what one call reads of the weights: values, scales, minimums
    copies: int  # weight copies the streamed kernel rotates over
    read_gbs: list[float] = field(default_factory=list)  # one figure per round
    streamed_gbs: list[float] = field(default_factory=list)  # stored bytes / time
    resident_gbs: list[float] = field(default_factory=list)  # empty: a copy fills the LLC

    def of_read(self) -> list[float]:
        """Each round's streamed rate over the same round's read."""
        return [s / r for s, r in zip(self.streamed_gbs, self.read_gbs, strict=True)]

    def of_ceiling(self) -> list[float]:
        """Each round's streamed rate over the lower of its read and its resident rate."""
        return [s / min(r, c) for s, r, c in
                zip(self.streamed_gbs, self.read_gbs, self.resident_gbs, strict=True)]

    def line(self) -> str:
        med = statistics.median
        share = self.of_read()
        text = (f"{self.schedule} M={self.m} {self.n}x{self.k}: read {med(self.read_gbs):.1f}, "
                f"streamed {med(self.streamed_gbs):.1f}")
        if self.resident_gbs:
            text += f", resident {med(self.resident_gbs):.1f}"
        text += f" GB/s; streamed / read {med(share):.2f} ({min(share):.2f}-{max(share):.2f})"
        if self.resident_gbs:
            text += f", / min(read, resident) {med(self.of_ceiling()):.2f}"
        return text


@dataclass
class StreamResult:
    source: str
    threads: int
    rounds: int
    machine: str
    date: str
    rows: list[StreamRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "rows": [asdict(r) | {"of_read": r.of_read(),
                                      "of_ceiling": r.of_ceiling() if r.resident_gbs else []}
                         for r in self.rows]}


def run_kernel_stream(*, src: str | None, schedules: list[str], n: int, k: int, ms: list[int],
                      threads: int, rounds: int = 8, log: Callable[[str], None] = print,
                      llc: int | None = None, read_bytes: int | None = None) -> StreamResult:
    """Each schedule (a KernelSchedule key; its dtype is the weight format) built from `src`
    (None: the shipped family), checked against numpy, then at every M <= 8 timed in
    `rounds` interleaved rounds against the streaming read of `read_bytes` (default: the
    benchmark's, a rotation's or more: streaming.rotation_bytes) and against itself on one copy of its weights, which
    stays cache-resident when it fits half the LLC (`llc`: this machine's unless given)."""
    parsed = check_source_args(schedules, n, k, rounds, threads, (src,))
    if not ms or not all(1 <= m <= ROTATE_MAX_M for m in ms):
        raise ConfigError(f"--m: decode rows only, 1 to {ROTATE_MAX_M}; got {ms}")
    cpu = detect_cpu()
    llc = llc or llc_bytes()
    read_bytes = read_bytes or default_read_bytes()
    res = StreamResult(src or "shipped", threads, rounds, describe_machine(),
                       datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    rng = np.random.default_rng(0)
    for s in parsed:
        side = build_side("kernel", src, s, n, k, threads, cpu)
        w, ref, rows = problem(s, n, k, rng)
        handles = weight_copies(side, w, llc)
        stored = sum(arr.nbytes for arr in handles[0])
        for m in ms:
            x = aligned_empty((m, k))
            x[...] = rng.standard_normal((m, k), dtype=np.float32)
            for h in (handles[0], handles[-1]):
                check_gemm(side.run(x, h), rows(x) if rows else x, ref, what=side.name)

            row = StreamRow(s.key(), n, k, m, stored / 1e6, len(handles))
            figures = interleaved_rounds(_timers(side, x, handles, stored, threads, read_bytes,
                                                 resident=2 * stored <= llc), rounds)
            row.read_gbs, row.streamed_gbs = figures[0], figures[1]
            row.resident_gbs = figures[2] if len(figures) > 2 else []
            res.rows.append(row)
            log(row.line())
    return res


def _timers(side, x: np.ndarray, handles: list, stored: int, threads: int, read_bytes: int,
            *, resident: bool) -> list[Callable[[], float]]:
    """The round's sides, each a call that returns GB/s: the read, the kernel over every copy
    of its weights in turn, and (`resident`) the kernel on the first copy alone."""
    def read() -> float:
        return read_bandwidth_gbs(threads, size_bytes=read_bytes, repeat=3)

    def streamed() -> float:
        return stored / time_rotated(side.run, x, handles, **TIMING).median_s / 1e9

    def cached() -> float:
        return stored / time_callable(lambda: side.run(x, handles[0]), **TIMING).median_s / 1e9

    return [read, streamed] + ([cached] if resident else [])


def write_markdown(res: StreamResult, path: Path, command: str) -> None:
    lines = ["# A decode GEMM against the read and against its own compute ceiling", "",
             f"Command: `{command}`", f"Machine: {res.machine}; {res.threads} threads; {res.date}; "
             f"source: {res.source}.",
             f"Each round times the streaming read, the kernel on weights rotated beyond the LLC "
             f"(`streamed`) and the kernel on one copy of its weights, cache-resident (`resident`, "
             f"where a copy fits half the LLC), in the order read, streamed, resident, resident, "
             f"streamed, read (reversed every other round), and keeps each one's better figure. "
             f"Rates are GB/s of the bytes one call reads of the weights (values, scales, "
             f"minimums). {res.rounds} rounds per row.", ""]
    for r in res.rows:
        lines += [f"## {r.schedule}, M = {r.m}, N x K = {r.n} x {r.k} ({r.stored_mb:.2f} MB, "
                  f"{r.copies} copies)", "",
                  "| round | read | streamed | resident | streamed / read | streamed / min(read, resident) |",
                  "|---:|---:|---:|---:|---:|---:|"]
        ceiling = r.of_ceiling() if r.resident_gbs else [None] * len(r.read_gbs)
        resident = r.resident_gbs or [None] * len(r.read_gbs)
        for i, (rd, st, rs, fr, fc) in enumerate(zip(r.read_gbs, r.streamed_gbs, resident,
                                                     r.of_read(), ceiling, strict=True)):
            lines.append(f"| {i + 1} | {rd:.1f} | {st:.1f} | {'' if rs is None else f'{rs:.1f}'} | "
                         f"{fr:.2f} | {'' if fc is None else f'{fc:.2f}'} |")
        lines += ["", r.line(), ""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
