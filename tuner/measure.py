"""The measure interface the search is handed; the search never times hardware itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sandwich.types import KernelSchedule


@dataclass(frozen=True)
class MeasureResult:
    """One timed kernel run: GFLOPS at one M (0 when the kernel failed to build or was wrong)."""

    gflops: float
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.gflops > 0


Measure = Callable[[KernelSchedule, int], MeasureResult]
