"""`sandwichc info | tune | cache ls|verify|clear`."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import replace

from sandwich.cli.common import (
    add_cache_arg,
    add_threads_arg,
    add_weights_arg,
    cache_dir_arg,
    port_number,
    say_weights,
)
from sandwich.errors import CacheError, ConfigError
from sandwich.models import DEFAULT_MODEL
from sandwich.tuner.budget import BUDGETS


def register(sub) -> None:
    info = sub.add_parser("info", help="print the detected CPU, the TVM target and its fingerprint")
    info.add_argument("--json", action="store_true")
    info.add_argument("--root", default="/", help="a snapshot laid out like / (proc/cpuinfo, "
                      "sys/devices/system/cpu) instead of this machine")
    info.add_argument("--llvm-cpu", help="the CPU name LLVM's host detection reports (default: "
                      "this machine's; for a --root snapshot, none: the flags decide)")
    info.add_argument("--measure", action="store_true", help="measure the machine model now (FMA "
                      "latency and throughput, read bandwidth, the panel probe; about half a "
                      "minute) and store it in the cache, replacing a stored one")
    add_cache_arg(info)
    info.set_defaults(func=cmd_info)

    tune = sub.add_parser("tune", help="tune the GEMMs of a model over M in [1, seq_max]")
    tune.add_argument("--model", default=DEFAULT_MODEL, help="embedded name or path to an HF config.json")
    tune.add_argument("--seq-max", type=int, default=2048)
    tune.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (shards N or K)")
    add_threads_arg(tune)
    tune.add_argument("--budget", choices=list(BUDGETS), default="default")
    tune.add_argument("--ops", help="comma-separated subset of qkv,o,gate_up,down,lm_head (an MoE model: "
                      "qkv,o,router,expert_gate_up,expert_down,lm_head, and shared_gate_up,"
                      "shared_down with a shared expert)")
    add_weights_arg(tune)
    tune.add_argument("--no-progress", action="store_true")
    tune.add_argument("--plan", choices=("auto", "on", "off"), default="auto",
                      help="on: search this machine's topology, tune each candidate service "
                      "configuration's kernels, measure them on the engine and store the "
                      "prefill/decode pair as the model's plan; off: one kernel set for "
                      "--threads (auto: on unless --tp, --threads, --ops or --rpc is given); "
                      "each --weights format has a plan of its own")
    tune.add_argument("--top-k", type=int, default=3, help="candidates per phase (plan)")
    tune.add_argument("--rounds", type=int, default=7, help="measurement rounds (plan)")
    tune.add_argument("--prompt-len", type=int, default=128,
                      help="prompt tokens of the measurement request (plan)")
    tune.add_argument("--new-tokens", type=int, default=32,
                      help="greedy tokens of the measurement request (plan)")
    tune.add_argument("--no-calibrate", action="store_true",
                      help="simulate with default machine rates instead of measuring them (plan)")
    tune.add_argument("--rpc", metavar="HOST:PORT", help="measure on the TVM RPC servers of this "
                      "tracker (python -m tvm.exec.rpc_tracker); servers: `sandwichc rpc-server`")
    tune.add_argument("--rpc-key", default="sandwichc", help="the servers' key at the tracker")
    tune.add_argument("--rpc-workers", type=int, default=1, metavar="N",
                      help="measure on N of the key's servers at once (each round's candidates "
                           "spread over them; at most the servers the tracker has)")
    tune.add_argument("--rpc-timeout", type=float, default=120.0,
                      help="seconds one remote call may take before its server is dropped and "
                      "the call goes to another")
    tune.add_argument("--measure-share", type=float, default=None, metavar="S",
                      help="let the XGBoost cost model (trained on this CPU's earlier trials, "
                      "and on this tune's as it goes) rank each round of candidates and measure "
                      "only its top share S; 1 measures every candidate (default: 0.25 with "
                      "--budget default, 1 with the others)")
    tune.add_argument("--explore", type=float, default=0.1, metavar="P",
                      help="with --measure-share < 1: each candidate the model ranks out is "
                      "measured anyway with this chance")
    tune.add_argument("--stats", action="store_true",
                      help="print, per GEMM, the candidates measured and ranked out, the cost "
                      "model's rank correlation on the last M and the time spent per stage")
    add_cache_arg(tune)
    tune.set_defaults(func=cmd_tune)

    server = sub.add_parser("rpc-server", help="a TVM RPC server that measures for `tune --rpc` "
                            "(TVM's server, plus the target fingerprint a tune checks)")
    server.add_argument("--tracker", required=True, metavar="HOST:PORT")
    server.add_argument("--key", default="sandwichc")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=port_number, default=9090, help="first port to try")
    server.add_argument("--port-end", type=int, default=None, help="the port after the last "
                        "to try (default: --port + 100)")
    add_threads_arg(server)
    server.set_defaults(func=cmd_rpc_server)

    cache = sub.add_parser("cache", help="list, verify or clear the kernel cache")
    csub = cache.add_subparsers(dest="cache_cmd", required=True)
    for name, fn, hlp in (("ls", cmd_cache_ls, "list tuned shapes and their M ranges"),
                          ("verify", cmd_cache_verify, "check every .so against its SHA-256 "
                           "and, with --numerics, every GEMM against numpy"),
                          ("clean", cmd_cache_clean, "delete .so files no record names "
                           "(left by killed tuners), if older than 10 minutes"),
                          ("clear", cmd_cache_clear, "delete all records and kernels")):
        p = csub.add_parser(name, help=hlp)
        add_cache_arg(p)
        p.set_defaults(func=fn)
        if name == "verify":
            p.add_argument("--numerics", type=int, default=0, metavar="COUNT",
                           help="also run each GEMM at COUNT random M (M=1 and primes included)")
            p.add_argument("--seq-max", type=int, default=2048)


def _threads(args) -> int:
    return getattr(args, "threads", None) or int(args.env.get("TVM_NUM_THREADS", "0")) or len(os.sched_getaffinity(0))


def _cache(args):
    from sandwich.tuner.kernel_cache import KernelCache

    return KernelCache(cache_dir_arg(args))


def cmd_info(args) -> int:
    from pathlib import Path

    from sandwich.compiler.target import detect_cpu

    if not (Path(args.root) / "proc/cpuinfo").is_file():
        raise ConfigError(f"--root {args.root}: no proc/cpuinfo there; point it at a directory "
                          f"laid out like /")
    live = Path(args.root).resolve() == Path("/")
    cpu = detect_cpu(args.root, llvm_cpu=args.llvm_cpu if args.llvm_cpu or live else "generic")
    d = json.loads(cpu.to_json())
    d.pop("flags")
    if not cpu.mcpu_reported:  # else say what LLVM's host detection said, and that it was not used
        d.pop("mcpu_reported")
    elif not args.json:
        d["mcpu_reported"] += " (LLVM's host name; it contradicts the CPU flags, so not used)"
    d["lanes_f32"] = cpu.lanes_f32
    d["target"] = cpu.target_dict(_threads(args))
    d["fingerprint"] = cpu.fingerprint()
    d["tvm_threads"] = int(args.env.get("TVM_NUM_THREADS", "0"))
    model = _machine_model_info(args, cpu) if live else None
    if args.json:
        if model is not None:
            d["machine_model"] = model if isinstance(model, str) else model.to_json() | {
                "accumulators": model.accumulators, "peak_gflops": model.peak_gflops,
                "fma_latency_ns": round(model.fma_latency_ns, 3)}
        print(json.dumps(d, indent=2))
        return 0
    width = max(len(k) for k in d)
    for key, val in d.items():
        print(f"{key:<{width}}  {val}")
    if model is not None and not isinstance(model, str):
        print("machine model (measured, one core):")
        summary = model.summary()
        inner = max(len(k) for k in summary)
        for key, val in summary.items():
            print(f"  {key:<{inner}}  {val}")
    elif model:
        print(f"machine model{' ' * (width - 13)}  {model}")
    return 0


def _machine_model_info(args, cpu):
    """The stored machine model (measured now with --measure), or why there is none. It is
    keyed as the kernels are: its panel probe runs the GEMM family."""
    from sandwich.tuner.kernel_cache import cache_fingerprint
    from sandwich.tuner.machine_model import load_model, machine_model

    cache_dir, fingerprint = cache_dir_arg(args), cache_fingerprint(cpu)
    if args.measure:
        model = machine_model(cache_dir, cpu, fingerprint, remeasure=True,
                              log=lambda msg: print(msg, file=sys.stderr, flush=True))
    else:
        model = load_model(cache_dir, fingerprint)
    if model is None:
        return ("not measured yet: `sandwichc info --measure`, or the first tune at the quick "
                "budget or above, measures it" if not args.measure else
                "could not be measured here (see the message above)")
    return model


def cmd_tune(args) -> int:
    from sandwich.models import load_model_config
    from sandwich.payload import make_payload
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.guide import Guides, GuideSettings
    from sandwich.tuner.quiet import warn_if_busy
    from sandwich.tuner.shared_tuning import tune_shapes
    from sandwich.tuner.tune import unique_shapes

    cfg = load_model_config(args.model)
    say_weights(args)
    budget = get_budget(args.budget)
    guide_settings = GuideSettings(measure_share=budget.share(args.measure_share), explore=args.explore)
    if _plan_mode(args) == "on":
        return _tune_plan(args, cfg)
    payload = make_payload(cfg, tp=args.tp, seq_max=args.seq_max, weights=args.weights)
    threads = _threads(args)
    shapes = unique_shapes(payload)
    if args.ops:
        wanted = set(args.ops.split(","))
        unknown = wanted - {n for names, _ in shapes for n in names}
        if unknown:
            raise ConfigError(f"unknown --ops {sorted(unknown)}; this model has "
                              f"{', '.join(n for names, _ in shapes for n in names)}")
        shapes = [(names, op) for names, op in shapes if wanted & set(names)]
    cache = _cache(args)
    remote = _rpc_target(args, cache.fingerprint)
    if remote is None:  # (the servers' load is theirs to mind)
        warn_if_busy("the timings that rank schedules", lambda msg: print(msg, file=sys.stderr))
    machine = None
    if budget.machine_model:  # measured once per CPU, before the tune, where it can say so
        from sandwich.tuner.machine_model import machine_model

        machine = machine_model(cache.dir, cache.cpu, cache.fingerprint,
                                log=lambda msg: print(msg, file=sys.stderr, flush=True))
    guides = Guides(guide_settings, cache_dir=cache.dir, fingerprint=cache.fingerprint,
                    constants=machine)
    print(f"tuning {cfg.name} (tp={args.tp}, seq_max={args.seq_max}, budget={budget.name}, "
          f"weights={args.weights}) "
          f"with {threads} threads on {cache.cpu.model} [{cache.fingerprint}], cache {cache.dir}")
    t0 = time.perf_counter()
    reports = tune_shapes(shapes, seq_max=args.seq_max, threads=threads, budget=budget, remote=remote,
                          cache=cache, progress=not args.no_progress, guides=guides)
    total = time.perf_counter() - t0
    from sandwich.weight_formats import format_of

    print(f"{'op':<14}{'N':>7}{'K':>7}  {'format':<14}{'searched':>8}{'cached':>8}{'trials':>8}"
          f"{'compile s':>11}{'total s':>9}  best GFLOPS (M)")
    for r in reports:
        best = max(r.results, key=lambda x: x.gflops, default=None)
        best_s = f"{best.gflops:.1f} ({best.m})" if best else "-"
        fmt = format_of(r.dtype).name
        print(f"{'+'.join(r.names):<14}{r.n:>7}{r.k:>7}  {fmt:<14}{r.searched:>8}{r.cached:>8}"
              f"{r.trials:>8}{r.compile_seconds:>11.1f}{r.seconds:>9.1f}  {best_s}")
        if r.rebuilt:
            print(f"  rebuilt {r.rebuilt} kernel file(s) that were missing or altered")
    if remote is not None:
        print(f"RPC: {sum(r.rpc_retries for r in reports)} remote call(s) run again on another "
              f"server after a server failed or did not answer")
    if args.stats:
        print_stats(reports, guides, total)
    print(f"done in {total:.1f} s")
    return 0


def print_stats(reports, guides, total: float) -> None:
    """`tune --stats`: what was measured, what the cost model ranked out and the
    Roof-Surface bound dropped, how well the model ranked the last M of each GEMM, and where
    the time went."""
    print(f"{'op':<14}{'candidates':>11}{'timings':>9}{'ranked out':>11}{'bounded out':>12}"
          f"{'rho':>7}{'compile s':>11}{'time s':>8}{'model s':>9}{'other s':>9}")
    for r in reports:
        timing = max(0.0, r.measure_seconds - r.compile_seconds)
        other = max(0.0, r.seconds - r.measure_seconds - r.model_seconds)
        rho = "-" if r.rho != r.rho else f"{r.rho:.2f}"
        print(f"{'+'.join(r.names):<14}{r.candidates:>11}{r.trials:>9}{r.predicted_only:>11}"
              f"{r.bounded_out:>12}{rho:>7}{r.compile_seconds:>11.1f}{timing:>8.1f}"
              f"{r.model_seconds:>9.1f}{other:>9.1f}")
    print(f"measured {sum(r.candidates for r in reports)} candidates in "
          f"{sum(r.trials for r in reports)} timings; the cost model ranked out "
          f"{sum(r.predicted_only for r in reports)} unmeasured"
          + (f" and was trained {guides.trainings()} time(s)" if guides.settings.active else
             " (not used: --measure-share 1)")
          + f"; the Roof-Surface bound dropped {sum(r.bounded_out for r in reports)}"
          + f"; {total:.1f} s in all")


def _rpc_target(args, fingerprint: str):
    """The RPC servers to measure on (checked now: tracker up, a server under the key, of
    this target), or None for this machine."""
    if not args.rpc:
        return None
    from sandwich.compiler.rpc import TrackerAddress
    from sandwich.tuner.rpc_measure import RpcTarget

    if args.rpc_timeout <= 0:
        raise ConfigError(f"--rpc-timeout must be > 0, got {args.rpc_timeout}")
    if args.rpc_workers < 1:
        raise ConfigError(f"--rpc-workers must be >= 1, got {args.rpc_workers}")
    target = RpcTarget(TrackerAddress.parse(args.rpc), args.rpc_key, args.rpc_timeout)
    servers = target.check(fingerprint)
    workers = min(args.rpc_workers, servers)
    if workers < args.rpc_workers:  # a worker more than the servers would wait for one forever
        print(f"--rpc-workers {args.rpc_workers}: the tracker has {servers} server(s) under key "
              f"{args.rpc_key!r}; measuring on {workers} at once", file=sys.stderr)
    print(f"measuring on the RPC servers under key {args.rpc_key!r} at {target.tracker}"
          + (f", {workers} at once" if workers > 1 else ""))
    return replace(target, workers=workers)


def cmd_rpc_server(args) -> int:
    from sandwich.compiler.rpc import TrackerAddress, serve
    from sandwich.compiler.target import detect_cpu
    from sandwich.tuner.kernel_cache import cache_fingerprint

    fingerprint = cache_fingerprint(detect_cpu())
    port_end = args.port_end if args.port_end is not None else args.port + 100
    state = serve(host=args.host, port=args.port, port_end=port_end,
                  tracker=TrackerAddress.parse(args.tracker), key=args.key, fingerprint=fingerprint)
    print(f"RPC server on {args.host}:{state.port}, key {args.key!r} at tracker {args.tracker}, "
          f"target {fingerprint}, {_threads(args)} threads", flush=True)
    state.thread.join()
    return 0


def _plan_mode(args) -> str:
    """A plan picks the TP degree and threads itself: --tp, --threads or --ops mean one set
    (and so does --rpc: a plan measures on this machine's engine). --weights is the plan's
    format: each format has its own plan."""
    single = [flag for flag, given in (("--tp", args.tp != 1), ("--threads", bool(args.threads)),
                                       ("--ops", bool(args.ops)), ("--rpc", bool(args.rpc)))
              if given]
    if args.plan == "on" and single:
        raise ConfigError(f"--plan on chooses the TP degree and threads itself; drop "
                          f"{', '.join(single)} or pass --plan off")
    return "off" if args.plan == "off" or single else "on"


def _tune_plan(args, cfg) -> int:
    from sandwich.runtime.plan import format_plan
    from sandwich.runtime.planner import PlanSettings, make_plan
    from sandwich.tuner.quiet import warn_if_busy

    if args.top_k < 1:  # (generate's --top-k means sampling, where 0 is valid)
        raise ConfigError(f"--top-k must be >= 1, got {args.top_k}")
    if args.prompt_len + args.new_tokens > cfg.max_position_embeddings:
        raise ConfigError(f"--prompt-len + --new-tokens ({args.prompt_len + args.new_tokens}) is "
                          f"beyond the model's context of {cfg.max_position_embeddings}")
    cache = _cache(args)
    warn_if_busy("the timings that rank schedules and configurations",
                 lambda msg: print(msg, file=sys.stderr))
    print(f"planning {cfg.name} with {args.weights} weights on {cache.cpu.model} "
          f"[{cache.fingerprint}] (seq_max={args.seq_max}, budget={args.budget}, top-{args.top_k} "
          f"per phase), cache {cache.dir}")
    t0 = time.perf_counter()
    settings = PlanSettings(top_k=args.top_k, seq_max=args.seq_max, budget=args.budget,
                            prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                            rounds=args.rounds, calibrate=not args.no_calibrate,
                            measure_share=args.measure_share, explore=args.explore,
                            weights=args.weights)
    plan = make_plan(args.model, cache, settings, progress=not args.no_progress)
    print(format_plan(plan))
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_cache_ls(args) -> int:
    cache = _cache(args)
    recs = cache.db.records(fingerprint=cache.fingerprint)
    if not recs:
        others = len(cache.db.records())
        print(f"{cache.dir}: no tuned kernels for this target ({cache.fingerprint})"
              + (f"; its {others} other records are of another CPU or of another version of the "
                 f"kernels or their timing, which are searched afresh" if others else ""))
        return 0
    print(f"{cache.dir} (target {cache.fingerprint})")
    print(f"{'op':<14}{'N':>7}{'K':>7}{'thr':>5}{'M range':>13}  {'GFLOPS':>8}  schedule")
    for r in recs:
        rec = r.record
        rng = f"{rec.m_lo}-{rec.m_hi}"
        print(f"{rec.op:<14}{rec.n:>7}{rec.k:>7}{r.threads:>5}{rng:>13}  {rec.gflops:>8.1f}  "
              f"{rec.schedule.key()}{' (reused)' if r.reused else ''}")
    return 0


def _primes_upto(n: int) -> list[int]:
    return [p for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))]


def numeric_ms(count: int, seq_max: int, seed: int = 0) -> list[int]:
    """M=1, a few primes, the rest uniform in [1, seq_max]."""
    rng = random.Random(seed)
    primes = _primes_upto(min(seq_max, 2048))
    ms = {1}
    ms.update(rng.sample(primes, min(len(primes), max(0, count // 4))))
    while len(ms) < min(count, seq_max):
        ms.add(rng.randint(1, seq_max))
    return sorted(ms)


def cmd_cache_verify(args) -> int:
    from sandwich.tuner.tune import verify_numerics

    cache = _cache(args)
    problems = cache.verify()
    tuned = sorted({(r.record.n, r.record.k, r.record.dtype, r.threads)
                    for r in cache.db.records(fingerprint=cache.fingerprint)})
    shapes = {t[:3] for t in tuned}
    if args.numerics and not problems:
        ms = numeric_ms(args.numerics, args.seq_max)
        for n, k, dtype, threads in tuned:
            problems += verify_numerics(cache, n=n, k=k, ms=ms, dtype=dtype, threads=threads)
        print(f"checked {len(shapes)} GEMM shape(s) against numpy at M = {ms}")
    n_files = sum(1 for fp, _ in cache.db.kernels(bad=[]) if fp == cache.fingerprint)
    for p in cache.stray_files():
        print(f"stray: {p} (no record names it; `sandwichc cache clean` removes it)")
    if problems:
        for p in problems:
            print(p)
        raise CacheError(f"{len(problems)} problem(s) in {cache.dir}; run `sandwichc tune` to rebuild")
    print(f"{cache.dir}: {n_files} kernel file(s) for {len(shapes)} GEMM shape(s) verified")
    return 0


def cmd_cache_clean(args) -> int:
    cache = _cache(args)
    gone = cache.clean()
    for p in gone:
        print(f"removed {p}")
    print(f"{cache.dir}: {len(gone)} stray file(s) removed")
    return 0


def cmd_cache_clear(args) -> int:
    cache = _cache(args)
    cache.clear()
    print(f"cleared {cache.dir}")
    return 0
