"""Chunked prefill (Sarathi; the baseline of 002): each iteration one chunk of at most C
prompt tokens runs through every layer beside the running decodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandwich.errors import ConfigError
from sandwich.runtime.prefill_work import PrefillWork
from sandwich.runtime.schedule.hybrid import HybridSchedule

if TYPE_CHECKING:
    from sandwich.runtime.engine import Engine


class ChunkedSchedule(HybridSchedule):
    """`chunked:C`. A small C bounds the decodes' inter-token gap; every chunk reads every
    weight (and every routed expert) once more."""

    def __init__(self, chunk: int) -> None:
        super().__init__()
        if chunk < 1:
            raise ConfigError(f"chunked:C needs a chunk of >= 1 tokens, got {chunk}")
        self.chunk = chunk
        self.name = f"chunked:{chunk}"

    def work(self, engine: Engine, prompt: tuple[int, ...]) -> PrefillWork:
        n = min(self.chunk, self.room(engine), len(prompt) - self.pos)
        return PrefillWork(self.slot, self.pos, prompt[self.pos: self.pos + n])

    def advance(self, work: PrefillWork) -> bool:
        self.pos += len(work.tokens)
        return self.pos == len(self._seq.req.prompt)  # type: ignore[union-attr]
