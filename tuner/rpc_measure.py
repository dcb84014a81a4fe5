"""Measuring candidates on TVM RPC servers: the tuner's measure, with the kernels built here
and checked and timed on servers of the same target found through TVM's tracker.

Each kernel is checked against numpy on the server before it is timed (the server's
output comes back), as the local measure does. A server that fails or stops answering
within `call_timeout_s` is dropped and the call runs again on another server of the key;
the tune goes on while one answers. Records land in the same database, keyed by the
fingerprint every server must report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sandwich.compiler.gemm_dsl import build_gemm_dsl
from sandwich.compiler.gemm_template import slice_args
from sandwich.compiler.rpc import (
    RemoteFailure,
    RemoteSession,
    TrackerAddress,
    remote_error,
    servers_under,
)
from sandwich.compiler.target import CpuInfo
from sandwich.errors import BuildError, ConfigError
from sandwich.tuner.measure import MeasureResult
from sandwich.tuner.reference import ReferenceRows
from sandwich.tuner.streaming import from_dram, llc_bytes, rotation_copies
from sandwich.tuner.timing import gflops
from sandwich.tuner.tvm_measure import check_ms, random_problem, result_error
from sandwich.types import KernelSchedule


@dataclass(frozen=True)
class RpcTarget:
    """Where candidates are measured: a tracker, the key of its servers, how long a call may
    take, and on how many of the servers at once (tuner/rpc_pool.py)."""

    tracker: TrackerAddress
    key: str
    call_timeout_s: float = 120.0
    workers: int = 1

    def check(self, fingerprint: str) -> int:
        """Fail before tuning when the tracker is down, the key has no server, or a server
        is of another target: one line each. Returns how many servers the key has."""
        servers = servers_under(self.tracker, self.key)
        if servers == 0:
            raise ConfigError(f"RPC tracker {self.tracker} has no server under key {self.key!r}; "
                              f"start one with `sandwichc rpc-server --tracker {self.tracker} "
                              f"--key {self.key}`")
        session = RemoteSession(self.tracker, self.key)
        _check_fingerprint(session, fingerprint, self)
        return servers


def _check_fingerprint(session: RemoteSession, fingerprint: str, target: RpcTarget) -> None:
    got = session.fingerprint()
    if got != fingerprint:
        what = (f"reports target {got}" if got else
                "is a plain TVM server (start servers with `sandwichc rpc-server`)")
        raise ConfigError(f"RPC server under key {target.key!r} {what}; this tune builds for "
                          f"{fingerprint}: kernels measured there would not be this target's")


def _call_with_timeout(fn: Callable[[], object], timeout_s: float):
    """Run `fn` on a daemon thread; a call that does not return in time is abandoned (a
    hung server's session is then dropped, not waited for)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"no answer in {timeout_s:.0f} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@dataclass
class _Remote:
    """One server's session and what was uploaded to it for this (N, K)."""

    session: RemoteSession
    weights: object = None
    rows: dict[int, tuple] = field(default_factory=dict)  # M -> (A, C)
    workspaces: dict[tuple[int, int], object] = field(default_factory=dict)  # (M, t_k) -> WS


@dataclass
class RpcMeasure:
    """The tuner's measure for one (N, K) over RPC (the interface of TvmMeasure)."""

    cpu: CpuInfo
    threads: int
    n: int
    k: int
    pack_n: int
    seq_max: int
    target: RpcTarget
    fingerprint: str
    seed: int = 0
    repeat: int = 5
    min_repeat_ms: int = 10
    stream_max_m: int = 8
    stream_passes: int = 3
    max_copies: int = 1024
    llc_bytes: int = field(default_factory=llc_bytes)  # read once, as TvmMeasure reads it
    failover: bool = True  # a failed server's call runs again on another (False: raise at once)
    compile_seconds: float = 0.0
    remote_seconds: float = 0.0
    retries: int = 0
    kernels: dict[KernelSchedule, object] = field(default_factory=dict)
    failed: dict[KernelSchedule, str] = field(default_factory=dict)
    verified: set[KernelSchedule] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.w, self.wp, self.a = random_problem(self.n, self.k, self.pack_n, self.seq_max,
                                                 threads=1, seed=self.seed)
        self.reference = ReferenceRows(self.a, self.w)  # fp32 weights only (tune refuses others)
        self._remote: _Remote | None = None

    # -- sessions ------------------------------------------------------------------------
    def take_session(self, other: RpcMeasure) -> None:
        """Go on with `other`'s server (a worker moving on to the next shape keeps its
        server, and the tracker need not find it another)."""
        if other._remote is not None:
            self._remote = _Remote(other._remote.session)

    def _session(self) -> _Remote:
        if self._remote is None:
            t = self.target
            try:  # the tracker queues a request while every server of the key is in a session
                session = _call_with_timeout(lambda: RemoteSession(t.tracker, t.key), t.call_timeout_s)
            except TimeoutError:
                why = f"RPC: no server under key {t.key!r} came free in {t.call_timeout_s:.0f} s"
                raise (ConfigError(why) if self.failover else RemoteFailure(why)) from None
            _check_fingerprint(session, self.fingerprint, self.target)
            self._remote = _Remote(session)
        return self._remote

    def _on_server(self, fn: Callable[[_Remote], object]):
        """Run `fn` on the current server; on a failure or a timeout, drop that server and
        run it again on another one of the key, for up to `call_timeout_s` more."""
        deadline = None
        while True:
            try:
                remote = self._session()
            except ConfigError:
                if deadline is None or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # the tracker has not yet seen the dead server go
                continue
            t0 = time.perf_counter()
            try:
                return _call_with_timeout(lambda r=remote: fn(r), self.target.call_timeout_s)
            except (ConfigError, BuildError):
                raise
            except Exception as e:  # a dead or hung server: TVMError, TimeoutError, OSError
                self._remote = None
                if not self.failover:
                    raise remote_error(e) from None
                self.retries += 1
                deadline = deadline or time.monotonic() + self.target.call_timeout_s
                if time.monotonic() > deadline:
                    raise remote_error(e) from None
            finally:
                self.remote_seconds += time.perf_counter() - t0

    def _args(self, remote: _Remote, schedule: KernelSchedule, m: int, weights) -> list:
        """Remote A[:M] and C[:M] per M, a split-K workspace per (M, t_k), kept per session."""
        s, t_k = remote.session, schedule.polymerization.t_k
        if m not in remote.rows:
            remote.rows[m] = (s.tensor(self.a[:m]), s.tensor(np.zeros((m, self.n), np.float32)))
        a, c = remote.rows[m]
        if t_k > 1 and (m, t_k) not in remote.workspaces:
            remote.workspaces[m, t_k] = s.tensor(np.zeros((t_k * m, self.n), np.float32))
        ws = [remote.workspaces[m, t_k]] if t_k > 1 else []
        return [a, weights, c, *ws, *slice_args(schedule)]

    # -- the measure interface -----------------------------------------------------------
    def kernel(self, schedule: KernelSchedule):
        """Build here (once per family), check on a server (once per slice); the executable."""
        if schedule in self.failed:
            raise BuildError(self.failed[schedule])
        fam = schedule.family()
        if fam not in self.kernels:
            t0 = time.perf_counter()
            try:
                self.kernels[fam] = build_gemm_dsl(schedule, n=self.n, k=self.k, cpu=self.cpu,
                                                   threads=self.threads)
            except (BuildError, ConfigError) as e:
                self.failed[schedule] = str(e)
                raise BuildError(str(e)) from None
            finally:
                self.compile_seconds += time.perf_counter() - t0
        if schedule not in self.verified:
            err = self._on_server(lambda r: self._check(r, schedule))
            if err:
                self.failed[schedule] = err
                raise BuildError(err)
            self.verified.add(schedule)
        return self.kernels[fam]

    def _module(self, remote: _Remote, schedule: KernelSchedule):
        fam = schedule.family()
        if remote.weights is None:
            remote.weights = remote.session.tensor(self.wp[0])  # fp32: one array
        # N and K are built in: a session kept across shapes (tuner/rpc_pool.py) must not
        # load one shape's kernel for another's
        return remote.session.load(f"{fam.key()}_n{self.n}_k{self.k}", self.kernels[fam])

    def _check(self, remote: _Remote, schedule: KernelSchedule) -> str:
        module = self._module(remote, schedule)
        for m in check_ms(schedule, self.seq_max):
            args = self._args(remote, schedule, m, remote.weights)
            remote.session.run(module, args)
            err = result_error(args[2].numpy(), self.reference(m), schedule,
                               where=" on the RPC server")
            if err:
                return err
        return ""

    def _time(self, remote: _Remote, schedule: KernelSchedule, m: int) -> float:
        module = self._module(remote, schedule)
        nbytes = sum(x.nbytes for x in self.wp)
        if not from_dram(m, nbytes, self.llc_bytes, skinny_m=self.stream_max_m):
            return remote.session.best_seconds(module, self._args(remote, schedule, m, remote.weights),
                                               min_repeat_ms=self.min_repeat_ms, repeat=self.repeat)
        # decode, and large weights at any M: streamed from DRAM, as the local measure times
        # them, cycled over copies of the weights (together rotation_bytes) by the server itself;
        # past decode's M one pass over the copies (each call is long)
        copies = min(self.max_copies, rotation_copies(nbytes, self.llc_bytes))
        passes = self.stream_passes if m <= self.stream_max_m else 1
        return remote.session.streamed_seconds(module, self._args(remote, schedule, m, remote.weights),
                                               copies=copies, passes=passes)

    def __call__(self, schedule: KernelSchedule, m: int) -> MeasureResult:
        try:
            self.kernel(schedule)
        except RemoteFailure:
            raise  # the server's failure, not the candidate's
        except BuildError as e:
            return MeasureResult(0.0, 0.0, error=str(e))
        seconds = self._on_server(lambda r: self._time(r, schedule, m))
        return MeasureResult(gflops(2.0 * m * self.n * self.k, seconds), seconds)
