"""Splitwise's prompt pool (004 §IV): a process on its own cores that only prefills. Each
prompt's K/V go into one sequence of the shared hand-off segment, layer by layer as the
prefill writes them; the token pool (the engine's process) adopts them from there."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.errors import SandwichError
from sandwich.runtime.executor import Executor
from sandwich.runtime.kv_handoff import HandoffSpec, KVHandoff
from sandwich.runtime.loader import load_model
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.workers import one_line, spawn_worker, stop_worker, wait_ready


class PoolError(SandwichError):
    """The prompt pool's process failed to start or died."""


@dataclass(frozen=True)
class PoolSpec:
    """What the pool's process needs (picklable, sent once at spawn)."""

    model: str
    cache_dir: str
    cpus: tuple[int, ...]
    max_seq: int
    ops: str
    handoff: HandoffSpec
    weights: str = "fp32"  # the GEMMs' weight format
    kv_dtype: str = "f32"  # the pool's KV cache (the token pool's type: the same rounding)


@dataclass(frozen=True)
class Prefilled:
    """A prefill the pool finished: the hand-off sequence holding its K/V and its last-token
    logits, or why it failed."""

    ticket: int
    buffer: int
    logits: np.ndarray | None
    error: str | None = None


def _pool_main(conn, spec: PoolSpec) -> None:
    """Pin, load, say ready, then prefill each prompt sent until 'close' or the pipe closes."""
    os.sched_setaffinity(0, spec.cpus)
    try:
        threads = len(spec.cpus)
        seg = KVHandoff(spec.handoff)
        model = load_model(spec.model, KernelCache(spec.cache_dir), threads=threads,
                           weights=spec.weights)
        ex = Executor(model, max_batch=1, max_seq=spec.max_seq, ops=spec.ops, threads=threads,
                      kv_hook=seg.writer(0, 1), kv_dtype=spec.kv_dtype)
    except BaseException as e:
        conn.send(("error", one_line(e)))
        return
    conn.send(("ready",))
    while True:
        try:
            cmd, *args = conn.recv()
        except EOFError:  # the token pool's process is gone
            return
        if cmd == "close":
            return
        ticket, prompt, buf = args
        seg.index = buf
        try:
            slot, row = ex.start(prompt)
            ex.release(slot)
            conn.send(("done", ticket, buf, np.array(row)))
        except SandwichError as e:
            conn.send(("failed", ticket, buf, one_line(e)))


class PromptPool:
    """The parent's side: hand prompts over, collect finished prefills, free hand-off slots."""

    def __init__(self, model: str | Path, cache_dir: str | Path, *, cpus: Sequence[int],
                 layers: int, kv_heads: int, head_dim: int, max_seq: int, ops: str = "dsl",
                 buffers: int = 2, weights: str = "fp32", kv_dtype: str = "f32") -> None:
        self.handoff = KVHandoff.create(layers=layers, max_seq=max_seq, kv_heads=kv_heads,
                                        head_dim=head_dim, count=buffers, dtype=kv_dtype)
        self.free = list(range(buffers - 1, -1, -1))
        self.cpus = tuple(cpus)
        spec = PoolSpec(str(model), str(cache_dir), self.cpus, max_seq, ops, self.handoff.spec,
                        weights, kv_dtype)
        self._proc, self._conn = spawn_worker(_pool_main, (spec,), threads=len(self.cpus),
                                              name="sandwichc-prompt-pool")
        self._closed = False
        why = wait_ready(self._conn, self._proc, "a prompt pool")
        if why is not None:
            self.close()
            raise PoolError(f"the prompt pool failed to start: {why}")

    def submit(self, ticket: int, prompt: Sequence[int]) -> int:
        """Send a prompt to prefill into a free hand-off sequence; returns that sequence."""
        buf = self.free.pop()
        try:
            self._conn.send(("prefill", ticket, [int(t) for t in prompt], buf))
        except OSError:
            raise PoolError(self._gone()) from None
        return buf

    def poll(self, timeout: float = 0.0) -> list[Prefilled]:
        """Every prefill finished so far (waiting up to `timeout` s for the first)."""
        out: list[Prefilled] = []
        try:
            while self._conn.poll(timeout if not out else 0):
                kind, ticket, buf, value = self._conn.recv()
                out.append(Prefilled(ticket, buf, value if kind == "done" else None,
                                     None if kind == "done" else value))
        except (EOFError, OSError):
            raise PoolError(self._gone()) from None
        return out

    def release(self, buf: int) -> None:
        """The token pool copied the sequence: the pool may fill it again."""
        self.free.append(buf)

    def _gone(self) -> str:
        self._proc.join(timeout=1)
        return f"the prompt pool's process (pid {self._proc.pid}) exited with code {self._proc.exitcode}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        stop_worker(self._proc, self._conn, ("close",), grace_s=10)
        self.handoff.close()
