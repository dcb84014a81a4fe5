"""serve-bench: replay a trace in real time through the engine and summarise latency and SLOs.

A request is submitted only once its arrival time has passed (its TTFT counts from that
arrival, so time spent waiting for a slot is included). Percentiles interpolate linearly
between order statistics (numpy's default). SLO attainment is the fraction of *all* requests
meeting both SLOs; an error result meets neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from sandwich.runtime.engine import Engine, Request, Result

QUANTILES = (50, 90, 99)


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class BenchStats:
    """The serve-bench report (latencies in ms); to_dict() is the --json document."""

    requests: int
    completed: int
    errors: int
    duration_s: float
    generated_tokens: int
    tokens_per_s: float
    requests_per_s: float
    ttft_ms: Percentiles
    tpot_ms: Percentiles  # over requests with >= 2 tokens (TPOT is undefined for one)
    slo_ttft_ms: float
    slo_tpot_ms: float
    slo_attainment: float
    engine: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def percentiles(values: Sequence[float]) -> Percentiles:
    """P50/P90/P99 with linear interpolation; NaN for no values."""
    if not len(values):
        return Percentiles(float("nan"), float("nan"), float("nan"))
    q = np.percentile(np.asarray(values, dtype=np.float64), QUANTILES)
    return Percentiles(*(float(x) for x in q))


def meets_slo(r: Result, *, ttft_ms: float, tpot_ms: float) -> bool:
    return r.finish != "error" and r.ttft_ms <= ttft_ms and r.tpot_ms <= tpot_ms


def summarize(results: Sequence[Result], *, duration_s: float, slo_ttft_ms: float,
              slo_tpot_ms: float, engine: dict | None = None) -> BenchStats:
    """Percentiles, throughput over the wall time `duration_s`, and SLO attainment."""
    ok = [r for r in results if r.finish != "error"]
    tokens = sum(len(r.ids) for r in ok)
    met = sum(meets_slo(r, ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms) for r in results)
    wall = max(duration_s, 1e-9)
    return BenchStats(
        requests=len(results), completed=len(ok), errors=len(results) - len(ok),
        duration_s=duration_s, generated_tokens=tokens, tokens_per_s=tokens / wall,
        requests_per_s=len(ok) / wall,
        ttft_ms=percentiles([r.ttft_ms for r in ok]),
        tpot_ms=percentiles([r.tpot_ms for r in ok if len(r.ids) > 1]),
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
        slo_attainment=met / len(results) if results else float("nan"),
        engine=engine or {})


def replay(engine: Engine, arrivals: Sequence[float], requests: Sequence[Request], *,
           clock: Callable[[], float] = time.perf_counter,
           sleep: Callable[[float], None] = time.sleep,
           on_done: Callable[[Result], None] | None = None) -> tuple[list[Result], float]:
    """Submit each request at its arrival (seconds from now), step the engine until all are
    answered; returns the results in trace order and the wall time to the last answer."""
    order = sorted(range(len(requests)), key=lambda i: arrivals[i])
    t0 = clock()
    tickets: dict[int, int] = {}
    done: dict[int, Result] = {}
    nxt = 0
    while nxt < len(order) or engine.busy:
        now = clock() - t0
        while nxt < len(order) and arrivals[order[nxt]] <= now:
            i = order[nxt]
            tickets[engine.submit(requests[i], arrival=t0 + arrivals[i])] = i
            nxt += 1
        if not engine.busy:  # idle until the next arrival
            sleep(max(0.0, arrivals[order[nxt]] - (clock() - t0)))
            continue
        for r in engine.step():
            done[tickets[r.ticket]] = r
            if on_done is not None:
                on_done(r)
    end = max((r.finish_s for r in done.values()), default=t0)
    return [done[i] for i in range(len(requests))], end - t0


def format_report(s: BenchStats) -> str:
    """A few human-readable lines."""
    def row(name: str, p: Percentiles) -> str:
        return f"{name:5s} ms  P50 {p.p50:9.2f}  P90 {p.p90:9.2f}  P99 {p.p99:9.2f}"

    return "\n".join([
        f"requests {s.requests} (completed {s.completed}, errors {s.errors}) in {s.duration_s:.2f} s",
        row("TTFT", s.ttft_ms), row("TPOT", s.tpot_ms),
        f"SLO attainment {s.slo_attainment:.1%} (TTFT <= {s.slo_ttft_ms:g} ms and TPOT <= "
        f"{s.slo_tpot_ms:g} ms)",
        f"throughput {s.tokens_per_s:.1f} generated tokens/s, {s.requests_per_s:.2f} requests/s",
    ])
