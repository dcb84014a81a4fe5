"""Scheduling policies of the engine, one per module: `sandwich` (000), `chunked:C`,
`layered[:G]` (002) and `splitwise:P,D` (004); `parse_schedule` reads the CLI's spelling."""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.errors import ConfigError
from sandwich.runtime.schedule.base import Schedule
from sandwich.runtime.schedule.chunked import ChunkedSchedule
from sandwich.runtime.schedule.layered import LayeredSchedule
from sandwich.runtime.schedule.sandwich import SandwichSchedule

KINDS = ("sandwich", "chunked", "layered", "splitwise")
SPELLING = "sandwich, chunked:C, layered, layered:G or splitwise:P,D"


@dataclass(frozen=True)
class ScheduleSpec:
    """A parsed `--schedule`: the policy and its integers (C; G; P and D)."""

    kind: str
    values: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        return self.kind + (":" + ",".join(map(str, self.values)) if self.values else "")


def parse_schedule(text: str) -> ScheduleSpec:
    kind, _, rest = text.strip().partition(":")
    try:
        values = tuple(int(v) for v in rest.split(",")) if rest else ()
    except ValueError:
        values = (-1,)
    want = {"sandwich": (0,), "chunked": (1,), "layered": (0, 1), "splitwise": (2,)}.get(kind)
    if want is None or len(values) not in want or any(v < 1 for v in values):
        raise ConfigError(f"unknown schedule {text!r}: choose {SPELLING} (positive integers)")
    return ScheduleSpec(kind, values)


def make_schedule(spec: ScheduleSpec | str) -> Schedule:
    """The policy object of an in-process schedule (splitwise owns a process pool: build it
    with schedule/splitwise.py: splitwise_engine_parts)."""
    spec = parse_schedule(spec) if isinstance(spec, str) else spec
    if spec.kind == "sandwich":
        return SandwichSchedule()
    if spec.kind == "chunked":
        return ChunkedSchedule(spec.values[0])
    if spec.kind == "layered":
        return LayeredSchedule(spec.values[0] if spec.values else None)
    raise ConfigError("splitwise:P,D runs a prompt pool process: build it with "
                      "splitwise_engine_parts")


__all__ = ["ChunkedSchedule", "LayeredSchedule", "SandwichSchedule", "Schedule", "ScheduleSpec",
           "make_schedule", "parse_schedule"]
