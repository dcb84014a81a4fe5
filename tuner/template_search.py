"""Greedy coordinate-descent search over any kernel template's space (DESIGN: params -> kernel).

The search sees only a `KernelTemplate` (domains + validity + build) and an injected
`measure(params) -> Outcome`; it never builds or times anything itself, so a new kernel
needs no change here and tests drive it with fake timings.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from sandwich.errors import BuildError, first_line

Params = dict[str, int]
RESTART_DRAWS = 2000  # random draws per restart before the space counts as exhausted


@dataclass(frozen=True)
class KernelTemplate:
    """A kernel template: ordered tunable domains, a validity test and params -> callable."""

    name: str
    domains: dict[str, tuple[int, ...]]
    is_valid: Callable[[Params], bool]
    build: Callable[[Params], object] | None = None  # the measure function uses it


@dataclass(frozen=True)
class Outcome:
    """One measured point: `ms` when it ran and matched the reference, else a status."""

    ms: float | None
    status: str = "ok"  # "ok" | "failed" (did not build or run) | "wrong" (bad output)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.ms is not None


@dataclass(frozen=True)
class Trial:
    index: int
    params: Params
    outcome: Outcome
    phase: str  # "start" | "move" | "restart"

    def to_json(self) -> dict:
        o = self.outcome
        return {"trial": self.index, "phase": self.phase, "params": dict(self.params),
                "ms": o.ms, "status": o.status, "error": o.error}


@dataclass
class SearchResult:
    history: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial | None:
        good = [t for t in self.history if t.outcome.ok]
        return min(good, key=lambda t: t.outcome.ms, default=None)

    def ranked(self, n: int) -> list[Trial]:
        """The n fastest correct points."""
        good = sorted((t for t in self.history if t.outcome.ok), key=lambda t: t.outcome.ms)
        return good[:n]


def _key(params: Params) -> tuple:
    return tuple(sorted(params.items()))


def start_point(template: KernelTemplate, *, max_visits: int = 20000) -> Params | None:
    """The median of every domain, else the valid point nearest to it (breadth-first over
    single-coordinate steps), else None."""
    doms = template.domains
    first = {n: len(d) // 2 for n, d in doms.items()}  # indices into the domains
    queue, seen = [first], {_key(first)}
    for idx in queue:
        point = {n: doms[n][i] for n, i in idx.items()}
        if template.is_valid(point):
            return point
        if len(queue) >= max_visits:
            break
        for n in doms:
            for step in (-1, 1):
                j = idx[n] + step
                nxt = {**idx, n: j}
                if 0 <= j < len(doms[n]) and _key(nxt) not in seen:
                    seen.add(_key(nxt))
                    queue.append(nxt)
    return None


def neighbours(template: KernelTemplate, point: Params, name: str) -> list[Params]:
    """`point` with `name` at its nearest valid value below, then above (invalid values
    are stepped over, so a constraint such as b_m % mu_m == 0 does not block a move)."""
    dom, out = template.domains[name], []
    for step in (-1, 1):
        j = dom.index(point[name]) + step
        while 0 <= j < len(dom):
            cand = {**point, name: dom[j]}
            if template.is_valid(cand):
                out.append(cand)
                break
            j += step
    return out


def _random_point(template: KernelTemplate, rng: random.Random, seen: dict) -> Params | None:
    for _ in range(RESTART_DRAWS):
        cand = {n: rng.choice(d) for n, d in template.domains.items()}
        if _key(cand) not in seen and template.is_valid(cand):
            return cand
    return None


class _Run:
    """Measures each new point once; revisits are free and invalid points never count."""

    def __init__(self, measure, trials: int, on_trial) -> None:
        self.measure, self.trials, self.on_trial = measure, trials, on_trial
        self.seen: dict[tuple, Trial] = {}
        self.result = SearchResult()

    @property
    def left(self) -> int:
        return self.trials - len(self.result.history)

    def eval(self, params: Params, phase: str) -> Trial | None:
        if _key(params) in self.seen:
            return self.seen[_key(params)]
        if self.left <= 0:
            return None
        try:
            outcome = self.measure(dict(params))
        except BuildError as e:  # a failed build is a data point; a user error still stops
            outcome = Outcome(None, "failed", first_line(e))
        trial = Trial(len(self.result.history), dict(params), outcome, phase)
        self.seen[_key(params)] = trial
        self.result.history.append(trial)
        if self.on_trial:
            self.on_trial(trial)
        return trial


def _ms(trial: Trial | None) -> float:
    return trial.outcome.ms if trial and trial.outcome.ok else float("inf")


def search(template: KernelTemplate, *, measure: Callable[[Params], Outcome], trials: int,
           seed: int = 0, on_trial: Callable[[Trial], None] | None = None) -> SearchResult:
    """Coordinate descent from the median point: move to the best of each tunable's two
    neighbours until a whole sweep gains nothing, then restart from a random valid point;
    stop after `trials` measured points or when no unvisited valid point is found."""
    rng = random.Random(seed)
    run = _Run(measure, trials, on_trial)
    point, phase = start_point(template) or _random_point(template, rng, {}), "start"
    while point is not None and run.left > 0:
        current = run.eval(point, phase)
        improved = True
        while improved and run.left > 0:
            improved = False
            for name in template.domains:
                for cand in neighbours(template, point, name):
                    t = run.eval(cand, "move")
                    if _ms(t) < _ms(current):
                        point, current, improved = cand, t, True
                if run.left <= 0:
                    break
        point, phase = _random_point(template, rng, run.seen), "restart"
    return run.result
