"""Prefill and decode run under different ServiceConfigs (Sandwich §3.1): switch the CPU set
and TVM's thread count when the engine changes phase.

TVM 0.27 exposes `runtime.config_threadpool(mode, nthreads, cpus)`: mode -3 pins every pool
worker and the calling thread to `cpus` and uses `nthreads` workers. The pool is created once
with TVM_NUM_THREADS workers and never grows, so a phase can use at most that many threads:
start the process with the larger of the two phases' thread counts (`--threads`; the CLI sets
TVM_NUM_THREADS from it, and importing the package sets it to the process's CPUs where it is
unset: TVM's own default is half the CPUs on x86). Every thread of the process (OpenBLAS's
included) is re-pinned with sched_setaffinity. A phase whose plan equals the current one
costs nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandwich.compiler.threadpool import tvm_pool
from sandwich.errors import ConfigError
from sandwich.types import ServiceConfig

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class PhasePlan:
    """The CPUs and thread count of one phase in this process."""

    cpus: tuple[int, ...]
    threads: int


def process_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_from_service_config(cfg: ServiceConfig) -> PhasePlan:
    """The in-process engine runs one rank: a TP > 1 config belongs to the TP executor."""
    if cfg.tp != 1:
        raise ConfigError(f"{cfg.phase} ServiceConfig has {cfg.tp} processes (TP={cfg.tp}); the "
                          f"single-process engine needs a TP=1 config (pick one with one process)")
    proc = cfg.processes[0]
    return PhasePlan(cpus=tuple(sorted(proc.cpus)), threads=cfg.threads_per_process)


def load_service_config(path: str | Path, phase: str) -> ServiceConfig:
    """A ServiceConfig JSON, or the top-ranked `phase` entry of a `topo search` JSON
    (results/topology_<machine>.json: {"prefill": [...], "decode": [...]}, best first)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{p}: cannot read a service config ({e})") from None
    if isinstance(data, dict) and phase in data and isinstance(data[phase], list):
        if not data[phase]:
            raise ConfigError(f"{p}: the '{phase}' list is empty")
        data = data[phase][0]
    try:
        cfg = ServiceConfig.from_dict(data)
        _ = [int(c) for q in cfg.processes for c in q.cpus] + [int(cfg.threads_per_process)]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{p}: not a ServiceConfig or `topo search` JSON ({e})") from None
    if not cfg.processes:
        raise ConfigError(f"{p}: the ServiceConfig lists no processes")
    return cfg


def _pin_all_threads(cpus: tuple[int, ...]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that just exited
            pass


class PhaseSwitcher:
    """Applies a phase's plan when the engine enters it; counts the transitions."""

    def __init__(self, prefill: PhasePlan | ServiceConfig | None = None,
                 decode: PhasePlan | ServiceConfig | None = None, *,
                 pin: Callable[[tuple[int, ...]], None] = _pin_all_threads,
                 pool: tuple[Callable[[int, list[str]], None], int] | None | str = "tvm") -> None:
        cpus = process_cpus()  # before TVM's pool starts: with one worker it pins this thread
        self._pool = tvm_pool() if pool == "tvm" else pool
        size = self._pool[1] if self._pool else len(cpus)
        allowed = set(cpus)
        self._initial = PhasePlan(cpus, size)  # what runs before any switch
        self.plans: dict[str, PhasePlan] = {}
        for phase, given in zip(PHASES, (prefill, decode), strict=True):
            plan = (plan_from_service_config(given) if isinstance(given, ServiceConfig)
                    else given or self._initial)
            if not plan.cpus or not set(plan.cpus) <= allowed:
                raise ConfigError(f"{phase} phase wants cpus {list(plan.cpus)}, but this process may "
                                  f"run only on {sorted(allowed)}")
            if not 1 <= plan.threads <= size:
                raise ConfigError(f"{phase} phase wants {plan.threads} threads; the thread pool has "
                                  f"{size} (start with --threads {max(plan.threads, 1)})")
            self.plans[phase] = plan
        self._pin = pin
        self.phase: str | None = None
        self.switches = 0  # transitions between phases
        self.applied = 0  # transitions that changed the CPU set or thread count
        self._current: PhasePlan | None = None

    def invalidate(self) -> None:
        """Someone else (another engine in this process) has re-pinned the threads: apply
        the next phase's plan whatever this switcher last applied."""
        self.phase, self._current = None, PhasePlan((), 0)

    def restore(self) -> None:
        """Back to every CPU of the process with the whole pool (as before the first switch)."""
        self._pin(self._initial.cpus)
        if self._pool is not None:
            self._pool[0](self._initial.threads, [str(c) for c in self._initial.cpus])
        self.phase, self._current = None, None


    @classmethod
    def default(cls) -> PhaseSwitcher:
        """Both phases on every CPU of the process with the whole pool: switching is free."""
        return cls()

    def enter(self, phase: str) -> None:
        if phase == self.phase:
            return
        if phase not in self.plans:
            raise ConfigError(f"unknown phase {phase!r} (choose {' or '.join(PHASES)})")
        if self.phase is not None:
            self.switches += 1
        self.phase = phase
        plan = self.plans[phase]
        if plan == (self._current or self._initial):
            self._current = plan
            return
        self._pin(plan.cpus)
        if self._pool is not None:
            self._pool[0](plan.threads, [str(c) for c in plan.cpus])
        self._current = plan
        self.applied += 1


def unpin_process(cpus: tuple[int, ...]) -> None:
    """Every thread of the process back on `cpus`, TVM's pool at its full size there (after
    an engine that pinned them is done)."""
    _pin_all_threads(cpus)
    pool = tvm_pool()
    if pool is not None:
        pool[0](pool[1], [str(c) for c in cpus])
