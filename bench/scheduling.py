"""`sandwichc bench scheduling`: every scheduling policy on the same requests of each trace,
in one run on one engine (002, 004): latency percentiles, SLO attainment, goodput, expert
traffic, and the TTFT-TBT trade-off over chunk sizes C and layer groups G."""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from sandwich.runtime import serve_bench as sb
from sandwich.runtime import traces
from sandwich.runtime.engine import Engine, Request, Result
from sandwich.runtime.traces import TraceEntry

MIN_PROBE_REQUESTS = 8  # a goodput probe's attainment needs a few requests at any rate


@dataclass(frozen=True)
class SchedulingSettings:
    """What every policy is held to (the same for all of them in one run)."""

    slo: sb.SLO
    goodput: tuple[float, float] | None = None  # (lo, hi) req/s; None: no bisection
    goodput_steps: int = 3
    goodput_duration_s: float | None = None  # cut each probe's trace to this (None: whole)


@dataclass(frozen=True)
class PolicyRow:
    """One policy on one trace."""

    trace: str
    policy: str
    requests: int
    errors: int
    ttft_ms: sb.Percentiles
    tbt_ms: sb.Percentiles
    e2e_ms: sb.Percentiles
    attainment: float
    tokens_per_s: float
    expert_bytes_per_request: float
    ids_digest: str  # the generated ids of every request: equal digests = same tokens
    goodput: dict | None = None
    sweep: bool = False  # a point of the C/G trade-off sweep, not a headline policy

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SchedulingRun:
    machine: str
    model: str
    settings: dict
    rows: list[PolicyRow] = field(default_factory=list)
    traces: dict = field(default_factory=dict)  # name -> {requests, mean prompt, mean output}


def ids_digest(results: Sequence[Result]) -> str:
    h = hashlib.sha256()
    for r in results:
        h.update(repr((r.ids, r.finish)).encode())
    return h.hexdigest()[:12]


def _expert_bytes(engine: Engine) -> int:
    return int(getattr(engine.ex, "expert_bytes", 0) or 0)


def run_policy(engine: Engine, trace: str, policy: str, entries: list[TraceEntry],
               reqs: list[Request], settings: SchedulingSettings, *, sweep: bool = False,
               log: Callable[[str], None] = lambda m: None) -> PolicyRow:
    """Replay the trace in real time on the engine (already under `policy`)."""
    arrivals = [e.arrival_s for e in entries]
    before = _expert_bytes(engine)
    results, wall = sb.replay(engine, arrivals, reqs, clock=engine.clock)
    spent = _expert_bytes(engine) - before
    s = sb.summarize(results, duration_s=wall, slo_ttft_ms=settings.slo.ttft_ms,
                     slo_tpot_ms=settings.slo.tpot_ms, slo_tbt_ms=settings.slo.tbt_ms,
                     slo_e2e_ms=settings.slo.e2e_ms)
    good = None
    if settings.goodput and not sweep:
        good = _goodput(engine, entries, reqs, settings, log).to_dict()
    log(f"{trace} {policy}: TTFT P50 {s.ttft_ms.p50:.0f} ms, TBT P99 {s.tbt_ms.p99:.0f} ms, "
        f"attainment {s.slo_attainment:.0%}")
    return PolicyRow(trace, policy, s.requests, s.errors, s.ttft_ms, s.tbt_ms, s.e2e_ms,
                     s.slo_attainment, s.tokens_per_s, spent / max(len(reqs), 1),
                     ids_digest(results), good, sweep)


def _goodput(engine: Engine, entries: list[TraceEntry], reqs: list[Request],
             settings: SchedulingSettings, log: Callable[[str], None]) -> sb.Goodput:
    """Bisect the rate: replays of the same requests with their arrivals rescaled."""
    base = traces.mean_rate(entries)

    def attain(rate: float) -> float:
        scaled = traces.scale(entries, rate_scale=rate / base)
        n = len(scaled)
        if settings.goodput_duration_s:  # each probe replays a prefix: the run stays short
            n = max(MIN_PROBE_REQUESTS, sum(e.arrival_s <= settings.goodput_duration_s
                                            for e in scaled))
        results, _ = sb.replay(engine, [e.arrival_s for e in scaled[:n]], reqs[:n],
                               clock=engine.clock)
        a = sb.attainment(results, settings.slo)
        log(f"  goodput probe {rate:.3g} req/s -> {a:.0%}")
        return a

    lo, hi = settings.goodput  # type: ignore[misc]
    return sb.find_goodput(attain, lo=lo, hi=hi, steps=settings.goodput_steps)


def trace_summary(entries: list[TraceEntry]) -> dict:
    n = max(len(entries), 1)
    return {"requests": len(entries),
            "mean_prompt": sum(e.prompt_len for e in entries) / n,
            "mean_output": sum(e.output_len for e in entries) / n,
            "rate": traces.mean_rate(entries) if len(entries) > 1 else math.nan}


def run_scheduling(*, machine: str, model: str, workloads: dict[str, list[TraceEntry]],
                   policies: Sequence[str], sweep: Sequence[str],
                   engine_for: Callable[[str], Engine], settings: SchedulingSettings,
                   seed: int = 0, vocab_size: int,
                   log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                   ) -> SchedulingRun:
    """Every policy, then every sweep point, on each trace's same requests.
    `engine_for(policy)` returns the engine under that policy (warmed up)."""
    run = SchedulingRun(machine, model, {"slo": asdict(settings.slo), "policies": list(policies),
                                         "sweep": list(sweep), "goodput": settings.goodput,
                                         "goodput_steps": settings.goodput_steps,
                                         "goodput_duration_s": settings.goodput_duration_s})
    for name, entries in workloads.items():
        run.traces[name] = trace_summary(entries)
        reqs = traces.to_requests(entries, vocab_size=vocab_size, seed=seed)
        for policy in policies:
            run.rows.append(run_policy(engine_for(policy), name, policy, entries, reqs, settings,
                                       log=log))
        for point in sweep:
            if point not in policies:
                run.rows.append(run_policy(engine_for(point), name, point, entries, reqs,
                                           settings, sweep=True, log=log))
    return run
