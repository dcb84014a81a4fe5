"""Layered prefill (002 §4): the decoder stack is cut into G contiguous layer groups; each
iteration the new prompt goes through one group beside everyone's decode, so each layer's
weights (each routed expert) are read once per prompt instead of once per chunk."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.prefill_work import PrefillWork
from sandwich.runtime.schedule.hybrid import HybridSchedule

if TYPE_CHECKING:
    from sandwich.runtime.engine import Engine

TOKENS_PER_GROUP = 512  # 002 §4: G = max(1, ceil(L / 512)) for a prompt of L tokens


def default_groups(prompt_len: int) -> int:
    return max(1, math.ceil(prompt_len / TOKENS_PER_GROUP))


def layer_groups(n_layers: int, groups: int) -> list[tuple[int, int]]:
    """[first, end) of G contiguous groups as equal as possible (G capped at the layers)."""
    parts = np.array_split(np.arange(n_layers), min(max(groups, 1), n_layers))
    return [(int(p[0]), int(p[-1]) + 1) for p in parts]


class LayeredSchedule(HybridSchedule):
    """`layered:G` (G fixed) or `layered` (G from each prompt's length). A prompt longer than
    one forward pass holds goes through the groups in as few passes as fit."""

    def __init__(self, groups: int | None = None) -> None:
        super().__init__()
        if groups is not None and groups < 1:
            raise ConfigError(f"layered:G needs G >= 1 layer groups, got {groups}")
        self.groups = groups
        self.name = "layered" if groups is None else f"layered:{groups}"
        self._spans: list[tuple[int, int]] = []
        self._g = 0

    def started(self, prompt_len: int) -> None:
        self._spans, self._g = [], 0
        self._want = self.groups or default_groups(prompt_len)

    def work(self, engine: Engine, prompt: tuple[int, ...]) -> PrefillWork:
        if not self._spans:
            self._spans = layer_groups(engine.ex.cfg.num_hidden_layers, self._want)
        n = min(self.room(engine), len(prompt) - self.pos)
        return PrefillWork(self.slot, self.pos, prompt[self.pos: self.pos + n], self._spans[self._g])

    def advance(self, work: PrefillWork) -> bool:
        self._g += 1
        if self._g < len(self._spans):
            return False
        self._g = 0
        self.pos += len(work.tokens)
        return self.pos == len(self._seq.req.prompt)  # type: ignore[union-attr]
