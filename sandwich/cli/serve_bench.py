"""`sandwichc serve-bench`: replay a request trace on the engine (trace formats in
runtime/trace_*.py, metrics in runtime/serve_bench.py)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from sandwich.cli import serve
from sandwich.errors import ConfigError


def register(sub) -> None:
    b = sub.add_parser("serve-bench", help="replay a request trace in real time: TTFT/TBT/E2E "
                       "percentiles, SLO attainment, slowdown SLOs, goodput, throughput")
    serve._serving_args(b)
    b.add_argument("--trace", required=True, help="a trace file: .jsonl JSON Lines (arrival_s, "
                   "prompt_len or prompt_ids, output_len), .csv Azure LLM inference trace "
                   "(TIMESTAMP,ContextTokens,GeneratedTokens), .json ShareGPT conversations (other "
                   "names: by content, or --trace-format); or 'synthetic' (geometric lengths of "
                   "--prompt-mean/--output-mean) or 'synthetic:coding|conversation|sharegpt|arxiv' "
                   "(lengths fitted to the papers' statistics)")
    b.add_argument("--trace-format", choices=("jsonl", "azure", "sharegpt"),
                   help="the file's format when its name or content does not say")
    b.add_argument("--rate", type=float, default=1.0,
                   help="arrivals per second (synthetic and ShareGPT traces)")
    b.add_argument("--arrivals", type=_arrivals, default="poisson",
                   help="poisson, or gamma:CV (Gamma inter-arrival gaps, coefficient of variation "
                   "CV; > 1 is burstier) for synthetic and ShareGPT traces")
    b.add_argument("--duration", type=float, default=10.0,
                   help="seconds of arrivals (synthetic; a file trace is cut at this time)")
    b.add_argument("--rate-scale", type=float, default=1.0,
                   help="speed up a file trace's arrivals by this factor (2 = twice the rate)")
    b.add_argument("--length-scale", type=float, default=1.0,
                   help="multiply every prompt and output length (e.g. 0.05 to fit production "
                   "lengths on a small machine); synthetic traces are clipped to --max-seq")
    b.add_argument("--clip", action="store_true", help="clip file-trace requests to --max-seq "
                   "(otherwise a request that does not fit gets an error result)")
    b.add_argument("--prompt-mean", type=float, default=32.0, help="synthetic mean prompt length")
    b.add_argument("--output-mean", type=float, default=16.0, help="synthetic mean output length")
    b.add_argument("--max-batch", type=int, default=4)
    b.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    b.add_argument("--slo-tpot-ms", type=float, default=100.0)
    b.add_argument("--slo-tbt-ms", type=float, help="bound on every inter-token gap of a request")
    b.add_argument("--slo-e2e-ms", type=float, help="bound on arrival-to-last-token time")
    b.add_argument("--slowdown-slo", action="store_true",
                   help="first run each distinct (prompt length, output length) alone, then report "
                   "TTFT/TBT/E2E slowdown percentiles against Splitwise's Table VI limits")
    b.add_argument("--goodput", type=_rate_range, metavar="LO:HI",
                   help="also find the highest rate (req/s) with >= 90%% of requests meeting the "
                   "SLOs: replays of the same requests with arrivals rescaled, bisected on the rate")
    b.add_argument("--goodput-steps", type=int, default=4,
                   help="bisection steps after probing LO and HI (replays: at most steps + 2)")
    b.add_argument("--json", dest="json_out", help="also write the report and one record per "
                   "request (arrival, ids, TTFT, every TBT, E2E) as JSON to this file")
    b.set_defaults(func=cmd_serve_bench)


def _arrivals(text: str):
    from sandwich.runtime.trace_synth import Arrivals

    try:
        return Arrivals.parse(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _rate_range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(":")
    try:
        pair = float(lo), float(hi)
    except ValueError:
        pair = (0.0, 0.0)
    if not 0 < pair[0] < pair[1] < float("inf"):
        raise argparse.ArgumentTypeError(f"expected LO:HI request rates with 0 < LO < HI, "
                                         f"got {text!r}")
    return pair


def _trace_tokenizer(args):
    """The model's tokenizer for a ShareGPT trace, else None (lengths are estimated)."""
    from sandwich.runtime import traces

    if args.trace.startswith("synthetic") or \
            (args.trace_format or traces.detect_format(args.trace)) != "sharegpt":
        return None
    from sandwich.runtime.tokenizer import load_tokenizer

    try:
        return load_tokenizer(args.model)
    except ConfigError as e:
        print(f"no tokenizer ({e}); ShareGPT lengths are estimated from word counts",
              file=sys.stderr)
        return None


