"""Sum-all-reduce of float32 arrays among tensor-parallel processes over one shared-memory
segment, with the rank-shifted circular writing of Sandwich §7.2.

The array is cut into `world` blocks, each a whole number of 64-byte cache lines; in step s
rank r folds its block (r + s) % world into the shared accumulator, so at any moment every
rank writes a different block (no waiting on a lock, no false sharing), and after the last
step every rank copies the whole sum back. Steps are separated by a barrier made of per-rank
sequence counters, each on its own cache line (x86 stores are seen in order, so a counter is
published after the data written before it); a waiting rank sleeps on a futex. The segment is allocated once at the maximum
size; accumulators alternate between two halves so a call never waits for the previous
call's copy-back.
"""

from __future__ import annotations

import mmap
import os
import secrets
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sandwich.errors import SandwichError, ShapeError
from sandwich.runtime import futex

LINE = 64  # bytes of a cache line
LINE_F32 = LINE // 4
SPIN_MIN, SPIN_MAX = 4, 256  # busy polls (~1 us each) before sleeping, adapted per barrier:
# a peer on its own core arrives within a few us (spin pays); a peer sharing this core cannot
# arrive while we spin (on a loaded 2-core machine 50 polls cost 200 us per all-reduce, 5 cost 60)
SLEEP_S = 5e-5  # poll period where no futex exists
CHECK_S = 0.01  # how often a waiting rank checks the abort flag and its peers' health


