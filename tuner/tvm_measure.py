"""The real measure: compile a schedule once (M is symbolic), check it against numpy, time it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sandwich.compiler.buffers import aligned_copy
from sandwich.compiler.gemm_dsl import build_gemm_dsl
from sandwich.compiler.gemm_formats import int_activations, quantized_activations, weight_format
from sandwich.compiler.gemm_runner import (
    aligned_empty,
    call_gemm,
    gemm_args,
    pack_weight,
    rotated_args,
    workspace_view,
    wrap,
)
from sandwich.compiler.target import CpuInfo
from sandwich.errors import BuildError, ConfigError, ShapeError
from sandwich.tuner.measure import MeasureResult
from sandwich.tuner.reference import ReferenceRows, reference_matmul
from sandwich.tuner.streaming import from_dram, llc_bytes, rotation_copies
from sandwich.tuner.timing import gflops, time_callable
from sandwich.types import AMX_OP, GEMM_OP, KernelSchedule
from sandwich.weight_formats import dequantize, quantize, round_bf16


def kernel_rows(dtype: str, k: int, op: str = GEMM_OP) -> Callable[[np.ndarray], np.ndarray] | None:
    """What the kernel multiplies for rows of A: for bf16 weights or on AMX tiles (`op`), A
    rounded to bf16; for an int format with 8-bit activations, the activations as the kernel
    quantizes them; None for A itself."""
    fmt = weight_format(dtype)
    if fmt.bits == 16 or op == AMX_OP:
        return round_bf16
    return quantized_activations if int_activations(fmt, k) else None


def kernel_weights(w: np.ndarray, dtype: str, op: str = GEMM_OP) -> np.ndarray:
    """What the kernel multiplies for the weights `w` (dequantized, for an int format): on AMX
    tiles, an int format's values times their scale rounded to bf16; else `w`."""
    return round_bf16(w) if op == AMX_OP and weight_format(dtype).quantized else w


def result_error(out: np.ndarray, ref: np.ndarray, schedule: KernelSchedule,
                 rtol: float = 1e-4, where: str = "") -> str:
    """Compare a kernel's output with its float64 reference; '' when it matches."""
    err = np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30)
    if not np.isfinite(err) or err > rtol:
        return f"kernel {schedule.key()} is wrong at M={ref.shape[0]}{where}: max relative error {err:.3g}"
    return ""


def check_against_numpy(func, schedule: KernelSchedule, a: np.ndarray,
                        wp: np.ndarray | tuple[np.ndarray, ...], w: np.ndarray,
                        rtol: float = 1e-4, ref: np.ndarray | None = None) -> str:
    """Run the kernel on `a` and compare with a float64 reference on `w` (for an int format,
    the dequantized weights), or with `ref` when the caller keeps it; '' when it matches."""
    m, n = a.shape[0], w.shape[1]
    out = np.full((m, n), np.nan, dtype=np.float32)
    ws = None
    if schedule.polymerization.t_k > 1:
        ws = np.empty((schedule.polymerization.t_k * m, n), dtype=np.float32)
    call_gemm(func, a, wp, out, schedule, ws)
    if ref is None:
        rows = kernel_rows(schedule.dtype, a.shape[1], schedule.op)
        ref = reference_matmul(rows(a) if rows else a, kernel_weights(w, schedule.dtype, schedule.op))
    return result_error(out, ref, schedule, rtol)


def random_problem(n: int, k: int, pack_n: int, seq_max: int, *, threads: int, seed: int,
                   dtype: str = "float32") -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
    """The weights W[K, N] (as the kernel sees them: dequantized for an int format), their
    packed arrays for `dtype`, and activations A[seq_max, K] a measure times on, after
    refusing a packing that does not divide N and buffers that would not fit."""
    if n % pack_n:
        raise ConfigError(f"N={n} is not a multiple of the packed width {pack_n}")
    check_fits(n, k, seq_max, threads)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n), dtype=np.float32)
    a = rng.standard_normal((seq_max, k), dtype=np.float32)
    fmt = weight_format(dtype)
    if fmt.bits == 32:
        return w, pack_weight(w, pack_n), a
    qw = quantize(w, fmt)
    return dequantize(qw), pack_weight(qw, pack_n, dtype), a


