"""Speed parity of the DSL GEMM (compiler/gemm_dsl.py) with the hand-built template
(compiler/gemm_template.py): both timed interleaved in one process, same threads.

Run: `python -m sandwich.bench.dsl_parity [--ms 1,16] [--rounds 15] [-o FILE]`.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

SHAPES = ((768, 768), (6144, 768), (768, 3072))  # (N, K)
MS = (1, 4, 16, 128, 512)
SCHEDULES = ("mk4x64 p1x2x1 s8x64x768", "mk6x64 p2x1x1 s24x64x128",
             "mk1x64 p1x2x1 s1x64x768", "mk2x64 p1x1x2 s2x64x384")
THREADS = 2


@dataclass(frozen=True)
class Case:
    n: int
    k: int
    m: int
    schedule: str


@dataclass(frozen=True)
class Result:
    case: Case
    hand_s: float  # best time per call
    dsl_s: float
    paired: float  # median over rounds of hand/DSL time of adjacent batches

    @property
    def ratio(self) -> float:
        """DSL speed / hand speed (>= 1: the DSL kernel is at least as fast)."""
        return self.hand_s / self.dsl_s


def parse_schedule(text: str, pack_n: int):
    """'mk4x64 p1x2x1 s8x64x768' -> KernelSchedule (micro-kernel, threads, slice)."""
    from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

    m = re.fullmatch(r"mk(\d+)x(\d+) p(\d+)x(\d+)x(\d+) s(\d+)x(\d+)x(\d+)", text.strip())
    if not m:
        raise ValueError(f"schedule {text!r} is not like 'mk4x64 p1x2x1 s8x64x768'")
    v = [int(x) for x in m.groups()]
    return KernelSchedule(MicroKernel(v[0], v[1]), ComputeSlice(*v[5:]), Polymerization(*v[2:5]),
                          pack_n)


def _batch_time(fn, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def time_pair(f_hand, f_dsl, *, rounds: int, batch_s: float = 0.01) -> tuple[float, float, float]:
    """Best per-call time of each, alternating batches A, B, A, B ... so that noise from
    other processes on a shared machine hits both; and the median over rounds of the
    paired ratio hand/DSL of adjacent batches (robust when a burst hits one kernel's
    best batch)."""
    for f in (f_hand, f_dsl, f_hand, f_dsl):
        f()  # warm-up
    one = max(_batch_time(f_hand, 1), 1e-7)
    number = max(1, min(2000, int(batch_s / one)))
    best = [math.inf, math.inf]
    pairs = []
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)  # neither always runs right after the other
        t = [0.0, 0.0]
        for i in order:
            t[i] = _batch_time((f_hand, f_dsl)[i], number)
            best[i] = min(best[i], t[i])
        pairs.append(t[0] / t[1])
    return best[0], best[1], statistics.median(pairs)


class _Family:
    """Both kernels of one (N, K, family), compiled once and checked against numpy."""

    def __init__(self, schedule, n: int, k: int, cpu) -> None:
        from sandwich.compiler.build import build_gemm
        from sandwich.compiler.gemm_dsl import build_gemm_dsl

        self.hand = build_gemm(schedule, n=n, k=k, cpu=cpu, threads=THREADS)["main"]
        self.dsl = build_gemm_dsl(schedule, n=n, k=k, cpu=cpu, threads=THREADS)["main"]


def _args(schedule, a, wp, c, ws):
    from sandwich.compiler.gemm_runner import gemm_args

    return gemm_args(a, wp, c, schedule, ws)


def run(cases_by_shape: dict, *, rounds: int, log=print) -> list[Result]:
    from sandwich.compiler.gemm_runner import aligned_empty, pack_weights
    from sandwich.compiler.target import detect_cpu

    cpu = detect_cpu()
    rng = np.random.default_rng(0)
    out: list[Result] = []
    for (n, k), items in cases_by_shape.items():
        w = rng.standard_normal((k, n), dtype=np.float32)
        pack = 64 if n % 64 == 0 else cpu.lanes_f32
        wp = pack_weights(w, pack)
        m_max = max(m for _, ms in items for m in ms)
        a = rng.standard_normal((m_max, k), dtype=np.float32)
        for text, ms in items:
            s = parse_schedule(text, pack)
            fam = _Family(s, n, k, cpu)
            for m in ms:
                t_k = s.polymerization.t_k
                c1, c2 = aligned_empty((m, n)), aligned_empty((m, n))
                ws1 = aligned_empty((t_k * m, n)) if t_k > 1 else None
                ws2 = aligned_empty((t_k * m, n)) if t_k > 1 else None
                args1, args2 = _args(s, a[:m], wp, c1, ws1), _args(s, a[:m], wp, c2, ws2)
                fam.hand(*args1)
                fam.dsl(*args2)
                ref = a[:m].astype(np.float64) @ w
                for c in (c1, c2):
                    err = np.abs(c - ref).max() / max(np.abs(ref).max(), 1e-30)
                    if not err <= 1e-4:
                        raise RuntimeError(f"{text} N={n} K={k} M={m}: wrong result ({err:.3g})")
                th, td, paired = time_pair(partial(fam.hand, *args1),
                                           partial(fam.dsl, *args2), rounds=rounds)
                r = Result(Case(n, k, m, text), th, td, paired)
                out.append(r)
                log(f"N={n:5d} K={k:5d} M={m:4d} {text:26s} hand {_gf(r, th):7.1f} "
                    f"dsl {_gf(r, td):7.1f} GFLOPS  ratio {r.ratio:.3f} paired {paired:.3f}")
    return out


def _gf(r: Result, t: float) -> float:
    return 2.0 * r.case.m * r.case.n * r.case.k / t / 1e9


def geomean(results: list[Result], paired: bool = False) -> float:
    if not results:
        return 0.0
    return math.exp(sum(math.log(r.paired if paired else r.ratio) for r in results)
                    / len(results))


def report(results: list[Result], command: str, rounds: int) -> str:
    from sandwich.compiler.target import detect_cpu

    cpu = detect_cpu()
    lines = [
        "# DSL GEMM vs hand-built GEMM template (issue 3, item 4)", "",
        f"Regenerate: `{command}`", "",
        f"- machine: {cpu.model} ({cpu.mcpu}, {cpu.isa}, {cpu.cores} cores), "
        f"{platform.system()} {platform.machine()}",
        f"- threads: {THREADS} (TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')})",
        f"- date: {datetime.date.today().isoformat()}",
        f"- method: both kernels compiled once per family in the same process; batches of "
        f"calls alternate hand, DSL, hand, DSL ({rounds} rounds); best batch of each. The "
        "machine is shared, so single cases are noisy; the geomean is the figure to read.",
        f"- load average (1 min) when the report was written: {os.getloadavg()[0]:.2f} "
        "(2 vCPUs; above ~0.3 other work competed with these runs)",
        "- ratio = DSL GFLOPS / hand GFLOPS of the best batches (goal: geomean >= 0.95); "
        "paired = median over rounds of the same ratio for adjacent batches",
        f"- worst / best case ratio: {min(r.ratio for r in results):.3f} / "
        f"{max(r.ratio for r in results):.3f}",
        "- why the DSL kernel can be faster: the hand template let-binds its integer "
        "scalars, and TVM 0.27 gives each let variable a heap workspace slot that is "
        "reloaded after every store; the DSL build substitutes them (compiler/lower_static.py)",
        "",
        "| N | K | M | schedule | hand GFLOPS | DSL GFLOPS | ratio | paired |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.case
        lines.append(f"| {c.n} | {c.k} | {c.m} | {c.schedule} | {_gf(r, r.hand_s):.1f} | "
                     f"{_gf(r, r.dsl_s):.1f} | {r.ratio:.3f} | {r.paired:.3f} |")
    lines += ["", f"**geomean ratio: {geomean(results):.3f}** (paired: "
              f"{geomean(results, paired=True):.3f}) over {len(results)} cases", ""]
    return "\n".join(lines)


def cases(*, ms=MS, shapes=SHAPES, schedules=SCHEDULES) -> dict:
    """{(N, K): [(schedule, Ms)]}: every schedule at every M for every shape."""
    return {shape: [(s, tuple(ms)) for s in schedules] for shape in shapes}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", type=_ints, default=MS, help="comma-separated M values")
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES),
                   help="comma-separated NxK")
    p.add_argument("--schedules", default=";".join(SCHEDULES),
                   help="';'-separated, e.g. 'mk4x64 p1x2x1 s8x64x768'")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("-o", "--out", default="results/gemm_dsl_parity.md")
    args = p.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(THREADS)  # read when TVM's thread pool starts
    shapes = tuple(tuple(int(x) for x in nk.split("x")) for nk in args.shapes.split(","))
    todo = cases(ms=args.ms, shapes=shapes, schedules=tuple(args.schedules.split(";")))
    results = run(todo, rounds=args.rounds)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m sandwich.bench.dsl_parity", shlex.join(given)]).strip()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report(results, command, args.rounds), encoding="utf-8")
    print(f"geomean ratio DSL/hand: {geomean(results):.3f} (paired "
          f"{geomean(results, paired=True):.3f}, {len(results)} cases) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
