"""Tensor-parallel execution: rank 0 in the caller's process, ranks 1..tp-1 in spawned worker
processes, each pinned to its CPU set, joined by the shared-memory all-reduce.

`TPExecutor` has the public API of `Executor` (start / decode / release / kv / close), so the
serving engine drives either. The caller's commands reach the workers as small pipe messages
(token ids, slots); activations stay in each rank; partial sums meet in shared memory. Workers
mirror rank 0's calls exactly, so their KV slots and lengths stay identical without replies;
every user error is raised on rank 0 before anything is sent.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.compiler.buffers import aligned_zeros
from sandwich.compiler.threadpool import pin_pool
from sandwich.errors import ConfigError, SandwichError, ShapeError
from sandwich.payload import make_payload
from sandwich.runtime.allreduce import AllReduceError, SegmentSpec, ShmAllReduce
from sandwich.runtime.executor import Executor
from sandwich.runtime.kv_cache import kv_dtype as kv_dtype_of
from sandwich.runtime.kv_handoff import HandoffSpec, KVHandoff
from sandwich.runtime.loader import read_config
from sandwich.runtime.prefill_work import PrefillWork
from sandwich.runtime.shard import check_tp, load_shard, vocab_sharded
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.types import ServiceConfig
from sandwich.workers import one_line, spawn_worker, wait_ready


class TPError(SandwichError):
    """A tensor-parallel worker failed to start or died; the group must be recreated."""


@dataclass(frozen=True)
class RankSpec:
    """Everything a worker needs to build its rank (picklable, sent once at spawn)."""

    model_dir: str
    cache_dir: str
    rank: int
    tp: int
    cpus: tuple[int, ...]
    max_batch: int
    max_seq: int
    max_tokens: int
    ops: str
    segment: SegmentSpec
    timeout: float
    handoff: HandoffSpec | None = None  # a KV hand-off segment between process layouts
    handoff_role: str = ""  # "write" (prefill layout) or "read" (decode layout)
    weights: str = "fp32"  # the GEMMs' weight format
    prefix_cache: bool = True  # every rank reuses kept slots alike: they see the same calls
    kv_dtype: str = "f32"  # each rank's KV cache (its heads) in this element type


def default_cpu_sets(tp: int, cpus: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """Split this process's CPUs (or `cpus`) into tp equal consecutive sets."""
    avail = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(avail) < tp:
        raise ConfigError(f"tensor-parallel degree {tp} needs at least {tp} CPUs; this process may "
                          f"use {len(avail)} ({avail}); lower --tp or widen the CPU affinity")
    per = len(avail) // tp
    return [tuple(avail[r * per: (r + 1) * per]) for r in range(tp)]


def resolve_cpu_sets(tp: int, cpu_sets: ServiceConfig | Sequence[Sequence[int]] | None
                     ) -> list[tuple[int, ...]]:
    """CPU sets from a ServiceConfig's processes, an explicit list, or an even split."""
    if cpu_sets is None:
        return default_cpu_sets(tp)
    sets = [tuple(p.cpus) for p in cpu_sets.processes] if isinstance(cpu_sets, ServiceConfig) \
        else [tuple(int(c) for c in s) for s in cpu_sets]
    if len(sets) != tp or any(not s for s in sets):
        raise ConfigError(f"tensor-parallel degree {tp} needs {tp} non-empty CPU sets, got {sets}")
    return sets


def _build_rank(spec: RankSpec, comm: ShmAllReduce, logits: np.ndarray | None) -> Executor:
    """Load this rank's shard and wire the all-reduce (and, on rank 0, the logits gather)."""
    cache = KernelCache(spec.cache_dir)
    threads = len(spec.cpus)
    model = load_shard(spec.model_dir, cache, rank=spec.rank, tp=spec.tp, threads=threads,
                       weights=spec.weights)
    gather = None
    if vocab_sharded(model.config, spec.tp):
        def gather(part: np.ndarray) -> np.ndarray:
            out = None if logits is None else logits[: part.shape[0]]
            comm.gather(part, out)
            return part if out is None else out
    hook = source = None
    if spec.handoff is not None:
        seg = KVHandoff(spec.handoff)  # the executor's closures keep the mapping alive
        if spec.handoff_role == "write":
            hook = seg.writer(spec.rank, spec.tp)
        else:
            source = functools.partial(seg.read_into, rank=spec.rank, tp=spec.tp)
    return Executor(model, max_batch=spec.max_batch, max_seq=spec.max_seq,
                    max_tokens=spec.max_tokens, ops=spec.ops, threads=threads,
                    allreduce=comm, gather=gather, kv_hook=hook, kv_source=source,
                    prefix_cache=spec.prefix_cache, kv_dtype=spec.kv_dtype)


