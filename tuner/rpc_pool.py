"""`tune --rpc-workers N`: each round's candidates measured on N RPC servers at once.

Every worker is a process of its own holding one `RpcMeasure` (tuner/rpc_measure.py), with
its own session on one server: the workers build their candidates side by side and their
servers time them side by side. A process and not a thread, because a call stuck in TVM's
RPC client cannot be stopped from Python, but its process can be killed.

The pool lives for the whole tune, and `shape(n, k, pack_n)` moves it from one GEMM shape
to the next: a worker keeps its server, so a server lost stays lost, and no shape waits for
a session. A worker whose server fails, or that stops answering, is stopped and its candidate
goes to another worker; the tune goes on while one is left. No worker waits for a second server:
one that did would queue at the tracker behind the other workers' sessions, which are only
given back when the tune ends.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait

from sandwich.compiler.gemm_dsl import build_gemm_dsl
from sandwich.compiler.rpc import RemoteFailure
from sandwich.compiler.target import CpuInfo
from sandwich.errors import BuildError, ConfigError
from sandwich.tuner.measure import MeasureResult
from sandwich.tuner.rpc_measure import RpcMeasure, RpcTarget
from sandwich.types import KernelSchedule
from sandwich.workers import one_line, spawn_worker, stop_worker


def _measure_for(spec: dict, last: RpcMeasure | None) -> RpcMeasure:
    """The worker's measure for `spec` (RpcMeasure's keywords): the last one while the shape
    stays, else a new one on the last one's server."""
    if last is not None and (last.n, last.k, last.pack_n) == (spec["n"], spec["k"], spec["pack_n"]):
        return last
    measure = RpcMeasure(**spec, failover=False)
    if last is not None:
        measure.take_session(last)
    return measure


def _worker_main(conn) -> None:
    """A worker: (spec, 'check' | 'time', schedule, M) in, (status, result, compile s) out,
    where status is 'ok', 'lost' (the server failed: this worker is done), 'config' or
    'error' (both end the tune)."""
    measure: RpcMeasure | None = None
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        spec, kind, schedule, m = job
        try:
            measure = _measure_for(spec, measure)
        except Exception as e:  # noqa: BLE001 - e.g. buffers that do not fit: ends the tune
            config = isinstance(e, ConfigError)
            conn.send(("config" if config else "error", str(e) if config else one_line(e), 0.0))
            return
        reply, spent = _answer(measure, kind, schedule, m)
        conn.send((*reply, spent))
        if reply[0] != "ok":
            return


def _answer(measure: RpcMeasure, kind: str, schedule: KernelSchedule, m: int):
    """One job's (status, result) and the seconds spent building for it."""
    c0 = measure.compile_seconds
    try:
        if kind == "check":
            try:
                measure.kernel(schedule)
                reply = ("ok", MeasureResult(0.0, 0.0))
            except RemoteFailure:
                raise
            except BuildError as e:  # the kernel is wrong or does not build
                reply = ("ok", MeasureResult(0.0, 0.0, error=str(e)))
        else:
            reply = ("ok", measure(schedule, m))
    except ConfigError as e:
        reply = ("config", str(e))
    except RemoteFailure as e:  # the server died, hung up or did not answer in time
        reply = ("lost", str(e))
    except Exception as e:  # noqa: BLE001 - anything else ends the tune, told in one line
        reply = ("error", one_line(e))
    return reply, measure.compile_seconds - c0


@dataclass
class _Worker:
    proc: object
    conn: object
    name: str

    def stop(self) -> None:
        stop_worker(self.proc, self.conn, None, grace_s=2)


