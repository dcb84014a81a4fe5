"""`sandwichc bench scheduling`: the four scheduling policies and the C/G trade-off on the same
requests of each trace, in one run (bench/scheduling.py) -> results/scheduling.{md,json,png}."""

from __future__ import annotations

import argparse
from pathlib import Path

from sandwich.cli.common import command_line
from sandwich.errors import ConfigError

DEFAULT_POLICIES = ("sandwich", "chunked:64", "layered", "layered:4", "splitwise:1,1")
DEFAULT_SWEEP = ("chunked:32", "chunked:128", "chunked:256", "chunked:512", "layered:2",
                 "layered:8", "layered:15")


def register(bsub) -> None:
    from sandwich.cli import serve, serve_bench

    p = bsub.add_parser("scheduling", help="every scheduling policy (sandwich, chunked:C, "
                        "layered:G, splitwise:P,D) on the same requests of each trace, one run: "
                        "TTFT/TBT/E2E percentiles, SLO attainment, goodput, expert traffic, and "
                        "the TTFT-TBT trade-off over C and G")
    serve._serving_args(p)
    p.add_argument("--traces", nargs="+", default=["synthetic:coding", "synthetic:conversation"],
                   help="traces as serve-bench takes them (synthetic:PROFILE or files)")
    p.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    p.add_argument("--sweep", nargs="*", default=list(DEFAULT_SWEEP),
                   help="extra chunked:C / layered:G points of the trade-off plot")
    p.add_argument("--rate", type=float, default=1.0, help="arrivals per second")
    p.add_argument("--arrivals", type=serve_bench._arrivals, default="poisson")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per trace")
    p.add_argument("--length-scale", type=float, default=0.25,
                   help="shrink the papers' lengths to this machine (0.25: coding 375 in / 3 out)")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--slo-ttft-ms", type=float, default=3000.0)
    p.add_argument("--slo-tbt-ms", type=float, default=150.0, help="bound on every gap")
    p.add_argument("--slo-e2e-ms", type=float)
    p.add_argument("--goodput", type=serve_bench._rate_range, metavar="LO:HI",
                   help="also bisect each headline policy's goodput between these rates")
    p.add_argument("--goodput-steps", type=int, default=2)
    p.add_argument("--goodput-duration", type=float, default=20.0,
                   help="each goodput probe replays this many seconds of the trace")
    p.add_argument("--md", default="results/scheduling.md")
    p.add_argument("--json", dest="json_out", default="results/scheduling.json")
    p.add_argument("--png", default="results/scheduling.png")
    p.set_defaults(func=cmd_bench_scheduling)


def cmd_bench_scheduling(args: argparse.Namespace) -> int:
    from sandwich.bench.scheduling import SchedulingSettings, run_scheduling
    from sandwich.bench.scheduling_report import to_markdown, write_json, write_png
    from sandwich.compiler.target import describe_machine
    from sandwich.runtime import serve_bench as sb
    from sandwich.runtime.schedule import make_schedule, parse_schedule
    from sandwich.runtime.trace_load import TraceOptions, load_trace

    for text in (*args.policies, *args.sweep):
        parse_schedule(text)  # every spelling checked before anything loads
    max_seq = args.max_seq or 2048
    opts = TraceOptions(rate=args.rate, duration_s=args.duration, seed=args.seed, max_seq=max_seq,
                        arrivals=args.arrivals, length_scale=args.length_scale)
    workloads = {t: load_trace(t, opts).entries for t in args.traces}
    empty = [t for t, e in workloads.items() if not e]
    if empty:
        raise ConfigError(f"{empty[0]}: no request arrives within --duration {args.duration} s")
    engines: dict[str, object] = {}

    def engine_for(policy: str):
        """One in-process engine for every policy but splitwise (schedules swap on it); each
        splitwise spelling its own pools, closed when the next engine is built."""
        kind = parse_schedule(policy).kind
        key = policy if kind == "splitwise" else "in-process"
        for k in [k for k in engines if k != key and k != "in-process"]:
            _close(engines.pop(k))
        if key not in engines:
            engines[key] = _build(args, policy if kind == "splitwise" else "sandwich",
                                  max_batch=args.max_batch, max_seq=max_seq)
        engine = engines[key]
        if kind != "splitwise":
            engine.schedule = make_schedule(policy)  # type: ignore[attr-defined]
        return engine

    settings = SchedulingSettings(
        slo=sb.SLO(args.slo_ttft_ms, None, args.slo_tbt_ms, args.slo_e2e_ms),
        goodput=args.goodput, goodput_steps=args.goodput_steps,
        goodput_duration_s=args.goodput_duration)
    first = engine_for(args.policies[0])
    try:
        run = run_scheduling(machine=describe_machine(), model=str(args.model),
                             workloads=workloads, policies=args.policies, sweep=args.sweep,
                             engine_for=engine_for, settings=settings, seed=args.seed,
                             vocab_size=first.vocab_size or 1)  # type: ignore[attr-defined]
    finally:
        for e in engines.values():
            _close(e)
    command = command_line()
    md, js, png = Path(args.md), Path(args.json_out), Path(args.png)
    for path in (md, js, png):
        path.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(to_markdown(run, command))
    write_json(run, js)
    write_png(run, png)
    print(f"wrote {md}, {js}, {png}")
    return 0


def _build(args, schedule: str, *, max_batch: int, max_seq: int):
    from sandwich.cli.engines import make_engine

    # one engine replays the same trace under every policy: no prefix reuse from one to the next
    return make_engine(argparse.Namespace(**vars(args) | {"schedule": schedule, "plan": "off",
                                                          "no_prefix_cache": True}),
                       max_batch=max_batch, max_seq=max_seq)


def _close(engine) -> None:
    """Stop a splitwise engine's prompt pool and give this process back every core."""
    engine.schedule.close()
    engine.phases.restore()
