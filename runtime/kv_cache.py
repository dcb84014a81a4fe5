"""The permanent KV cache (eLLM): one contiguous tensor per layer at (max_seq, max_batch).

Layer l holds K and V as `kv[l][0]` and `kv[l][1]`, each [max_seq, max_batch, KVH, D] of
f32 or bf16 (`dtype`), the layout of the DSL decode-attention kernel: a sequence lives in one
batch slot for its whole life, its positions never move, and decode never allocates. Pages
that are never written are never touched (np.zeros maps them lazily), so an oversized max_seq
costs address space only.

Prefix reuse (llama.cpp's server keeps a slot's cache the same way): a freed slot keeps its
K/V and the token ids they came from until the slot is taken again. A prompt that starts
with a free slot's tokens takes that slot with those positions already filled, and only the
rest of it is prefilled: a chat's next turn resends the whole conversation. A prompt that
starts with a running sequence's tokens gets them copied into its slot (a copy costs a
fraction of a prefill): the choices of one request, a system prompt that concurrent requests
share. Reuse needs the ids of every position: a slot filled some other way (a K/V hand-off)
is never reused.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from sandwich.compiler.buffers import aligned_zeros
from sandwich.errors import ConfigError, SandwichError

COPY_MIN = 16  # positions a running slot must hold beyond a free slot's match to be copied
# element types of the cache (`--kv-cache-dtype`): bf16 halves the bytes a decode step reads
# of it and the memory it takes; a K/V value is rounded to bf16 (nearest even) when written
KV_DTYPES = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16)}


def kv_dtype(name: str) -> np.dtype:
    """The numpy dtype of a KV cache type name; ConfigError names the choices."""
    if name not in KV_DTYPES:
        raise ConfigError(f"KV cache type {name!r} is not supported (choose {', '.join(KV_DTYPES)})")
    return KV_DTYPES[name]


class CapacityError(SandwichError):
    """A request does not fit the preallocated shapes (max_seq, max_batch)."""


class KVCache:
    """Per-layer K/V tensors, per-slot lengths, and slot allocation."""

    def __init__(self, *, layers: int, max_batch: int, max_seq: int, kv_heads: int,
                 head_dim: int, reuse: bool = True, dtype: str = "f32") -> None:
        if min(layers, max_batch, max_seq, kv_heads, head_dim) < 1:
            raise CapacityError(f"KV cache sizes must be >= 1 (layers={layers}, max_batch="
                                f"{max_batch}, max_seq={max_seq}, kv_heads={kv_heads}, head_dim={head_dim})")
        self.max_batch, self.max_seq, self.dtype = max_batch, max_seq, dtype
        shape = (2, max_seq, max_batch, kv_heads, head_dim)
        self.kv = tuple(aligned_zeros(shape, kv_dtype(dtype)) for _ in range(layers))
        self.lens = np.zeros(max_batch, np.int32)  # valid positions per slot
        self.reuse = reuse  # whether alloc(prefix) may hand out a slot's kept positions
        # the token id of each position written to a slot (None: not known), kept once freed
        self.ids: list[list[int] | None] = [[] for _ in range(max_batch)]
        self.reused_tokens = 0  # prompt positions found kept or copied, in all
        self.copied_tokens = 0  # of which copied from a running sequence's slot
        self._free = list(range(max_batch))  # oldest freed first: never-used slots, in order
        self._used: set[int] = set()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.kv)

    def k(self, layer: int) -> np.ndarray:
        return self.kv[layer][0]

    def v(self, layer: int) -> np.ndarray:
        return self.kv[layer][1]

    def alloc(self, prefix: Sequence[int] = ()) -> int:
        """A free slot; CapacityError when all max_batch slots are in use. Given the prompt it
        is for (`prefix`) and with reuse on, the slot's length is the positions it already
        holds of the prompt (at most all but the last token, whose logits the prefill must
        give), from, in this order of preference:
        - a running sequence's slot that holds COPY_MIN more of the prompt than any free
          slot, its positions copied (the `n` choices of one request, concurrent requests
          that share a long system prompt);
        - the free slot whose kept tokens the prompt starts with the most, counting only
          slots it matches for at least half of what they keep (as llama.cpp's slot
          similarity: a short common opening such as a chat template's does not evict a kept
          conversation);
        - else the slot freed longest ago (0, or what it happens to hold of the prompt)."""
        self.check_free()
        limit = len(prefix) - 1 if self.reuse else 0
        slot, keep = self._free[0], 0
        for s in self._free if limit > 0 else ():
            n = _common(self.ids[s], prefix, limit)
            if n > keep and 2 * n >= len(self.ids[s] or ()):
                slot, keep = s, n
        src, copy = None, 0
        for s in sorted(self._used) if limit > 0 else ():
            n = _common(self.ids[s], prefix, limit)
            if n >= keep + COPY_MIN and n > copy:
                src, copy = s, n
        if src is not None:
            slot, keep = self._free[0], copy
        elif keep == 0 and limit > 0:
            keep = _common(self.ids[slot], prefix, limit)
        self._free.remove(slot)
        self._used.add(slot)
        self.lens[slot] = keep
        if src is not None:
            for t in self.kv:
                t[:, :keep, slot] = t[:, :keep, src]
            self.ids[slot] = list(self.ids[src][:keep])  # type: ignore[index]
            self.copied_tokens += keep
        else:
            ids = self.ids[slot]
            self.ids[slot] = ids[:keep] if ids is not None else []
        self.reused_tokens += keep
        return slot

    def check_free(self) -> None:
        """Raise unless a slot is free (changes nothing)."""
        if not self._free:
            raise CapacityError(f"all {self.max_batch} batch slots are in use (max_batch="
                                f"{self.max_batch}); wait for a request to finish or raise max_batch")

    def forget(self) -> None:
        """Drop what the free slots keep: no later prompt reuses it."""
        for s in self._free:
            self.ids[s] = []

    def free(self, slot: int) -> None:
        """Give the slot back; its positions and ids stay for a prompt that starts with them."""
        self._check_slot(slot)
        self._used.remove(slot)
        self._free.append(slot)
        ids = self.ids[slot]
        if ids is not None:
            del ids[int(self.lens[slot]):]  # what was written past the length is not valid
        self.lens[slot] = 0

    def record(self, slot: int, start: int, tokens: Sequence[int]) -> None:
        """Positions [start, start + len(tokens)) of `slot` now hold these tokens' K/V."""
        ids = self.ids[slot]
        if ids is None or start > len(ids):
            self.ids[slot] = None  # a gap: this slot's positions are no longer all known
            return
        del ids[start:]
        ids.extend(int(t) for t in tokens)

    def trim(self, slot: int, n: int) -> None:
        """Drop the slot's last n positions (drafted tokens a speculative step rejected):
        they are written over by the next tokens."""
        self._check_slot(slot)
        keep = int(self.lens[slot]) - n
        if not 0 <= n <= int(self.lens[slot]):
            raise CapacityError(f"cannot drop {n} of slot {slot}'s {int(self.lens[slot])} positions")
        self.lens[slot] = keep
        ids = self.ids[slot]
        if ids is not None:
            del ids[keep:]

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


def _common(ids: list[int] | None, prompt: Sequence[int], limit: int) -> int:
    """How many leading tokens `ids` and `prompt` share, at most `limit`."""
    if not ids:
        return 0
    n = min(len(ids), limit)
    a = np.asarray(ids[:n])
    b = np.asarray(prompt[:n])
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if len(diff) else n
