"""Handing a prefilled sequence's KV cache from the prefill process layout to the decode one
(Sandwich: each phase its own TP degree and cores) through one shared-memory segment.

The segment holds `count` sequences (Splitwise's prompt pool fills one while the token pool
adopts another; `index` says which one a writer fills or a reader copies): per layer, K and V
at [max_seq, all KV heads, head_dim], of the caches' element type (f32 or bf16).
Each prefill rank writes its own heads of a layer right after computing them (layer by layer,
as they are produced: the ranks pass every layer's all-reduce only after all of them wrote),
and each decode rank then copies its own heads into a slot of its cache. The prompt is never
recomputed, and no rank needs to know how the other layout splits the heads.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sandwich.errors import ShapeError
from sandwich.runtime.allreduce import new_segment, unlink_quietly
from sandwich.runtime.kv_cache import KVCache, kv_dtype

Segment = tuple[int, int, int]  # (slot, first position, count)


@dataclass(frozen=True)
class HandoffSpec:
    """What a rank needs to map the segment (picklable)."""

    path: str
    layers: int
    max_seq: int
    kv_heads: int  # all of the model's KV heads
    head_dim: int
    count: int = 1  # sequences the segment holds
    dtype: str = "f32"  # the KV caches' element type (runtime/kv_cache.py): copies stay exact

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.count, self.layers, 2, self.max_seq, self.kv_heads, self.head_dim)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * kv_dtype(self.dtype).itemsize


class KVHandoff:
    """One process's map of the segment; `create` makes it (and unlinks it on close)."""

    def __init__(self, spec: HandoffSpec, *, owner: bool = False) -> None:
        self.spec = spec
        fd = os.open(spec.path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != spec.nbytes:
                raise ShapeError(f"KV hand-off segment {spec.path} has {os.fstat(fd).st_size} "
                                 f"bytes, expected {spec.nbytes}; the layouts disagree on its shape")
            self._mm = mmap.mmap(fd, spec.nbytes)
        finally:
            os.close(fd)
        self.kv = np.ndarray(spec.shape, kv_dtype(spec.dtype), buffer=self._mm)
        self.index = 0  # the sequence that writers fill and readers copy
        self._finalizer = weakref.finalize(self, unlink_quietly, spec.path) if owner else None

    @classmethod
    def create(cls, *, layers: int, max_seq: int, kv_heads: int, head_dim: int,
               count: int = 1, dtype: str = "f32") -> KVHandoff:
        fields = (layers, max_seq, kv_heads, head_dim, count, dtype)  # HandoffSpec's, after its path
        spec = HandoffSpec(new_segment("kv", HandoffSpec("", *fields).nbytes), *fields)
        try:
            return cls(spec, owner=True)
        except BaseException:
            unlink_quietly(spec.path)
            raise

    def heads(self, rank: int, tp: int) -> slice:
        """The KV heads rank `rank` of a tp-way layout holds (runtime/shard.py splits evenly)."""
        per = self.spec.kv_heads // tp
        return slice(rank * per, (rank + 1) * per)

    def writer(self, rank: int, tp: int) -> Callable[[int, KVCache, Sequence[Segment]], None]:
        """The executor's per-layer hook of a prefill rank: copy this layer's new K/V rows of
        its heads into the segment."""
        heads = self.heads(rank, tp)

        def write(layer: int, kv: KVCache, segments: Sequence[Segment]) -> None:
            if len(segments) != 1:  # a decode step on the prefill layout: nothing to hand off
                return
            slot, start, n = segments[0]
            if start + n > self.spec.max_seq:
                raise ShapeError(f"prefill reaches position {start + n}, beyond the hand-off "
                                 f"segment's {self.spec.max_seq}")
            dst = self.kv[self.index, layer]
            dst[0, start:start + n, heads] = kv.k(layer)[start:start + n, slot]
            dst[1, start:start + n, heads] = kv.v(layer)[start:start + n, slot]
        return write

    def read_into(self, kv: KVCache, slot: int, n: int, rank: int, tp: int) -> None:
        """Copy positions [0, n) of this rank's heads into `slot` of a decode rank's cache."""
        heads = self.heads(rank, tp)
        for layer in range(self.spec.layers):
            src = self.kv[self.index, layer]
            kv.k(layer)[:n, slot] = src[0, :n, heads]
            kv.v(layer)[:n, slot] = src[1, :n, heads]
        kv.lens[slot] = n

    def close(self) -> None:
        self.kv = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass
        if self._finalizer is not None:
            self._finalizer()