class RpcPool:
    """The tuner's measure on `target.workers` RPC servers at once, for one GEMM shape at a
    time (the interface of RpcMeasure, plus `many`, which the search hands whole rounds)."""

    def __init__(self, target: RpcTarget, *, cpu: CpuInfo, threads: int, seq_max: int,
                 fingerprint: str, seed: int = 0, hang_s: float = 0.0,
                 log: Callable[[str], None] | None = None) -> None:
        if target.workers < 1:
            raise ConfigError(f"--rpc-workers must be >= 1, got {target.workers}")
        self.target, self.cpu, self.threads, self.seq_max = target, cpu, threads, seq_max
        self.fingerprint, self.seed, self.log = fingerprint, seed, log
        # a worker silent this long is stopped: two calls and a build
        self.hang_s = hang_s or 2 * target.call_timeout_s + 60.0
        self.spec: dict | None = None  # RpcMeasure's keywords for the shape being tuned
        self._pool: list[_Worker] = []
        for i in range(target.workers):
            proc, conn = spawn_worker(_worker_main, (), threads=threads, name=f"sandwichc-rpc-{i}")
            self._pool.append(_Worker(proc, conn, f"RPC worker {i}"))

    def shape(self, n: int, k: int, pack_n: int, *, repeat: int = 5,
              min_repeat_ms: int = 10) -> RpcPool:
        """Measure this (N, K) from now on, each candidate timed `repeat` times for at least
        `min_repeat_ms` (the budget's); the per-shape counts start again."""
        self.spec = dict(cpu=self.cpu, threads=self.threads, n=n, k=k, pack_n=pack_n,
                         seq_max=self.seq_max, target=self.target, fingerprint=self.fingerprint,
                         seed=self.seed, repeat=repeat, min_repeat_ms=min_repeat_ms)
        self.compile_seconds, self.retries = 0.0, 0
        self.failed: dict[KernelSchedule, str] = {}
        self.verified: set[KernelSchedule] = set()
        self.kernels: dict[KernelSchedule, object] = {}
        return self

    def close(self) -> None:
        for w in self._pool:
            w.stop()
        self._pool = []

    def __enter__(self) -> RpcPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the measure interface -----------------------------------------------------------
    def __call__(self, schedule: KernelSchedule, m: int) -> MeasureResult:
        return self.many([(schedule, m)])[0]

    def many(self, items: list[tuple[KernelSchedule, int]]) -> list[MeasureResult]:
        results = self._run([("time", s, m) for s, m in items])
        for (s, _), r in zip(items, results, strict=True):
            if r.ok:
                self.verified.add(s)
            elif r.error:
                self.failed.setdefault(s, r.error)
        return results

    def kernel(self, schedule: KernelSchedule):
        """The executable, built here for the kernel cache once a server has checked it."""
        if schedule not in self.verified and schedule not in self.failed:
            (res,) = self._run([("check", schedule, 0)])
            if res.error:
                self.failed[schedule] = res.error
            else:
                self.verified.add(schedule)
        if schedule in self.failed:
            raise BuildError(self.failed[schedule])
        fam = schedule.family()
        if fam not in self.kernels:
            t0 = time.perf_counter()
            try:
                self.kernels[fam] = build_gemm_dsl(schedule, n=self.spec["n"], k=self.spec["k"],
                                                   cpu=self.cpu, threads=self.threads)
            finally:
                self.compile_seconds += time.perf_counter() - t0
        return self.kernels[fam]

    # -- dispatch ------------------------------------------------------------------------
    def _run(self, jobs: list[tuple]) -> list[MeasureResult]:
        """Each job on the next free worker; a lost worker's job goes to another."""
        if self.spec is None:
            raise ConfigError("RpcPool: call shape(n, k, pack_n) before measuring")
        jobs = [(self.spec, *job) for job in jobs]
        results: list[MeasureResult | None] = [None] * len(jobs)
        queue = deque(range(len(jobs)))
        busy: dict[int, tuple[_Worker, int, float]] = {}  # id(worker) -> its job, since
        while queue or busy:
            for w in self._pool:
                if queue and id(w) not in busy:
                    i = queue.popleft()
                    busy[id(w)] = (w, i, time.monotonic())
                    try:
                        w.conn.send(jobs[i])
                    except (OSError, ValueError):
                        pass  # its process is gone: the pipe reads as closed below
            ready = wait([w.conn for w, _, _ in busy.values()], timeout=1.0)
            for key, (w, i, since) in list(busy.items()):
                if w.conn in ready:
                    try:
                        status, payload, compile_s = w.conn.recv()
                    except (EOFError, OSError):
                        status, payload, compile_s = "lost", "its process ended", 0.0
                elif time.monotonic() - since > self.hang_s:
                    status, payload, compile_s = "lost", f"no answer in {self.hang_s:.0f} s", 0.0
                else:
                    continue
                del busy[key]
                self.compile_seconds += compile_s
                if status == "ok":
                    results[i] = payload
                    continue
                if status in ("config", "error"):
                    self.close()  # the other workers' answers are no longer awaited
                    raise (ConfigError if status == "config" else BuildError)(payload)
                queue.appendleft(i)
                self._lose(w, payload)
        return results  # type: ignore[return-value]

    def _lose(self, w: _Worker, why: str) -> None:
        """Stop a worker whose server failed; its candidate runs again on another."""
        w.stop()
        self._pool.remove(w)
        self.retries += 1
        if not self._pool:
            raise BuildError(f"RPC: no server is left to measure on ({w.name}: {why})")
        if self.log:
            self.log(f"{w.name} stopped ({why}); measuring on {len(self._pool)} server(s)")