def check_ms(schedule: KernelSchedule, seq_max: int) -> list[int]:
    """M values that exercise full blocks, every tail path, and M=1."""
    mu_m = schedule.micro_kernel.mu_m
    ms = {1, mu_m, 2 * schedule.slice.b_m + mu_m - 1, schedule.slice.b_m * schedule.polymerization.t_m + 1}
    return sorted(m for m in ms if 1 <= m <= max(seq_max, 1))


@dataclass
class TvmMeasure:
    """Measures schedules of one (N, K) GEMM on this machine; compiled kernels are kept by key."""

    cpu: CpuInfo
    threads: int
    n: int
    k: int
    pack_n: int
    seq_max: int
    repeat: int = 5
    min_repeat_s: float = 0.01
    seed: int = 0
    dtype: str = "float32"  # the weight format (sandwich/weight_formats.py), "float32" for fp32
    stream_max_m: int = 8  # up to this M, weights are timed as streamed from DRAM
    llc_bytes: int = field(default_factory=llc_bytes)
    max_copies: int = 1024
    give_up: float = 1.3  # past skinny M, a first repeat this much slower than the M's best ends
    compile_seconds: float = 0.0
    kernels: dict[KernelSchedule, object] = field(default_factory=dict)  # family -> executable
    failed: dict[KernelSchedule, str] = field(default_factory=dict)
    verified: set[KernelSchedule] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.w, self.wp, self.a = random_problem(self.n, self.k, self.pack_n, self.seq_max,
                                                 threads=self.threads, seed=self.seed,
                                                 dtype=self.dtype)
        self.c = aligned_empty((self.seq_max, self.n))
        self._references: dict[str, ReferenceRows] = {}  # op -> what its kernel multiplies
        self.ws_buf = np.empty(0, dtype=np.float32)
        self._streamed: list[tuple[np.ndarray, ...]] = []
        self._wrapped: dict[bool, list[tuple]] = {}  # cold -> each copy's arrays, wrapped once
        self._best_s: dict[int, float] = {}  # M -> the fastest run timed at it

    def reference(self, op: str, m: int) -> np.ndarray:
        """The float64 product of A[:m] and W as a kernel of `op` multiplies them (the AMX
        kernel in bf16), each row computed once per op."""
        if op not in self._references:
            self._references[op] = ReferenceRows(self.a, kernel_weights(self.w, self.dtype, op),
                                                 kernel_rows(self.dtype, self.k, op))
        return self._references[op](m)

    def streamed_weights(self) -> list[np.ndarray]:
        """Copies of the packed weights, together a rotation's bytes (8x the LLC, twice a
        large one: streaming.rotation_bytes), that skinny-M timings (and every timing of
        large weights: streaming.from_dram) rotate through: at M <= 8 (decode) a GEMM reads
        its weights from DRAM, and the schedule that is fastest
        on cache-resident weights need not be the one that streams them fastest (its b_k and
        threads set how many misses are in flight).

        Each copy is its own allocation, as a model's weights are: in one contiguous block
        the hardware prefetcher runs on from one copy into the next, which hid about 4 us of
        each call's cold start (a tenth of a 768 x 768 call) and ranked schedules as no
        model runs them."""
        if not self._streamed:
            nbytes = sum(x.nbytes for x in self.wp)
            copies = min(self.max_copies, rotation_copies(nbytes, self.llc_bytes))
            self._streamed = [tuple(aligned_copy(x, x.dtype) for x in self.wp) for _ in range(copies)]
        return self._streamed

    def kernel(self, schedule: KernelSchedule):
        """Compile its family once, and verify each new slice once; returns the executable,
        raises BuildError if the kernel is wrong (a wrong kernel is never timed or stored)."""
        if schedule in self.failed:
            raise BuildError(self.failed[schedule])
        if schedule not in self.verified:
            t0 = time.perf_counter()
            try:
                fam = schedule.family()
                if schedule.dtype != self.dtype:
                    raise ConfigError(f"schedule {schedule.key()} is for {schedule.dtype} weights, "
                                      f"this measure holds {self.dtype}")
                if fam not in self.kernels:
                    self.kernels[fam] = build_gemm_dsl(schedule, n=self.n, k=self.k, cpu=self.cpu,
                                                   threads=self.threads)
                ex = self.kernels[fam]
                func = ex["main"]
                for m in check_ms(schedule, self.seq_max):
                    err = check_against_numpy(func, schedule, self.a[:m], self.wp, self.w,
                                              ref=self.reference(schedule.op, m))
                    if err:
                        raise BuildError(err)
            except (BuildError, ConfigError, ShapeError) as e:  # ShapeError: a slice it cannot run
                self.failed[schedule] = str(e)
                raise BuildError(str(e)) from None
            finally:
                self.compile_seconds += time.perf_counter() - t0
            self.verified.add(schedule)
        return self.kernels[schedule.family()]

    def __call__(self, schedule: KernelSchedule, m: int) -> MeasureResult:
        try:
            func = self.kernel(schedule)["main"]
        except BuildError as e:
            return MeasureResult(0.0, 0.0, error=str(e))
        t_k = schedule.polymerization.t_k
        ws = None
        if t_k > 1:
            if self.ws_buf.size < t_k * m * self.n:
                self.ws_buf = aligned_empty((t_k * self.seq_max * self.n,))
            ws = workspace_view(self.ws_buf, t_k, m, self.n)
        skinny = m <= self.stream_max_m
        cold = from_dram(m, sum(x.nbytes for x in self.wp), self.llc_bytes, skinny_m=self.stream_max_m)
        weights = self.streamed_weights() if cold else [self.wp]
        if cold not in self._wrapped:
            self._wrapped[cold] = [tuple(map(wrap, (wp,) if isinstance(wp, np.ndarray) else wp))
                                   for wp in weights]
        args = gemm_args(self.a[:m], weights[0], self.c[:m], schedule, ws)
        calls = itertools.cycle(rotated_args(args, self._wrapped[cold]))
        # a big GEMM's call lasts up to seconds at large M, where most candidates of a round
        # are far behind the leader: one repeat of those ranks them as well as three
        best = self._best_s.get(m)
        give_up = None if skinny or best is None else self.give_up * best
        t = time_callable(lambda: func(*next(calls)), warmup=1, repeat=self.repeat,
                          min_repeat_s=self.min_repeat_s, max_total_s=0.5, give_up_s=give_up)
        self._best_s[m] = min(t.min_s, best or t.min_s)
        # the search ranks by the best repeat: interference from other processes only ever
        # slows a run down, so the minimum is the steadiest estimate on a shared machine
        return MeasureResult(gflops(2.0 * m * self.n * self.k, t.min_s), t.min_s)


def check_fits(n: int, k: int, seq_max: int, threads: int) -> None:
    """Refuse, before allocating, a seq_max whose buffers would not fit in memory: A and C
    over every M, a split-K workspace per thread, the float64 reference of the checks and
    the float64 weights it is computed from."""
    import psutil

    need = 4 * seq_max * (k + n * (1 + threads)) + 8 * seq_max * n + 12 * n * k
    avail = psutil.virtual_memory().available
    if need > 0.8 * avail:
        raise ConfigError(f"tuning N={n} K={k} up to M={seq_max} needs about {need / 2**30:.1f} "
                          f"GiB of buffers; {avail / 2**30:.1f} GiB are available: lower --seq-max")
