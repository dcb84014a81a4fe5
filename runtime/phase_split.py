"""Prefill on one process layout, decode on another (Sandwich: each phase its own TP degree and
cores): the executor the engine drives when the plan's two phases differ in TP degree or in
where their ranks run.

Both layouts stay alive; each loads its own shards of the weights. A prompt is prefilled by
the prefill layout (one slot, released at once), its K/V cross to the decode layout through
the shared-memory hand-off (runtime/kv_handoff.py) as each layer is produced, and the decode
layout adopts the sequence in one of its slots. The first token comes from the prefill
layout's logits; every later one from the decode layout's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from sandwich.runtime.kv_handoff import KVHandoff


class PhaseSplitExecutor:
    """`Executor`'s API (start / decode / release / kv / close) over two executors."""

    def __init__(self, prefill, decode, handoff: KVHandoff) -> None:
        self.prefill, self.decode_ex, self.handoff = prefill, decode, handoff
        self.cfg = getattr(decode, "cfg", None)

    @property
    def kv(self):
        return self.decode_ex.kv

    def start(self, prompt: Sequence[int]) -> tuple[int, np.ndarray]:
        """Prefill on the prefill layout, hand the K/V over, adopt it in a decode slot."""
        self.decode_ex.kv.check_prompt(len(prompt))
        self.decode_ex.kv.check_free()  # a decode slot is free before any work
        slot_p, logits = self.prefill.start(prompt)
        try:
            slot = self.decode_ex.adopt(len(prompt))
        finally:
            self.prefill.release(slot_p)
        return slot, logits

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        return self.decode_ex.decode(slots, tokens)

    def release(self, slot: int) -> None:
        self.decode_ex.release(slot)

    def set_prefix_cache(self, on: bool) -> None:
        for ex in (self.prefill, self.decode_ex):
            ex.set_prefix_cache(on)

    def close(self) -> None:
        for ex in (self.prefill, self.decode_ex):
            close = getattr(ex, "close", None)
            if close is not None:
                close()
        self.handoff.close()


def local_handoff(handoff: KVHandoff, role: str) -> dict:
    """The Executor keywords of a one-process (TP = 1) layout on the hand-off."""
    if role == "write":
        return {"kv_hook": handoff.writer(0, 1)}
    return {"kv_source": functools.partial(handoff.read_into, rank=0, tp=1)}
