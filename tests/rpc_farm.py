"""A TVM RPC farm on 127.0.0.1 for the RPC tests: a tracker, `sandwichc rpc-server`s, and
tunes run against them as a user runs them."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

from cli_run import TINY  # noqa: F401 - the RPC tests' model, the command-line tests' one

from sandwich.compiler.rpc import TrackerAddress, servers_under


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(*args):
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def farm():
    """A tracker and two one-thread `sandwichc rpc-server`s under key 'farm', for a test
    module's fixture (tests/test_rpc_kill.py kills servers: a farm of its own)."""
    port = free_port()
    tracker = spawn("-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                    "--port-end", str(port + 1))
    addr = TrackerAddress("127.0.0.1", port)

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    procs = [tracker]
    try:
        wait_for(up, "the tracker")
        for _ in range(2):
            procs.append(spawn("-m", "sandwich.cli", "rpc-server", "--tracker", str(addr),
                               "--key", "farm", "--threads", "1", "--port", str(free_port())))
        wait_for(lambda: servers_under(addr, "farm") == 2, "two servers at the tracker")
        yield addr, procs
    finally:
        for p in procs:
            kill(p)


def tune(config, cache, *extra, seq_max=8):
    return subprocess.run([sys.executable, "-m", "sandwich.cli", "tune", "--model", str(config),
                           "--seq-max", str(seq_max), "--budget", "tiny", "--threads", "1",
                           "--no-progress", "--cache-dir", str(cache), *extra],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TVM_NUM_THREADS": "1"})


def records(cache):
    rows = sqlite3.connect(cache / "tuning.sqlite").execute(
        "SELECT n, k, m_lo, m_hi, schedule, gflops FROM records ORDER BY n, k, m_lo").fetchall()
    return [(n, k, lo, hi, json.loads(s), g) for n, k, lo, hi, s, g in rows]


def verify(cache):
    v = subprocess.run([sys.executable, "-m", "sandwich.cli", "cache", "verify", "--numerics", "6",
                        "--seq-max", "16", "--cache-dir", str(cache)], capture_output=True, text=True,
                       timeout=300)
    assert v.returncode == 0 and "verified" in v.stdout, v.stdout + v.stderr