class AllReduceError(SandwichError):
    """A peer died, aborted or stopped answering: the tensor-parallel group is broken."""


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class SegmentSpec:
    """What a rank needs to map the segment (picklable, sent to worker processes)."""

    path: str
    world: int
    capacity: int  # floats per all-reduce (max tokens x hidden)
    gather: int = 0  # floats per rank in the gather region (max batch x vocab shard)

    @property
    def block(self) -> int:
        """Floats per block at full capacity: a whole number of cache lines."""
        return _round_up(-(-self.capacity // self.world), LINE_F32)

    def layout(self) -> dict[str, tuple[int, int]]:
        """(byte offset, float count) of each region; every region starts on a cache line."""
        ctrl = (self.world + 1) * LINE  # a counter line per rank, then the abort line
        acc = self.world * self.block
        part = _round_up(self.gather, LINE_F32)
        return {"acc0": (ctrl, acc), "acc1": (ctrl + 4 * acc, acc),
                "gather": (ctrl + 8 * acc, self.world * part), "end": (ctrl + 4 * (2 * acc + self.world * part), 0)}


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def new_segment(kind: str, nbytes: int) -> str:
    """A new zeroed shared-memory file of `nbytes` (mode 0600, a name no other process holds);
    its creator maps it and unlinks it when done."""
    path = os.path.join(shm_dir(), f"sandwichc-{kind}-{os.getpid()}-{secrets.token_hex(6)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)  # pages appear as they are written
    except BaseException:
        os.close(fd)
        unlink_quietly(path)
        raise
    os.close(fd)
    return path


class ShmAllReduce:
    """One rank's handle on the segment: `comm(x)` sums x across ranks in place.

    Rank 0 creates the segment (`create`), the others `attach` to its spec; every rank must
    make the same sequence of calls with arrays of the same size."""

    def __init__(self, spec: SegmentSpec, rank: int, *, timeout: float = 60.0,
                 alive: Callable[[], str | None] | None = None, owner: bool = False) -> None:
        if not 0 <= rank < spec.world:
            raise ShapeError(f"rank {rank} is outside the world of {spec.world} ranks")
        self.spec, self.rank, self.world, self.timeout = spec, rank, spec.world, timeout
        self.alive = alive  # returns why a peer is gone, or None; polled while waiting
        fd = os.open(spec.path, os.O_RDWR)
        try:
            size = spec.layout()["end"][0]
            if os.fstat(fd).st_size != size:
                raise AllReduceError(f"shared segment {spec.path} has {os.fstat(fd).st_size} bytes, "
                                     f"expected {size}; ranks disagree on its shape")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        lay = spec.layout()
        self._ctr = np.ndarray((self.world,), np.int64, buffer=self._mm, offset=0, strides=(LINE,))
        base = np.frombuffer(self._mm, np.uint8, count=1).ctypes.data
        self._addrs = [base + r * LINE for r in range(self.world)]  # futex words (low halves)
        self._abort = np.ndarray((1,), np.int64, buffer=self._mm, offset=self.world * LINE)
        self._acc = tuple(np.ndarray((lay[k][1],), np.float32, buffer=self._mm, offset=lay[k][0])
                          for k in ("acc0", "acc1"))
        off, n = lay["gather"]
        self._gather = np.ndarray((n,), np.float32, buffer=self._mm, offset=off)
        self._epoch = 0
        self._spin = SPIN_MIN
        self._calls = 0
        self._broken = ""
        self._finalizer = weakref.finalize(self, unlink_quietly, spec.path) if owner else None

    @classmethod
    def create(cls, world: int, capacity: int, *, gather: int = 0, timeout: float = 60.0,
               alive: Callable[[], str | None] | None = None) -> ShmAllReduce:
        """Rank 0: make a zeroed segment (mode 0600) and map it; it is unlinked on close."""
        if world < 1 or capacity < 1 or gather < 0:
            raise ShapeError(f"all-reduce needs world >= 1 and capacity >= 1, got world={world}, "
                             f"capacity={capacity}, gather={gather}")
        size = SegmentSpec("", world, capacity, gather).layout()["end"][0]
        spec = SegmentSpec(new_segment("tp", size), world, capacity, gather)
        try:
            return cls(spec, 0, timeout=timeout, alive=alive, owner=True)
        except BaseException:
            unlink_quietly(spec.path)
            raise

    # -- synchronisation -----------------------------------------------------------------
    def barrier(self) -> None:
        """Publish this rank's next sequence number and wait until every rank has reached it:
        a short spin, then sleep on a late peer's counter (futex), checking health every
        CHECK_S."""
        if self._broken:
            raise AllReduceError(self._broken)
        self._epoch += 1
        epoch, ctr = self._epoch, self._ctr
        ctr[self.rank] = epoch
        if futex.AVAILABLE:
            futex.wake(self._addrs[self.rank])
        for _ in range(self._spin):
            if ctr.min() >= epoch:
                self._spin = min(2 * self._spin, SPIN_MAX)
                return
        self._spin = max(self._spin // 2, SPIN_MIN)
        t0 = last = time.monotonic()
        while True:
            # one read of every counter: with two or more ranks late, reading the latest one
            # again after argmin could see it arrive while another is still behind
            snap = ctr.copy()
            j = int(snap.argmin())
            seen = int(snap[j])
            if seen >= epoch:
                return
            if futex.AVAILABLE:
                futex.wait(self._addrs[j], seen, CHECK_S)
            else:
                time.sleep(SLEEP_S)
            now = time.monotonic()
            if now - last >= CHECK_S:
                last = now
                self._check(t0, now, epoch)

    def _check(self, t0: float, now: float, epoch: int) -> None:
        problem = ""
        if self._abort[0]:
            problem = f"rank {int(self._abort[0]) - 1} aborted the tensor-parallel group"
        elif self.alive is not None and (why := self.alive()):
            problem = why
        elif now - t0 > self.timeout:
            late = [j for j in range(self.world) if self._ctr[j] < epoch]
            problem = (f"rank {self.rank} waited {self.timeout:.0f} s at a barrier for ranks "
                       f"{late}; they hang or are starved of CPU")
        if problem:
            self._broken = problem
            raise AllReduceError(problem)

    def abort(self) -> None:
        """Tell every peer waiting at a barrier to give up (called when this rank fails)."""
        self._abort[0] = self.rank + 1
        self._broken = self._broken or f"rank {self.rank} aborted"

    # -- collectives ---------------------------------------------------------------------
    def __call__(self, x: np.ndarray) -> None:
        """x += every other rank's x (float32, C-contiguous, same size on every rank)."""
        if self.world == 1:
            return
        flat = self._flat(x, self.spec.capacity, "all-reduce")
        n, w = flat.size, self.world
        bs = _round_up(-(-n // w), LINE_F32)  # adaptive block: shrinks with the call's size
        acc = self._acc[self._calls & 1]
        self._calls += 1
        for s in range(w):
            b = (self.rank + s) % w  # the rank shift: block b has one writer per step
            lo, hi = min(b * bs, n), min((b + 1) * bs, n)
            if hi > lo:
                if s == 0:
                    np.copyto(acc[lo:hi], flat[lo:hi])
                else:
                    np.add(acc[lo:hi], flat[lo:hi], out=acc[lo:hi])
            self.barrier()
        np.copyto(flat, acc[:n])

    def gather(self, part: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
        """Concatenate every rank's part (B, n) along columns into out (B, world * n) on the
        rank that passes `out` (the others pass None)."""
        flat = self._flat(part, self.spec.gather, "gather")
        if self.world == 1:
            if out is not None:
                np.copyto(out, part)
            return out
        stride = _round_up(self.spec.gather, LINE_F32)
        self.barrier()  # the reader has finished with the previous gather
        np.copyto(self._gather[self.rank * stride: self.rank * stride + flat.size], flat)
        self.barrier()
        if out is None:
            return None
        b, n = part.shape
        if out.shape != (b, self.world * n):
            raise ShapeError(f"gather out must have shape ({b}, {self.world * n}), got {out.shape}")
        src = np.lib.stride_tricks.as_strided(self._gather, (self.world, b, n), (stride * 4, n * 4, 4))
        np.copyto(out.reshape(b, self.world, n), src.transpose(1, 0, 2))
        return out

    def _flat(self, x: np.ndarray, cap: int, what: str) -> np.ndarray:
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            raise ShapeError(f"{what} needs a C-contiguous float32 array, got {x.dtype}")
        if x.size > cap:
            raise ShapeError(f"{what} of {x.size} floats exceeds the segment's {cap}; "
                             f"create it with a larger capacity")
        return x.reshape(-1)

    def close(self) -> None:
        """Unmap (when no view is left) and, on rank 0, unlink the segment."""
        self._ctr = self._abort = self._gather = None  # type: ignore[assignment]
        self._acc = ()
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view: the mapping goes with it
            pass
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> ShmAllReduce:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
