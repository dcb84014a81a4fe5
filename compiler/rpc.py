"""TVM's RPC, as sandwichc uses it: a server that reports its target fingerprint, and client
sessions found through TVM's tracker that run and time uploaded kernels.

The tracker and the plain servers are TVM's own (`python -m tvm.exec.rpc_tracker`); our
server is TVM's with two more functions: `sandwichc.fingerprint`, so a tune refuses a
server whose CPU or TVM differs from the one the kernels are built for, and
`sandwichc.time_streamed`, which times decode calls over copies of the weights on the
server (one session measures one weight, so the copies are kept for the session).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np

from sandwich.errors import BuildError, ConfigError, first_line

FINGERPRINT_FUNC = "sandwichc.fingerprint"
STREAMED_FUNC = "sandwichc.time_streamed"
_copies: dict[tuple, list] = {}  # server side: weight copies per (shape, count), per session


def _time_streamed(module, copies: int, passes: int, *args) -> float:
    """Server side: seconds per call of `main` over `copies` separate copies of the weights
    (args[1]), cycled as the local measure cycles them (weights streamed from DRAM, not
    one hot copy); the best of `passes` passes."""
    import time

    import tvm

    wp = args[1]
    key = (tuple(wp.shape), copies)
    if key not in _copies:
        _copies.clear()
        _copies[key] = [tvm.runtime.empty(wp.shape, wp.dtype, wp.device) for _ in range(copies)]
        for w in _copies[key]:
            w.copyfrom(wp)
    func, rest = module["main"], list(args)
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        for w in _copies[key]:
            rest[1] = w
            func(*rest)
        best = min(best, (time.perf_counter() - t0) / copies)
    return best


@dataclass(frozen=True)
class TrackerAddress:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> TrackerAddress:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"tracker address must be HOST:PORT, got {text!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def serve(*, host: str, port: int, port_end: int, tracker: TrackerAddress | None, key: str,
          fingerprint: str, silent: bool = True):
    """Run TVM's RPC server in this process with `sandwichc.fingerprint` registered; the
    session processes it forks inherit the function. Returns the server state (its
    `port`, and `thread`, which serves until the process ends)."""
    import tvm_ffi
    from tvm.rpc import server as tvm_server

    tvm_ffi.register_global_func(FINGERPRINT_FUNC, lambda: fingerprint, override=True)
    tvm_ffi.register_global_func(STREAMED_FUNC, _time_streamed, override=True)
    try:
        return tvm_server.PopenRPCServerState(
            host, port, port_end, tracker_addr=(tracker.host, tracker.port) if tracker else None,
            key=key, silent=silent)
    except (OSError, ValueError) as e:
        raise ConfigError(f"RPC server cannot start on {host}:{port}-{port_end}: "
                          f"{first_line(e)}") from None


def servers_under(tracker: TrackerAddress, key: str) -> int:
    """How many servers are registered with the tracker under `key`, busy or free."""
    import socket

    from tvm import rpc

    try:  # TVM's client retries a refused tracker for a minute: fail at once instead
        socket.create_connection((tracker.host, tracker.port), timeout=10).close()
    except OSError as e:
        raise ConfigError(f"RPC tracker {tracker} is unreachable: {e}") from None
    try:
        summary = rpc.connect_tracker(tracker.host, tracker.port).summary()
    except Exception as e:  # a refused or dead tracker: TVM raises RuntimeError or TVMError
        raise ConfigError(f"RPC tracker {tracker} is unreachable: {first_line(e)}") from None
    return sum(1 for s in summary.get("server_info", [])
               if str(s.get("key", "")).split(":", 1)[-1] == key)


class RemoteSession:
    """One session on one server: the kernels uploaded to it, run and timed there."""

    def __init__(self, tracker: TrackerAddress, key: str, *, priority: int = 1) -> None:
        from tvm import rpc

        try:
            self.sess = rpc.connect_tracker(tracker.host, tracker.port).request(
                key, priority=priority, session_timeout=0, max_retry=1)
        except Exception as e:
            raise ConfigError(f"no RPC server under key {key!r} at tracker {tracker}: "
                              f"{first_line(e)}") from None
        self.dev = self.sess.cpu()
        self.modules: dict[str, object] = {}

    def fingerprint(self) -> str:
        """What the server reports; a plain TVM server has no such function."""
        try:
            return str(self.sess.get_function(FINGERPRINT_FUNC)())
        except Exception:
            return ""

    def load(self, name: str, executable) -> object:
        """Upload `executable` (exported to a .so here) once per session and load it there."""
        if name not in self.modules:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, f"{name}.so")
                executable.export_library(path)
                self.sess.upload(path)
            self.modules[name] = self.sess.load_module(f"{name}.so")
        return self.modules[name]

    def tensor(self, a: np.ndarray):
        import tvm

        return tvm.runtime.tensor(np.ascontiguousarray(a), self.dev)

    def run(self, module, args: list) -> None:
        module["main"](*args)

    def best_seconds(self, module, args: list, *, min_repeat_ms: int, repeat: int) -> float:
        """The fastest repeat of TVM's remote timer (the server times itself: no network)."""
        timer = module.time_evaluator("main", self.dev, number=1, repeat=repeat,
                                      min_repeat_ms=min_repeat_ms)
        return float(min(timer(*args).results))


    def streamed_seconds(self, module, args: list, *, copies: int, passes: int) -> float:
        """Seconds per call with the weights (args[1]) rotated over `copies` copies on the
        server (our server's function; the copies stay there for the session)."""
        return float(self.sess.get_function(STREAMED_FUNC)(module, copies, passes, *args))


class RemoteFailure(BuildError):
    """The server failed, not the kernel: the server died, hung up, did not answer in time,
    or none came free. A measure never counts it against the candidate."""


def remote_error(e: BaseException) -> RemoteFailure:
    """A failed remote call as one line (the server died, hung up or raised)."""
    return RemoteFailure(f"RPC call failed: {first_line(e)}")
