"""`sandwichc bench schedules`: several schedules of one GEMM, in any weight formats, timed
against the first in interleaved rounds: say fp32's tuned kernel, then two bf16 tunes' picks.

`bench formats` times each format's row minutes after fp32's, and on this VM two such figures
drift apart by several percent: session 33's table had bf16 prefill at 1.84-2.01x fp32, while
the same kernels taken in turns, seconds apart, were at 1.94-2.00x. Here every schedule is
built from the shipped family, checked against numpy on what it multiplies, and the sides take
turns A B C C B A (bench/cache_ab.py's rounds): each ratio to the first compares one moment's
figures. Up to M = 8 the weights rotate over copies beyond the LLC, as decode reads them.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sandwich.bench.baselines.measure import check_gemm
from sandwich.bench.cache_ab import ROTATE_MAX_M, gemm_timer, interleaved_rounds
from sandwich.bench.kernel_ab import build_side, check_source_args, problem, weight_copies
from sandwich.compiler.gemm_runner import aligned_empty
from sandwich.compiler.target import describe_machine, detect_cpu
from sandwich.errors import ConfigError
from sandwich.tuner.streaming import llc_bytes


@dataclass
class ScheduleRow:
    n: int
    k: int
    m: int
    rotated: bool
    schedules: list[str]
    gflops: list[list[float]] = field(default_factory=list)  # per schedule, one per round

    def ratios(self, i: int) -> list[float]:
        """Each round's GFLOPS of schedule i over the first schedule's in the same round."""
        return [a / b for a, b in zip(self.gflops[i], self.gflops[0], strict=True)]

    def line(self) -> str:
        parts = [f"M={self.m} {self.n}x{self.k}{' rotated' if self.rotated else ''}:"]
        for i, key in enumerate(self.schedules):
            text = f"{key} {statistics.median(self.gflops[i]):.1f}"
            if i:
                r = self.ratios(i)
                text += f" (x{statistics.median(r):.3f}, {min(r):.3f}-{max(r):.3f})"
            parts.append(text)
        return "  ".join(parts)


@dataclass
class ScheduleResult:
    threads: int
    rounds: int
    machine: str
    date: str
    rows: list[ScheduleRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "rows": [asdict(r) | {"ratios": [r.ratios(i) for i in range(len(r.schedules))]}
                         for r in self.rows]}


def run_schedule_ab(*, schedules: list[str], n: int, k: int, ms: list[int], threads: int,
                    rounds: int = 5, log: Callable[[str], None] = print,
                    llc: int | None = None) -> ScheduleResult:
    """Each schedule key (its dtype the weight format) built from the shipped family and timed
    at every M against the first, in `rounds` interleaved rounds."""
    parsed = check_source_args(schedules, n, k, rounds, threads, ())
    if len(parsed) < 2:
        raise ConfigError("give two or more --schedule keys: the first is the reference")
    cpu = detect_cpu()
    llc = llc or llc_bytes()
    res = ScheduleResult(threads, rounds, describe_machine(),
                         datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    rng = np.random.default_rng(0)
    sides = [build_side(f"schedule {i + 1}", None, s, n, k, threads, cpu) for i, s in enumerate(parsed)]
    # one set of fp32 weights; each format quantizes it (problem() with the same seed)
    weights = [problem(s, n, k, np.random.default_rng(1)) for s in parsed]
    handles = [weight_copies(side, w, llc, rotate=min(ms) <= ROTATE_MAX_M)
               for side, (w, _, _) in zip(sides, weights, strict=True)]
    for m in ms:
        x = aligned_empty((m, k))
        x[...] = rng.standard_normal((m, k), dtype=np.float32)
        rotated = m <= ROTATE_MAX_M
        for side, (_, ref, rows), hs in zip(sides, weights, handles, strict=True):
            check_gemm(side.run(x, hs[0]), rows(x) if rows else x, ref, what=f"{side.name}: {side.schedule.key()}")
        row = ScheduleRow(n, k, m, rotated, [s.key() for s in parsed])
        row.gflops = interleaved_rounds([gemm_timer(side.run, x, hs if rotated else hs[:1], n, k)
                                         for side, hs in zip(sides, handles, strict=True)], rounds)
        res.rows.append(row)
        log(row.line())
    return res


def write_markdown(res: ScheduleResult, path: Path, command: str) -> None:
    lines = ["# Schedules of one GEMM, interleaved: each against the first", "",
             f"Command: `{command}`", f"Machine: {res.machine}; {res.threads} threads; {res.date}.",
             f"Each schedule is built from the shipped family and checked against numpy first. The "
             f"schedules take turns forward and back in each round (A B C C B A, reversed every "
             f"other round), each keeping its better figure; `x first` is the median over the "
             f"{res.rounds} rounds of the round's ratio, with its range. Up to M = {ROTATE_MAX_M} "
             f"the weights rotate over copies beyond the LLC.", "",
             "| M | N x K | schedule | GFLOPS (median) | x first | range over rounds |",
             "|---:|---|---|---:|---:|---|"]
    for r in res.rows:
        for i, key in enumerate(r.schedules):
            ratios = r.ratios(i)
            cells = ("1", "") if i == 0 else (f"{statistics.median(ratios):.3f}",
                                                f"{min(ratios):.3f}-{max(ratios):.3f}")
            lines.append(f"| {r.m} | {r.n} x {r.k}{' (rotated)' if r.rotated else ''} | `{key}` | "
                         f"{statistics.median(r.gflops[i]):.1f} | {cells[0]} | {cells[1]} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
