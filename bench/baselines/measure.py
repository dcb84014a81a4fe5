"""Check then time a GEMM runner, with the weights repeated (in cache) or rotated (from DRAM)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from sandwich.bench.baselines import Peer
from sandwich.errors import BuildError, ConfigError
from sandwich.tuner.timing import Timing, gflops, time_callable

Runner = Callable[[np.ndarray, object], np.ndarray]  # (a, handle) -> out


@dataclass(frozen=True)
class GemmTiming:
    """One runner on one shape: the timing and the rates the benchmark reports."""

    name: str
    m: int
    n: int
    k: int
    timing: Timing
    gflops: float
    weight_gbs: float  # weight bytes read per call / time: meaningful when weights are rotated
    rotated: bool

    def pct_of_read(self, read_gbs: float) -> float:
        """Achieved weight-read rate as a percentage of the measured streaming-read GB/s."""
        return 100.0 * self.weight_gbs / read_gbs if read_gbs > 0 else 0.0

    def to_json(self) -> dict:
        return asdict(self)


def random_gemm(m: int, n: int, k: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Activations (M, K) and weights (K, N), float32 in [-1, 1)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, (m, k)).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, (k, n)).astype(np.float32)
    return a, w


def check_gemm(out: np.ndarray, a: np.ndarray, w: np.ndarray, *, rtol: float = 1e-4,
               what: str = "GEMM") -> None:
    """Raise BuildError unless out ~ a @ w (float64): |err| <= rtol * (|a| @ |w|) per element.

    The bound scales with the magnitude of the summed products, so it does not depend on
    cancellation in the reference and suits any K.
    """
    m, n = a.shape[0], w.shape[1]
    if out.shape != (m, n):
        raise BuildError(f"{what} returned shape {out.shape}, expected {(m, n)}")
    a64, w64 = a.astype(np.float64), w.astype(np.float64)
    with threadpool_limits(limits=1, user_api="blas"):  # no spinning BLAS workers left behind
        err = np.abs(out.astype(np.float64) - a64 @ w64)
        bound = rtol * (np.abs(a64) @ np.abs(w64)) + 1e-30
    if not np.all(err <= bound):
        worst = float(np.max(err / bound)) * rtol
        raise BuildError(f"{what} is wrong at {m}x{n}x{a.shape[1]}: relative error {worst:.2e} > {rtol:.0e}")


def time_rotated(run: Runner, a: np.ndarray, handles: Sequence[object], **timing_kw) -> Timing:
    """Time run(a, h) where each call takes the next handle in `handles`, round robin.

    With the handles' weights together several times larger than the LLC, each call reads
    its weights from DRAM: the decode (skinny M) regime. Warm-up covers every handle once.
    """
    if not handles:
        raise ConfigError("time_rotated needs at least one weight handle")
    cycle = itertools.cycle(handles)
    timing_kw.setdefault("warmup", len(handles))
    return time_callable(lambda: run(a, next(cycle)), **timing_kw)


def measure_runner(name: str, run: Runner, a: np.ndarray, w: np.ndarray,
                   handles: Sequence[object], *, rtol: float = 1e-4, gemms_per_call: int = 1,
                   rotated: bool | None = None, ref_a: np.ndarray | None = None,
                   **timing_kw) -> GemmTiming:
    """Check run(a, h) against numpy (first and last handle), then time it (rotated if >1 handle).

    `ref_a`: the activations the reference multiplies when the kernel rounds A first (default
    A). When one call runs `gemms_per_call` GEMMs on distinct weights, the rates are per GEMM."""
    for h in {id(h): h for h in (handles[0], handles[-1])}.values():
        check_gemm(run(a, h), a if ref_a is None else ref_a, w, rtol=rtol, what=name)
    if rotated is None:
        rotated = len(handles) > 1
    t = time_rotated(run, a, handles, **timing_kw) if len(handles) > 1 else \
        time_callable(lambda: run(a, handles[0]), **timing_kw)
    per_gemm = t.median_s / gemms_per_call
    (m, k), n = a.shape, w.shape[1]
    return GemmTiming(name=name, m=m, n=n, k=k, timing=t, gflops=gflops(2.0 * m * n * k, per_gemm),
                      weight_gbs=w.nbytes / per_gemm / 1e9, rotated=rotated)


def measure_peer(peer: Peer, a: np.ndarray, w: np.ndarray, *, copies: int = 1,
                 **timing_kw) -> GemmTiming:
    """Prepare `copies` weight copies for `peer`, check it against numpy, and time it."""
    if copies <= 1:
        return measure_runner(peer.name, peer.run, a, w, [peer.prepare(w)], **timing_kw)
    handles, per_call = peer.prepare_rotated(w, copies)
    return measure_runner(peer.name, peer.run, a, w, handles, gemms_per_call=per_call,
                          rotated=True, **timing_kw)
