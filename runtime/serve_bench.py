"""serve-bench: replay a trace in real time through the engine and summarise latency and SLOs.

A request is submitted only once its arrival time has passed (its TTFT counts from that
arrival, so time spent waiting for a slot is included). Percentiles interpolate linearly
between order statistics (numpy's default). TBT percentiles pool every inter-token gap of
every request: a prefill that stalls the running decodes shows in the tail, never in a mean.
SLO attainment is the fraction of *all* requests meeting every per-request SLO; an error
result meets none. Slowdown SLOs (Splitwise, Table VI) compare each request with itself run
alone on an idle engine; goodput is the highest rate keeping attainment >= 90%.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.engine import Engine, Request, Result

QUANTILES = (50, 90, 99)
# Splitwise (paper 004) Table VI: the P50/P90/P99 slowdown allowed against the same request
# under no contention; all nine must hold
TABLE_VI = {"ttft": (2.0, 3.0, 6.0), "tbt": (1.25, 1.5, 5.0), "e2e": (1.25, 1.5, 5.0)}


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class SLO:
    """Per-request objectives in ms; None is not checked. tbt bounds the request's worst
    gap (stall-free decoding is what chunked and layered prefill promise)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tbt_ms: float | None = None
    e2e_ms: float | None = None

    def met(self, r: Result) -> bool:
        if r.finish == "error":
            return False
        worst = max(r.tbt_ms, default=0.0)
        return all(lim is None or v <= lim for v, lim in (
            (r.ttft_ms, self.ttft_ms), (r.tpot_ms, self.tpot_ms), (worst, self.tbt_ms),
            (r.e2e_ms, self.e2e_ms)))


@dataclass(frozen=True)
class BenchStats:
    """The serve-bench report (latencies in ms); to_dict() is the --json summary."""

    requests: int
    completed: int
    errors: int
    duration_s: float
    generated_tokens: int
    tokens_per_s: float
    requests_per_s: float
    ttft_ms: Percentiles
    tpot_ms: Percentiles  # over requests with >= 2 tokens (TPOT is undefined for one)
    tbt_ms: Percentiles  # over every inter-token gap
    e2e_ms: Percentiles
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    slo_tbt_ms: float | None
    slo_e2e_ms: float | None
    slo_attainment: float
    engine: dict = field(default_factory=dict)
    slowdown: dict | None = None  # Slowdown.to_dict() with --slowdown-slo
    goodput: dict | None = None  # Goodput.to_dict() with --goodput

    def to_dict(self) -> dict:
        return asdict(self)


def percentiles(values: Sequence[float]) -> Percentiles:
    """P50/P90/P99 with linear interpolation; NaN for no values."""
    if not len(values):
        return Percentiles(float("nan"), float("nan"), float("nan"))
    q = np.percentile(np.asarray(values, dtype=np.float64), QUANTILES)
    return Percentiles(*(float(x) for x in q))


def meets_slo(r: Result, *, ttft_ms: float, tpot_ms: float) -> bool:
    return SLO(ttft_ms, tpot_ms).met(r)


def summarize(results: Sequence[Result], *, duration_s: float, slo_ttft_ms: float | None,
              slo_tpot_ms: float | None, slo_tbt_ms: float | None = None,
              slo_e2e_ms: float | None = None, engine: dict | None = None) -> BenchStats:
    """Percentiles, throughput over the wall time `duration_s`, and SLO attainment."""
    slo = SLO(slo_ttft_ms, slo_tpot_ms, slo_tbt_ms, slo_e2e_ms)
    ok = [r for r in results if r.finish != "error"]
    tokens = sum(len(r.ids) for r in ok)
    wall = max(duration_s, 1e-9)
    return BenchStats(
        requests=len(results), completed=len(ok), errors=len(results) - len(ok),
        duration_s=duration_s, generated_tokens=tokens, tokens_per_s=tokens / wall,
        requests_per_s=len(ok) / wall,
        ttft_ms=percentiles([r.ttft_ms for r in ok]),
        tpot_ms=percentiles([r.tpot_ms for r in ok if len(r.ids) > 1]),
        tbt_ms=percentiles([g for r in ok for g in r.tbt_ms]),
        e2e_ms=percentiles([r.e2e_ms for r in ok]),
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_tbt_ms=slo_tbt_ms,
        slo_e2e_ms=slo_e2e_ms, slo_attainment=attainment(results, slo), engine=engine or {})


def attainment(results: Sequence[Result], slo: SLO) -> float:
    """Fraction of all requests meeting every SLO (NaN for none)."""
    return sum(slo.met(r) for r in results) / len(results) if results else float("nan")


def records(results: Sequence[Result], arrivals: Sequence[float]) -> list[dict]:
    """One JSON record per request, in trace order; arrival_s is the trace's."""
    return [{"rid": r.rid, "arrival_s": a, "prompt_len": r.prompt_len, "ids": list(r.ids),
             "finish": r.finish, "ttft_ms": r.ttft_ms, "tbt_ms": list(r.tbt_ms),
             "e2e_ms": r.e2e_ms, "error": r.error}
            for r, a in zip(results, arrivals, strict=True)]


# -- slowdown SLOs (Splitwise Table VI) ------------------------------------------------------
@dataclass(frozen=True)
class Baseline:
    """A request's figures alone on an idle engine (ms); tbt is its mean gap."""

    ttft_ms: float
    tbt_ms: float | None
    e2e_ms: float

    @classmethod
    def of(cls, r: Result) -> Baseline:
        return cls(r.ttft_ms, r.tpot_ms if len(r.ids) > 1 else None, r.e2e_ms)


