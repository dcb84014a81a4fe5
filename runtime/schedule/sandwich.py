"""Sandwich's schedule (000 §3.1): a new prompt is prefilled whole under the prefill
configuration, then every running sequence decodes under the decode one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandwich.runtime.schedule.base import Schedule

if TYPE_CHECKING:
    from sandwich.runtime.engine import Engine


class SandwichSchedule(Schedule):
    """Admit waiting requests into free slots (FIFO, each prefilled whole), then one decode
    step for all: the running decodes wait while a prompt is prefilled."""

    name = "sandwich"
    scores_with = "start_scored"  # engine.prefill scores a prompt as it prefills it whole

    def step(self, engine: Engine) -> None:
        while engine.waiting and engine.free_slots > 0:
            engine.prefill(engine.waiting.popleft())
        if engine.running:
            engine.decode()
