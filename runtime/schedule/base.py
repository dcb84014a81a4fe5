"""The interface of a scheduling policy: what one engine iteration runs (002, 004)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandwich.runtime.engine import Engine


class Schedule(ABC):
    """Decides each iteration's work; the engine keeps the queue, the running sequences, the
    sampling and the results. A schedule that holds a request between iterations (a prompt
    half prefilled, a prefill on another pool) reports it through `busy` and `cancel`."""

    name = "schedule"
    # the executor method this schedule scores a prompt with (echo with logprobs), or None:
    # it cannot (its prompts are prefilled on another process)
    scores_with: str | None = None

    @abstractmethod
    def step(self, engine: Engine) -> None:
        """Run one iteration on the engine."""

    @property
    def busy(self) -> bool:
        """Whether the schedule holds a request the engine no longer lists."""
        return False

    def cancel(self, ticket: int) -> bool:
        """Drop a request the schedule holds (its client left); False if it holds none."""
        return False

    def close(self) -> None:
        """Release what the schedule owns (processes, shared memory)."""
        return None
