"""What a hybrid schedule (chunked or layered prefill) asks of one iteration besides the
decodes: a part of one prompt's prefill."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sandwich.errors import ShapeError
from sandwich.runtime.kv_cache import KVCache


@dataclass(frozen=True)
class PrefillWork:
    """The part of one prompt's prefill that an iteration runs beside the decodes: positions
    [start, start + len(tokens)) of a reserved slot, through decoder layers [first, end)
    (`layers`; None = all). Layered prefill sends the same tokens once per layer group."""

    slot: int
    start: int
    tokens: tuple[int, ...]
    layers: tuple[int, int] | None = None

    def check(self, kv: KVCache, n_layers: int, *, busy: Sequence[int]) -> None:
        """Raise before anything runs if the work does not continue its slot."""
        kv.check_room(self.slot, len(self.tokens))
        if self.slot in busy:
            raise ShapeError(f"slot {self.slot} both decodes and prefills in one iteration")
        if not self.tokens or self.start != int(kv.lens[self.slot]):
            raise ShapeError(f"prefill work on slot {self.slot} must continue it at position "
                             f"{int(kv.lens[self.slot])} with >= 1 token, got {len(self.tokens)} "
                             f"tokens at {self.start}")
        lo, hi = self.layers or (0, n_layers)
        if not 0 <= lo < hi <= n_layers:
            raise ShapeError(f"layer group [{lo}, {hi}) is not within the model's {n_layers} layers")