@dataclass(frozen=True)
class Slowdown:
    """Percentiles of each metric over its alone figure, and whether all nine limits hold.
    TBT pools every gap over the request's alone mean gap. Error results and requests
    without a baseline are left out (they already miss the attainment)."""

    ttft: Percentiles
    tbt: Percentiles
    e2e: Percentiles
    limits: dict
    met: bool
    compared: int

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(x: float, base: float) -> float:
    return x / base if base > 0 else (1.0 if x <= 0 else math.inf)


def slowdowns(results: Sequence[Result], baselines: Sequence[Baseline | None],
              limits: dict = TABLE_VI) -> Slowdown:
    """Slowdown percentiles of results against per-request baselines (same order)."""
    pairs = [(r, b) for r, b in zip(results, baselines, strict=True)
             if b is not None and r.finish != "error"]
    got = {"ttft": percentiles([_ratio(r.ttft_ms, b.ttft_ms) for r, b in pairs]),
           "tbt": percentiles([_ratio(g, b.tbt_ms) for r, b in pairs if b.tbt_ms is not None
                               for g in r.tbt_ms]),
           "e2e": percentiles([_ratio(r.e2e_ms, b.e2e_ms) for r, b in pairs])}
    # a NaN (no gaps at all) is not a miss: there is nothing to slow down
    met = bool(pairs) and all(math.isnan(v) or v <= lim for k, p in got.items()
                              for v, lim in zip((p.p50, p.p90, p.p99), limits[k], strict=True))
    return Slowdown(got["ttft"], got["tbt"], got["e2e"], dict(limits), met, len(pairs))


def alone_baselines(engine: Engine, requests: Sequence[Request]) -> list[Baseline | None]:
    """Run each distinct (prompt length, max_new_tokens) alone on the idle engine: timing
    depends on the shapes only, not the ids (Splitwise §III makes the same point); None
    where the request fails. Prefix reuse is off meanwhile, and what these runs leave in the
    slots is forgotten: the trace replays these very requests."""
    from sandwich.runtime.executor import whole_prefills

    seen: dict[tuple[int, int], Baseline | None] = {}
    with whole_prefills(engine.ex):
        for r in requests:
            key = (len(r.prompt), r.max_new_tokens)
            if key not in seen:
                (res,) = engine.run([r])
                seen[key] = None if res.finish == "error" else Baseline.of(res)
    return [seen[(len(r.prompt), r.max_new_tokens)] for r in requests]


# -- goodput ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Goodput:
    """The highest rate probed whose attainment reached target (0.0: not even lo);
    capped means hi itself passed, so the goodput is at least hi."""

    rate: float
    target: float
    capped: bool
    probes: tuple[tuple[float, float], ...]  # (rate, attainment) in probe order

    def to_dict(self) -> dict:
        return asdict(self)


def find_goodput(attain: Callable[[float], float], *, lo: float, hi: float,
                 target: float = 0.9, steps: int = 4) -> Goodput:
    """Bisect on log(rate) between lo and hi (rates span decades), assuming attainment falls
    as the rate grows; at most steps + 2 calls of attain(rate) -> attainment."""
    if not 0 < lo < hi or steps < 0:
        raise ConfigError(f"goodput needs 0 < LO < HI and steps >= 0, got {lo}, {hi}, {steps}")
    probes: list[tuple[float, float]] = []

    def ok(rate: float) -> bool:
        a = attain(rate)
        probes.append((rate, a))
        return a >= target

    if not ok(lo):
        return Goodput(0.0, target, False, tuple(probes))
    if ok(hi):
        return Goodput(hi, target, True, tuple(probes))
    good, bad = lo, hi
    for _ in range(steps):
        mid = math.sqrt(good * bad)
        good, bad = (mid, bad) if ok(mid) else (good, mid)
    return Goodput(good, target, False, tuple(probes))


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

    slos = [f"{k} <= {v:g} ms" for k, v in (("TTFT", s.slo_ttft_ms), ("TPOT", s.slo_tpot_ms),
                                            ("every TBT", s.slo_tbt_ms), ("E2E", s.slo_e2e_ms))
            if v is not None]
    lines = [
        f"requests {s.requests} (completed {s.completed}, errors {s.errors}) in {s.duration_s:.2f} s",
        row("TTFT", s.ttft_ms), row("TPOT", s.tpot_ms), row("TBT", s.tbt_ms), row("E2E", s.e2e_ms),
        f"SLO attainment {s.slo_attainment:.1%} ({' and '.join(slos) or 'no SLO'})",
        f"throughput {s.tokens_per_s:.1f} generated tokens/s, {s.requests_per_s:.2f} requests/s",
    ]
    if s.engine.get("expert_bytes_per_request"):
        lines.append(f"expert weights read: {s.engine['expert_bytes_per_request'] / 1e6:.1f} MB "
                     f"per request (schedule {s.engine.get('schedule', '?')})")
    if s.slowdown:
        d = s.slowdown
        parts = [f"{k.upper()} {d[k]['p50']:.2f}/{d[k]['p90']:.2f}/{d[k]['p99']:.2f}x"
                 for k in ("ttft", "tbt", "e2e")]
        lines.append(f"slowdown vs alone P50/P90/P99: {', '.join(parts)} -> Table VI SLOs "
                     f"{'met' if d['met'] else 'missed'} ({d['compared']} requests)")
    if s.goodput:
        g = s.goodput
        probes = ", ".join(f"{r:.3g}:{a:.0%}" for r, a in g["probes"])
        lines.append(f"goodput {'>= ' if g['capped'] else ''}{g['rate']:.3g} req/s at >= "
                     f"{g['target']:.0%} attainment (probes rate:attainment {probes})")
    return "\n".join(lines)
