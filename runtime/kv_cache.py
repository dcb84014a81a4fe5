"""The permanent KV cache (eLLM): one contiguous tensor per layer at (max_seq, max_batch).

Layer l holds K and V as `kv[l][0]` and `kv[l][1]`, each [max_seq, max_batch, KVH, D], the
layout of the DSL decode-attention kernel: a sequence lives in one batch slot for its whole
life, its positions never move, and decode never allocates. Pages that are never written are
never touched (np.zeros maps them lazily), so an oversized max_seq costs address space only.
"""

from __future__ import annotations

import numpy as np

from sandwich.compiler.buffers import aligned_zeros
from sandwich.errors import SandwichError


class CapacityError(SandwichError):
    """A request does not fit the preallocated shapes (max_seq, max_batch)."""


class KVCache:
    """Per-layer K/V tensors, per-slot lengths, and slot allocation."""

    def __init__(self, *, layers: int, max_batch: int, max_seq: int, kv_heads: int,
                 head_dim: int) -> None:
        if min(layers, max_batch, max_seq, kv_heads, head_dim) < 1:
            raise CapacityError(f"KV cache sizes must be >= 1 (layers={layers}, max_batch="
                                f"{max_batch}, max_seq={max_seq}, kv_heads={kv_heads}, head_dim={head_dim})")
        self.max_batch, self.max_seq = max_batch, max_seq
        shape = (2, max_seq, max_batch, kv_heads, head_dim)
        self.kv = tuple(aligned_zeros(shape) for _ in range(layers))
        self.lens = np.zeros(max_batch, np.int32)  # valid positions per slot
        self._free = list(range(max_batch - 1, -1, -1))  # pop() hands out slot 0 first
        self._used: set[int] = set()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.kv)

    def k(self, layer: int) -> np.ndarray:
        return self.kv[layer][0]

    def v(self, layer: int) -> np.ndarray:
        return self.kv[layer][1]

    def alloc(self) -> int:
        """A free slot with length 0; CapacityError when all max_batch slots are in use."""
        if not self._free:
            raise CapacityError(f"all {self.max_batch} batch slots are in use (max_batch="
                                f"{self.max_batch}); wait for a request to finish or raise max_batch")
        slot = self._free.pop()
        self._used.add(slot)
        self.lens[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        self._used.remove(slot)
        self._free.append(slot)
        self.lens[slot] = 0

    def in_use(self) -> list[int]:
        return sorted(self._used)

    def _check_slot(self, slot: int) -> None:
        if slot not in self._used:
            raise CapacityError(f"batch slot {slot} is not allocated (slots in use: {self.in_use()})")

    def check_room(self, slot: int, n: int) -> None:
        """Raise unless `n` more positions fit in the slot (before anything is written)."""
        self._check_slot(slot)
        if self.lens[slot] + n > self.max_seq:
            raise CapacityError(f"sequence in slot {slot} would reach {int(self.lens[slot]) + n} "
                                f"tokens, beyond max_seq={self.max_seq}; shorten the prompt or "
                                f"max_new_tokens, or raise max_seq")

    def check_prompt(self, n: int) -> None:
        """A prompt of `n` tokens fits an empty slot (checked before a slot is taken)."""
        if n < 1:
            raise CapacityError("a prompt needs at least one token")
        if n > self.max_seq:
            raise CapacityError(f"prompt of {n} tokens is longer than max_seq={self.max_seq}; "
                                f"shorten it or raise max_seq")