def _worker_main(conn, spec: RankSpec) -> None:
    """A worker's life: pin, build, say ready, then mirror rank 0's calls until 'close'."""
    os.sched_setaffinity(0, spec.cpus)
    parent = os.getppid()
    comm = ShmAllReduce(spec.segment, spec.rank, timeout=spec.timeout,
                        alive=lambda: None if os.getppid() == parent else "rank 0's process exited")
    try:
        try:
            ex = _build_rank(spec, comm, None)
        except BaseException as e:
            conn.send(("error", one_line(e)))
            return
        conn.send(("ready",))
        while True:
            try:
                cmd, *args = conn.recv()
            except EOFError:  # rank 0 is gone
                return
            if cmd == "close":
                return
            try:
                getattr(ex, cmd)(*args)  # start / decode / release / adopt, as rank 0 called them
                if cmd == "adopt":  # rank 0 may overwrite the hand-off segment once all copied
                    conn.send(("done",))
            except BaseException as e:
                conn.send(("error", one_line(e)))
                comm.abort()
                return
    finally:
        comm.close()


def _pin_caller(cpus: tuple[int, ...]) -> set[int]:
    """Pin rank 0 (the calling thread and TVM's pool) to its CPU set; returns the old mask."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    pin_pool(cpus)
    return old


class TPExecutor:
    """`Executor`'s API over tp processes; rank 0 runs in this process."""

    def __init__(self, model_dir: str | Path, cache: KernelCache | str | Path, *, tp: int,
                 max_batch: int, max_seq: int, max_tokens: int | None = None,
                 ops: str = "dsl", cpu_sets: ServiceConfig | Sequence[Sequence[int]] | None = None,
                 timeout: float = 60.0, pin_caller: bool = True,
                 handoff: HandoffSpec | None = None, handoff_role: str = "",
                 weights: str = "fp32", prefix_cache: bool = True, kv_dtype: str = "f32") -> None:
        cfg, _ = read_config(model_dir)
        kv_dtype_of(kv_dtype)  # a bad name fails here, before any worker starts
        check_tp(cfg, tp)
        make_payload(cfg, tp=tp, seq_max=1, weights=weights)  # each rank's K fits the format
        self.cfg, self.tp = cfg, tp
        sets = resolve_cpu_sets(tp, cpu_sets)
        self.max_tokens = max(max_tokens or max_seq, max_batch)
        shard_v = cfg.vocab_size // tp if vocab_sharded(cfg, tp) else 0
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list = []
        self._broken = ""
        self._closed = False
        self._old_mask: set[int] | None = None
        self.comm = ShmAllReduce.create(tp, self.max_tokens * cfg.hidden_size, gather=max_batch * shard_v,
                                        timeout=timeout, alive=self._peer_problem)
        try:
            specs = [RankSpec(str(model_dir), str(cache.dir if isinstance(cache, KernelCache) else cache),
                              r, tp, sets[r], max_batch, max_seq, self.max_tokens, ops,
                              self.comm.spec, timeout, handoff, handoff_role, weights, prefix_cache,
                              kv_dtype)
                     for r in range(tp)]
            self._spawn(specs[1:])
            if pin_caller:
                self._old_mask = _pin_caller(sets[0])
            self._logits = aligned_zeros((max_batch, cfg.vocab_size)) if shard_v else None
            self.ex = _build_rank(specs[0], self.comm, self._logits)
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    # -- processes -----------------------------------------------------------------------
    def _spawn(self, specs: Sequence[RankSpec]) -> None:
        for spec in specs:
            p, conn = spawn_worker(_worker_main, (spec,), threads=len(spec.cpus),
                                   name=f"sandwichc-tp-rank{spec.rank}")
            self._procs.append(p)
            self._conns.append(conn)

    def _wait_ready(self) -> None:
        for r, conn in enumerate(self._conns, start=1):
            why = wait_ready(conn, self._procs[r - 1], "TP workers")
            if why is not None:
                raise TPError(f"tensor-parallel rank {r} failed to start: {why}")

    def _worker_message(self, i: int) -> str:
        try:
            if self._conns[i].poll(0.5):
                msg = self._conns[i].recv()
                return f": {msg[1]}" if msg[0] == "error" else ""
        except (EOFError, OSError):
            pass
        return ""

    def _peer_problem(self) -> str | None:
        """Why a worker is gone (polled by rank 0 while it waits at a barrier)."""
        for i, p in enumerate(self._procs):
            if not p.is_alive():
                return (f"tensor-parallel rank {i + 1} (pid {p.pid}) exited with code "
                        f"{p.exitcode}{self._worker_message(i)}")
        return None

    # -- the Executor API ----------------------------------------------------------------
    @property
    def kv(self):
        return self.ex.kv

    def start(self, prompt: Sequence[int]) -> tuple[int, np.ndarray]:
        """Take a slot and prefill on every rank; returns (slot, last-token logits)."""
        prompt = [int(t) for t in prompt]
        self._usable()
        self.kv.check_prompt(len(prompt))
        self._check_ids(prompt)
        self.kv.check_free()
        self._send(("start", prompt))
        return self._run(self.ex.start, prompt)

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One token per slot on every rank; returns logits (B, vocab), a permanent buffer."""
        slots, tokens = self._check_decodes("decode", slots, tokens)
        self._send(("decode", slots, tokens))
        return self._run(self.ex.decode, slots, tokens)

    def _check_decodes(self, what: str, slots: Sequence[int],
                       tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """One token per slot, checked on rank 0 before any rank is sent the step."""
        slots, tokens = [int(s) for s in slots], [int(t) for t in tokens]
        self._usable()
        if len(slots) != len(tokens):
            raise ShapeError(f"{what} got {len(slots)} slots and {len(tokens)} tokens")
        for s in slots:
            self.kv.check_room(s, 1)
        self._check_ids(tokens)
        return slots, tokens

    def reserve(self, prompt: Sequence[int] = ()) -> int:
        """Every rank takes the same slot for a prompt prefilled over several iterations."""
        prompt = [int(t) for t in prompt]
        self._usable()
        self.kv.check_free()
        self._send(("reserve", prompt))
        return self._run(self.ex.reserve, prompt)

    def iterate(self, slots: Sequence[int], tokens: Sequence[int],
                work: PrefillWork | None = None) -> np.ndarray:
        """`Executor.iterate` on every rank (decodes beside a part of one prompt's prefill)."""
        slots, tokens = self._check_decodes("iterate", slots, tokens)
        if work is not None:
            work.check(self.kv, self.cfg.num_hidden_layers, busy=slots)
            self._check_ids(work.tokens)
        self._send(("iterate", slots, tokens, work))
        return self._run(self.ex.iterate, slots, tokens, work)

    def release(self, slot: int) -> None:
        self._usable()
        self.ex.release(int(slot))
        self._send(("release", int(slot)))

    def set_prefix_cache(self, on: bool) -> None:
        """On every rank: their slot choices must stay the same."""
        self._usable()
        self.ex.set_prefix_cache(bool(on))
        self._send(("set_prefix_cache", bool(on)))

    def adopt(self, n: int) -> int:
        """Every rank takes the same slot and copies its heads of a sequence prefilled by
        another layout from the hand-off segment; returns once all of them have."""
        n = int(n)
        self._usable()
        self.kv.check_prompt(n)
        self.kv.check_free()
        self._send(("adopt", n))
        slot = self._run(self.ex.adopt, n)
        for i, conn in enumerate(self._conns):
            try:
                msg = conn.recv() if conn.poll(self.comm.timeout) else ("error", "no answer")
            except (EOFError, OSError):
                msg = ("error", "its pipe closed")
            if msg[0] != "done":
                self._broken = f"rank {i + 1} failed to adopt a sequence: {msg[1]}"
                self.comm.abort()
                raise TPError(self._broken)
        return slot

    def _check_ids(self, ids: Sequence[int]) -> None:
        v = self.cfg.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= v):
            raise ShapeError(f"token ids must be in [0, {v}), got {min(ids)}..{max(ids)}")

    def _usable(self) -> None:
        if self._closed:
            raise TPError("this TPExecutor is closed")
        if self._broken:
            raise TPError(f"the tensor-parallel group is broken ({self._broken}); create a new one")

    def _send(self, msg: tuple) -> None:
        for i, conn in enumerate(self._conns):
            try:
                conn.send(msg)
            except OSError:
                self._broken = self._peer_problem() or f"the pipe to rank {i + 1} is closed"
                self.comm.abort()
                raise TPError(f"tensor-parallel rank {i + 1} is gone: {self._broken}") from None

    def _run(self, fn, *args):
        try:
            return fn(*args)
        except AllReduceError as e:
            problem = self._peer_problem() or str(e)
            self._broken = problem
            self.comm.abort()
            raise TPError(problem) from None
        except BaseException as e:  # rank 0 failed mid-step: release the workers from barriers
            self._broken = one_line(e)
            self.comm.abort()
            raise

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers, unlink the segment, restore the caller's CPU mask."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            try:
                conn.send(("close",))
            except OSError:
                pass
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self.comm.close()
        if self._old_mask is not None:
            os.sched_setaffinity(0, self._old_mask)
            pin_pool(sorted(self._old_mask))

    def __enter__(self) -> TPExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
