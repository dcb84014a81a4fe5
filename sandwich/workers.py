"""Worker processes (tensor-parallel ranks, Splitwise's prompt pool, RPC measuring workers): spawned
with their own TVM thread count, answering over a pipe."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable

START_TIMEOUT_S = 600.0  # loading, packing and compiling the DSL kernels in a worker


def one_line(e: BaseException) -> str:
    """An exception as one line for a pipe message: its type and first line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def spawn_worker(target: Callable, args: tuple, *, threads: int, name: str):
    """Spawn (never fork: TVM's thread pool does not survive it) with TVM_NUM_THREADS set in
    the child's environment, which is copied when the process starts; returns (process, this
    side's pipe end). `target` gets the other end first, then `args`."""
    ctx = mp.get_context("spawn")
    old = os.environ.get("TVM_NUM_THREADS")
    try:
        os.environ["TVM_NUM_THREADS"] = str(threads)
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=target, args=(theirs, *args), daemon=True, name=name)
        proc.start()
        theirs.close()
    finally:
        if old is None:
            os.environ.pop("TVM_NUM_THREADS", None)
        else:
            os.environ["TVM_NUM_THREADS"] = old
    return proc, mine


def wait_ready(conn, proc, what: str) -> str | None:
    """None once the worker says 'ready'; else why it did not (it died, or answered an error)."""
    try:  # a worker that dies closes its pipe end: recv raises EOFError, no hang
        msg = conn.recv() if conn.poll(START_TIMEOUT_S) else ("error", "no answer")
    except (EOFError, OSError):
        proc.join(timeout=1)
        msg = ("error", f"exited with code {proc.exitcode} (a script that spawns {what} "
                        f"needs `if __name__ == '__main__':`)")
    return None if msg[0] == "ready" else str(msg[1])


def stop_worker(proc, conn, message: object, *, grace_s: float) -> None:
    """Ask a worker to leave (`message` on its pipe), give it `grace_s` to do so, then end
    it (one stuck in a call never reads the message); closes this side's pipe."""
    try:
        conn.send(message)
    except (OSError, ValueError):  # its process is gone, or the pipe already closed
        pass
    proc.join(timeout=grace_s)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)
    conn.close()