def cmd_serve_bench(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from tqdm import tqdm

    from sandwich.runtime import serve_bench as sb
    from sandwich.runtime import traces
    from sandwich.runtime.trace_load import TraceOptions, load_trace

    max_seq = args.max_seq or 256
    opts = TraceOptions(rate=args.rate, duration_s=args.duration, seed=args.seed, max_seq=max_seq,
                        arrivals=args.arrivals, length_scale=args.length_scale,
                        rate_scale=args.rate_scale, clip_files=args.clip, fmt=args.trace_format,
                        prompt_mean=args.prompt_mean, output_mean=args.output_mean,
                        tokenizer=_trace_tokenizer(args))
    loaded = load_trace(args.trace, opts)
    entries = loaded.entries
    if not entries:
        raise ConfigError(f"the trace has no request arriving before --duration {args.duration} s; "
                          f"raise --rate or --duration")
    if loaded.clipped:
        print(f"{loaded.clipped} of {len(entries)} requests clipped to --max-seq {max_seq}; "
              f"lower --length-scale to keep the length distribution", file=sys.stderr)
    arrivals = [e.arrival_s for e in entries]
    base_rate = traces.mean_rate(entries) if args.goodput else None
    if base_rate is not None and not base_rate < float("inf"):
        raise ConfigError("--goodput rescales the trace's arrivals, but they all coincide")
    engine = serve._engine(args, max_batch=args.max_batch, max_seq=max_seq)
    reqs = traces.to_requests(entries, vocab_size=engine.vocab_size or 1, seed=args.seed,
                              temperature=args.temperature)
    baselines = None
    if args.slowdown_slo:
        shapes = len({(len(r.prompt), r.max_new_tokens) for r in reqs})
        print(f"running {shapes} distinct requests alone for the slowdown baselines",
              file=sys.stderr)
        baselines = sb.alone_baselines(engine, reqs)
        engine.stats = type(engine.stats)()
        engine.phases.switches = engine.phases.applied = 0
    with tqdm(total=len(reqs), desc="serve-bench", unit="req", disable=None, file=sys.stderr) as bar:
        expert0 = getattr(engine.ex, "expert_bytes", 0)
        results, wall = sb.replay(engine, arrivals, reqs, clock=engine.clock,
                                  on_done=lambda _: bar.update())
    experts = getattr(engine.ex, "expert_bytes", 0) - expert0  # an MoE model's expert reads
    engine_stats = vars(engine.stats) | {"schedule": engine.schedule.name,
                                         "expert_bytes_per_request": experts / len(reqs),
                                         "max_batch": args.max_batch, "max_seq": max_seq,
                                         "ops": args.ops, "trace": args.trace,
                                         "arrivals": args.arrivals.kind,
                                         "arrivals_cv": args.arrivals.cv,
                                         "length_scale": args.length_scale,
                                         "rate_scale": args.rate_scale, "clipped": loaded.clipped}
    slo = dict(slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
               slo_tbt_ms=args.slo_tbt_ms, slo_e2e_ms=args.slo_e2e_ms)
    stats = sb.summarize(results, duration_s=wall, engine=engine_stats, **slo)
    if baselines is not None:
        stats = replace(stats, slowdown=sb.slowdowns(results, baselines).to_dict())
    if args.goodput:
        stats = replace(stats, goodput=_goodput(args, engine, entries, reqs, base_rate,
                                                baselines).to_dict())
    print(sb.format_report(stats))
    errors = [r.error for r in results if r.error]
    if errors:
        print(f"{len(errors)} requests failed; first: {errors[0]}", file=sys.stderr)
    if args.json_out:
        doc = stats.to_dict() | {"records": sb.records(results, arrivals)}
        Path(args.json_out).write_text(json.dumps(doc, indent=1))
    return 0


def _goodput(args, engine, entries, reqs, base: float, baselines=None):
    """Bisect the rate with replays of the same requests, arrivals rescaled to each rate
    (base: the trace's own mean rate). With slowdown baselines a rate is good only when
    Table VI's slowdown limits hold as well (its attainment counts as 0 otherwise)."""
    from sandwich.runtime import serve_bench as sb
    from sandwich.runtime import traces

    slo = sb.SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_tbt_ms, args.slo_e2e_ms)

    def attain(rate: float) -> float:
        scaled = traces.scale(entries, rate_scale=rate / base)
        results, _ = sb.replay(engine, [e.arrival_s for e in scaled], reqs, clock=engine.clock)
        a = sb.attainment(results, slo)
        why = ""
        if baselines is not None and not sb.slowdowns(results, baselines).met:
            a, why = 0.0, " (slowdown limits missed)"
        print(f"goodput probe: {rate:.3g} req/s -> attainment {a:.1%}{why}", file=sys.stderr)
        return a

    lo, hi = args.goodput
    return sb.find_goodput(attain, lo=lo, hi=hi, steps=args.goodput_steps)
