"""`sandwichc bench caches`: two kernel caches of one machine (two tunes: with and without the
cost model, two budgets, two versions) timed against each other row by row.

`bench gemm` times each runner over every row and then the next runner, so a VM that slows
down for a minute can hand one side a whole slow pass. Here each row's two GEMMs alternate,
A B B A ..., for a number of rounds, and the row's figure is the median of the per-round
ratios B / A: both sides of a ratio ran seconds apart. Up to M = 8 the weights rotate over
copies beyond the LLC, as decode reads them.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandwich.bench.baselines.cache_peer import CachePeer
from sandwich.bench.baselines.measure import check_gemm, time_rotated
from sandwich.bench.gemm import aligned_problem, geomean
from sandwich.compiler.target import describe_machine
from sandwich.errors import ConfigError
from sandwich.models import load_model_config
from sandwich.payload import make_payload
from sandwich.tuner.streaming import llc_bytes, rotation_copies
from sandwich.tuner.timing import gflops, time_callable
from sandwich.tuner.tune import unique_shapes

ROTATE_MAX_M = 8
TIMING = {"warmup": 2, "repeat": 7, "min_repeat_s": 0.03}


@dataclass
class AbRow:
    op: str
    n: int
    k: int
    m: int
    rotated: bool
    a_gflops: list[float] = field(default_factory=list)  # one per round
    b_gflops: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Median over rounds of B's GFLOPS / A's in the same round."""
        return statistics.median(b / a for a, b in zip(self.a_gflops, self.b_gflops, strict=True))


@dataclass
class AbResult:
    a: str
    b: str
    threads: int
    rounds: int
    machine: str
    date: str
    rows: list[AbRow] = field(default_factory=list)

    def geomean(self, pred: Callable[[AbRow], bool] = lambda r: True) -> float:
        return geomean([r.ratio for r in self.rows if pred(r)])

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "threads": self.threads, "rounds": self.rounds,
                "machine": self.machine, "date": self.date,
                "geomean_b_over_a": self.geomean(),
                "rows": [{"op": r.op, "n": r.n, "k": r.k, "m": r.m, "rotated": r.rotated,
                          "a_gflops": r.a_gflops, "b_gflops": r.b_gflops, "ratio": r.ratio}
                         for r in self.rows]}


def run_ab(*, a_dir: str, b_dir: str, models: list[str], ms: list[int], threads: int,
           rounds: int = 5, log: Callable[[str], None] = print,
           llc: int | None = None) -> AbResult:
    """Time every unique GEMM of the models at every M from both caches, interleaved;
    decode rows rotate copies of the weights 8x `llc` (this machine's LLC unless given)."""
    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    if Path(a_dir).resolve() == Path(b_dir).resolve():
        raise ConfigError("--a and --b are the same cache: nothing to compare")
    sides = (CachePeer(a_dir, threads), CachePeer(b_dir, threads))
    res = AbResult(a_dir, b_dir, threads, rounds, describe_machine(),
                   datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    llc = llc or llc_bytes()
    for model in models:
        payload = make_payload(load_model_config(model), tp=1, seq_max=max(ms))
        for names, op in unique_shapes(payload):
            if op.dtype != "float32":
                raise ConfigError(f"bench caches times fp32 GEMMs; {'+'.join(names)} is {op.dtype}")
            for m in ms:
                x, w = aligned_problem(m, op.n, op.k)
                rotated = m <= ROTATE_MAX_M
                copies = rotation_copies(w.nbytes, llc) if rotated else 1
                handles = [[side.prepare(w) for _ in range(copies)] for side in sides]
                for side, hs in zip(sides, handles, strict=True):  # once: numpy at M = 2048 is slow
                    check_gemm(side.run(x, hs[0]), x, w, what=side.name)
                row = AbRow("+".join(names), op.n, op.k, m, rotated)
                time_interleaved(row, sides, handles, x, rounds)
                res.rows.append(row)
                log(row_line(row))
    return res


def interleaved_rounds(sides: list[Callable[[], float]], rounds: int) -> list[list[float]]:
    """Each side's better figure in each of `rounds` rounds, the sides taking turns forward and
    back within a round (A B B A; three sides A B C C B A), the order reversed every other
    round (B A A B): every side runs as often early as late in a round, seconds from the others."""
    out: list[list[float]] = [[] for _ in sides]
    for r in range(rounds):
        order = list(range(len(sides))) if r % 2 == 0 else list(reversed(range(len(sides))))
        got: dict[int, list[float]] = {i: [] for i in order}
        for i in order + order[::-1]:
            got[i].append(sides[i]())
        for i, figures in got.items():
            out[i].append(max(figures))
    return out


def gemm_timer(run: Callable, x, handles: list, n: int, k: int) -> Callable[[], float]:
    """A call that times run(x, handle) and returns GFLOPS: over the handles round robin when
    there are several (weights rotated beyond the LLC), else on the one."""
    def gemm_gflops() -> float:
        t = (time_rotated(run, x, handles, **TIMING) if len(handles) > 1 else
             time_callable(lambda: run(x, handles[0]), **TIMING))
        return gflops(2.0 * x.shape[0] * n * k, t.median_s)
    return gemm_gflops


def time_interleaved(row: AbRow, sides, handles, x, rounds: int) -> None:
    """`rounds` rounds of A B B A (odd rounds B A A B) of the two sides' run(x, handle), each
    over its handles round robin when it has several (weights rotated beyond the LLC); each
    side's better run of a round goes into the row."""
    a, b = interleaved_rounds([gemm_timer(side.run, x, hs, row.n, row.k)
                               for side, hs in zip(sides, handles, strict=True)], rounds)
    row.a_gflops.extend(a)
    row.b_gflops.extend(b)


def row_line(row: AbRow) -> str:
    return (f"{row.op:<14} M={row.m:<5} {row.n}x{row.k}{' rotated' if row.rotated else ''}: "
            f"A {statistics.median(row.a_gflops):7.1f}  B {statistics.median(row.b_gflops):7.1f} "
            f"GFLOPS  B/A x{row.ratio:.3f}")


GROUPS = (("all", lambda r: True), ("M <= 8", lambda r: r.m <= 8),
          ("16 <= M <= 256", lambda r: 16 <= r.m <= 256), ("M >= 512", lambda r: r.m >= 512))


def write_markdown(res: AbResult, path: Path, command: str,
                   title: str = "Two kernel caches, interleaved: B / A") -> None:
    lines = [f"# {title}", "",
             f"Command: `{command}`", f"Machine: {res.machine}; {res.threads} threads; {res.date}.",
             f"A = `{res.a}`, B = `{res.b}`. Each row: {res.rounds} rounds of A B B A (or B A A B), "
             "each side's better run per round; the row's ratio is the median over rounds of "
             "B / A. Rows up to M = 8 rotate the weights beyond the LLC.", "",
             "Geomean B / A: " + ", ".join(
                 f"{name} {res.geomean(pred):.3f}" for name, pred in GROUPS
                 if any(pred(r) for r in res.rows)) + ".", "",
             "| op | N x K | M | A GFLOPS (median) | B GFLOPS (median) | B / A |",
             "|---|---|---|---|---|---|"]
    for r in res.rows:
        lines.append(f"| {r.op} | {r.n}x{r.k} | {r.m}{' (rotated)' if r.rotated else ''} | "
                     f"{statistics.median(r.a_gflops):.1f} | {statistics.median(r.b_gflops):.1f} | "
                     f"{r.ratio:.3f} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
