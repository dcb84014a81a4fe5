"""`sandwichc bench kernels`: two versions of the GEMM family's source (the shipped one and an
edited copy, or two copies) timed against each other on the same schedules, interleaved; for
an AMX schedule (amx_...) two versions of the AMX kernel's (dsl/kernels/gemm_amx_bf16.sw).

A kernel change is worth a few points at decode, while a VM's streaming read drifts by more
than that between two runs minutes apart, so two `bench formats` runs (one per source) cannot
tell the change from the drift. Here both builds sit in one process and take turns, A B B A,
round after round (bench/cache_ab.py's rounds): both sides of a ratio ran seconds apart. Up
to M = 8 the weights rotate over copies beyond the LLC, as decode reads them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sandwich.bench.baselines.measure import check_gemm
from sandwich.bench.cache_ab import ROTATE_MAX_M, AbResult, AbRow, row_line, time_interleaved
from sandwich.compiler.gemm_runner import aligned_empty, gemm_args, pack_weight
from sandwich.compiler.target import describe_machine, detect_cpu
from sandwich.errors import ConfigError
from sandwich.tuner.streaming import llc_bytes, rotation_copies
from sandwich.tuner.trial_log import parse_schedule_key
from sandwich.types import KernelSchedule


@dataclass
class SourceSide:
    """One schedule built from one version of the family: packs weights in its format and
    runs on arguments bound once per (A, weights) pair, as the executor calls a GEMM (the
    timing loop keeps `a` and every handle alive, so their ids name them)."""

    name: str
    schedule: KernelSchedule
    func: Callable
    n: int
    bound: dict = field(default_factory=dict)

    def prepare(self, w) -> tuple:
        return pack_weight(w, self.schedule.pack_n, self.schedule.dtype)

    def run(self, a: np.ndarray, packed: tuple) -> np.ndarray:
        call = self.bound.get((id(a), id(packed)))
        if call is None:
            out = aligned_empty((a.shape[0], self.n))
            ws = aligned_empty((self.schedule.polymerization.t_k * a.shape[0], self.n))
            args = gemm_args(a, packed, out, self.schedule, ws)
            call = self.bound[(id(a), id(packed))] = (args, out)
        self.func(*call[0])
        return call[1]


def build_side(tag: str, src: str | None, schedule: KernelSchedule, n: int, k: int,
               threads: int, cpu) -> SourceSide:
    """`schedule` built from the source in `src` (None: the shipped one): the family's
    kernel, or for an AMX schedule the AMX kernel's."""
    from sandwich.compiler.gemm_dsl import build_gemm_dsl, kernel_name, load_family

    kernel = load_family(src, kernel_name(schedule.op)) if src else None
    func = build_gemm_dsl(schedule, n=n, k=k, cpu=cpu, threads=threads, kernel=kernel)["main"]
    return SourceSide(f"{tag} ({src or 'shipped'})", schedule, func, n)


def weight_copies(side: SourceSide, w, llc: int, *, rotate: bool = True) -> list[tuple]:
    """`w` packed by the side: one copy, and with `rotate` as many more as make them span
    beyond the LLC (decode rows cycle over them, as a model's layers stream from DRAM)."""
    first = side.prepare(w)
    copies = rotation_copies(sum(arr.nbytes for arr in first), llc) if rotate else 1
    return [first] + [side.prepare(w) for _ in range(copies - 1)]


def check_source_args(schedules: list[str], n: int, k: int, rounds: int, threads: int,
                      sources: tuple[str | None, ...]) -> list[KernelSchedule]:
    """The parsed schedule keys, or one ConfigError line for the first bad argument."""
    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    if n < 1 or k < 1:
        raise ConfigError(f"--n and --k must be >= 1, got {n} and {k}")
    for src in sources:
        if src is not None and not Path(src).is_file():
            raise ConfigError(f"{src}: no such kernel source file")
    try:
        parsed = [parse_schedule_key(s) for s in schedules]
    except ValueError as e:
        raise ConfigError(f"--schedule: {e}") from None
    if not parsed:
        raise ConfigError("give at least one --schedule (a key such as "
                          "gemm_int8-g32_mk4x64_p1x2x1_n64_s8x64x256)")
    for s in parsed:
        if s.polymerization.threads != threads:
            raise ConfigError(f"{s.key()} runs on {s.polymerization.threads} threads, not "
                              f"--threads {threads}")
    return parsed


def problem(schedule: KernelSchedule, n: int, k: int,
            rng) -> tuple[np.ndarray, np.ndarray, Callable | None]:
    """The weights in the schedule's format (quantized once: every copy packs the same
    values), the fp32 weights they stand for, and how the kernel rounds A (None: it does not)."""
    from sandwich.compiler.gemm_formats import weight_format
    from sandwich.tuner.tvm_measure import kernel_rows, kernel_weights
    from sandwich.weight_formats import dequantize, quantize

    w = ref = rng.standard_normal((k, n), dtype=np.float32)
    if weight_format(schedule.dtype).bits != 32:
        w = quantize(w, schedule.dtype)
        ref = kernel_weights(dequantize(w), schedule.dtype, schedule.op)
    return w, ref, kernel_rows(schedule.dtype, k, schedule.op)


def run_kernel_ab(*, a_src: str | None, b_src: str, schedules: list[str], n: int, k: int,
                  ms: list[int], threads: int, rounds: int = 8,
                  log: Callable[[str], None] = print, llc: int | None = None) -> AbResult:
    """Time each schedule (a KernelSchedule key; its dtype is the weight format) at every M
    built from `a_src` (None: the shipped family) and from `b_src`, interleaved. Both builds
    are first checked against numpy on what the kernel multiplies."""
    parsed = check_source_args(schedules, n, k, rounds, threads, (a_src, b_src))
    cpu = detect_cpu()
    llc = llc or llc_bytes()
    res = AbResult(a_src or "shipped", b_src, threads, rounds, describe_machine(),
                   datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    rng = np.random.default_rng(0)
    for s in parsed:
        sides = tuple(build_side(tag, src, s, n, k, threads, cpu)
                      for tag, src in (("A", a_src), ("B", b_src)))
        w, ref, rows = problem(s, n, k, rng)
        # packed once per schedule: decode rows rotate over every copy, the others use the first
        rotation = [weight_copies(side, w, llc, rotate=min(ms) <= ROTATE_MAX_M) for side in sides]
        first = [hs[0] for hs in rotation]
        for m in ms:
            x = aligned_empty((m, k))
            x[...] = rng.standard_normal((m, k), dtype=np.float32)
            rotated = m <= ROTATE_MAX_M
            handles = rotation if rotated else [[h] for h in first]
            for side, h in zip(sides, first, strict=True):
                check_gemm(side.run(x, h), rows(x) if rows else x, ref, what=side.name)
            row = AbRow(s.key(), n, k, m, rotated)
            time_interleaved(row, sides, handles, x, rounds)
            res.rows.append(row)
            log(row_line(row))
    return res
