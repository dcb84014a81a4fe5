"""Building the engine a serving command runs: the stored plan, explicit service configs or
TP, or the Splitwise pools, under the `--schedule` policy; kernels tuned on first use."""

from __future__ import annotations

import argparse
import sys

from sandwich.errors import ConfigError


def schedule_arg(text: str):
    from sandwich.runtime.schedule import parse_schedule

    try:
        return parse_schedule(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def ensure_tuned(args, cache, threads: int) -> None:
    """Tune, on first use, the model's GEMMs that the cache lacks (M up to 2048 or the
    model's context), so a new model's first command produces text; first, refuse a model
    whose weights would not fit in memory."""
    from sandwich.cli.common import say_weights
    from sandwich.models import load_model_config
    from sandwich.payload import make_payload
    from sandwich.runtime.loader import check_memory
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.shared_tuning import tune_shapes
    from sandwich.tuner.tune import unique_shapes

    cfg = load_model_config(args.model)
    say_weights(args)
    check_memory(cfg, weights=weights_arg(args))  # before minutes of tuning for a model that cannot load
    if args.no_tune:
        return
    seq_max = min(2048, cfg.max_position_embeddings)
    shapes = unique_shapes(make_payload(cfg, tp=1, seq_max=seq_max, weights=weights_arg(args)))
    missing = [(names, op) for names, op in shapes  # kernels run only with their own threads
               if not cache.records(op.n, op.k, op.dtype, threads)]
    if missing:
        print(f"tuning {len(missing)} GEMM shape(s) of {cfg.name} for this machine on first use "
              f"({args.tune_budget} budget; --no-tune to refuse)", file=sys.stderr)
        tune_shapes(missing, seq_max=seq_max, threads=threads, budget=get_budget(args.tune_budget),
                    cache=cache, progress=not getattr(args, "no_progress", False))


def weights_arg(args) -> str:
    """--weights of a command that runs a model (fp32 where a Namespace lacks it)."""
    return getattr(args, "weights", "fp32")


def kv_dtype_arg(args) -> str:
    """--kv-cache-dtype of a command that runs a model (f32 where a Namespace lacks it)."""
    return getattr(args, "kv_cache_dtype", "f32")


def make_engine(args, *, max_batch: int, max_seq: int, clock=None):
    """Load the model on the kernel cache and wrap an executor in an engine (speculating
    with --speculate's drafts where the executor can check them)."""
    import warnings

    from sandwich.errors import ConfigWarning
    from sandwich.runtime.speculate import Speculation

    draft = getattr(args, "speculate", 0) or 0
    spec = Speculation(draft=draft, ngram=getattr(args, "speculate_ngram", 3))  # checked before loading
    engine = _engine(args, max_batch=max_batch, max_seq=max_seq, clock=clock)
    if draft:
        if not hasattr(engine.ex, "verify"):
            warnings.warn(f"--speculate is off here: this engine's executor "
                          f"({type(engine.ex).__name__}) decodes a token a step", ConfigWarning,
                          stacklevel=2)
        engine.speculation = spec
    return engine


def _engine(args, *, max_batch: int, max_seq: int, clock=None):
    import atexit
    import os
    import time

    from sandwich.cli.common import cache_dir_arg
    from sandwich.models import load_model_config
    from sandwich.runtime.engine import Engine
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model
    from sandwich.runtime.phases import PhaseSwitcher, load_service_config
    from sandwich.tuner.kernel_cache import KernelCache

    if max_batch < 1 or max_seq < 1:
        raise ConfigError(f"--max-batch and --max-seq must be >= 1, got {max_batch} and {max_seq}")
    if args.tp < 1:
        raise ConfigError(f"--tp must be >= 1, got {args.tp}")
    ctx = load_model_config(args.model).max_position_embeddings
    if max_seq > ctx:  # positions the model never saw: RoPE extrapolates, the text degrades
        raise ConfigError(f"{max_seq} positions (prompt + new tokens, or --max-seq) are beyond "
                          f"the model's context of {ctx}; shorten the prompt or lower the limit")
    cache = KernelCache(cache_dir_arg(args))
    spec = getattr(args, "schedule", "sandwich")  # a Namespace built by hand may lack it
    spec = schedule_arg(spec) if isinstance(spec, str) else spec
    if spec.kind == "splitwise":
        return _splitwise_engine(args, cache, spec, max_batch=max_batch, max_seq=max_seq,
                                 clock=clock)
    weights = weights_arg(args)
    planned = _planned_engine(args, cache, max_batch=max_batch, max_seq=max_seq, clock=clock)
    if planned is not None:
        return _prefix_cache(args, _scheduled(planned, spec))  # warmed up by plan_engine
    if args.tp > 1:
        from sandwich.runtime.tp import TPExecutor

        if args.prefill_config:
            raise ConfigError("--prefill-config with --tp > 1: the ranks keep one CPU set for both "
                              "phases (give it with --decode-config)")
        sets = load_service_config(args.decode_config, "decode") if args.decode_config else None
        ex = TPExecutor(args.model, cache, tp=args.tp, max_batch=max_batch, max_seq=max_seq,
                        ops=args.ops, cpu_sets=sets, weights=weights, kv_dtype=kv_dtype_arg(args))
        atexit.register(ex.close)  # stop the workers however the command ends
        phases = PhaseSwitcher()  # both phases as the ranks were pinned: no switching
    else:
        phases = PhaseSwitcher(
            load_service_config(args.prefill_config, "prefill") if args.prefill_config else None,
            load_service_config(args.decode_config, "decode") if args.decode_config else None)
        threads = args.threads or len(os.sched_getaffinity(0))
        # each phase runs the kernels tuned for its own thread count once a service
        # configuration sets one; without any, the cache's most-tuned thread count serves both
        per_phase = args.prefill_config or args.decode_config
        pre, dec = (phases.plans[p].threads for p in ("prefill", "decode"))
        for t in sorted({pre, dec} if per_phase else {threads}):
            ensure_tuned(args, cache, t)
        model = load_model(args.model, cache, threads=pre if per_phase else threads,
                           decode_threads=dec if per_phase else None, weights=weights)
        ex = Executor(model, max_batch=max_batch, max_seq=max_seq, ops=args.ops, threads=threads,
                      kv_dtype=kv_dtype_arg(args))
    engine = _scheduled(Engine(ex, phases=phases, clock=clock or time.perf_counter), spec)
    _prefix_cache(args, engine)
    if not args.no_warmup:
        engine.warm_up()
    return engine


def _prefix_cache(args, engine):
    """--no-prefix-cache: every prompt prefilled whole (runtime/kv_cache.py)."""
    if getattr(args, "no_prefix_cache", False):
        engine.ex.set_prefix_cache(False)
    return engine


def _scheduled(engine, spec):
    """The engine under the `--schedule` policy (chunked and layered need one process
    layout for both phases: they run prefill and decode in the same forward pass)."""
    from sandwich.runtime.schedule import make_schedule

    if spec.kind in ("chunked", "layered") and not hasattr(engine.ex, "iterate"):
        raise ConfigError(f"--schedule {spec.text} runs prefill beside decode in one process "
                          f"layout, but the plan puts the phases on different ones; add --plan off")
    engine.schedule = make_schedule(spec)
    return engine


def _splitwise_engine(args, cache, spec, *, max_batch: int, max_seq: int, clock=None):
    """Splitwise: a prompt pool process on the first P cores (in TopoTree order), this process
    decoding on the last D."""
    import atexit
    import os
    import time

    from sandwich.runtime.engine import Engine
    from sandwich.runtime.schedule.splitwise import splitwise_engine_parts
    from sandwich.topology.load import load_tree
    from sandwich.topology.pools import core_cpus

    if args.tp > 1 or args.prefill_config or args.decode_config or args.threads:
        raise ConfigError(f"--schedule {spec.text} places its own pools (P cores prefill, D "
                          f"decode); drop --tp/--threads/--prefill-config/--decode-config")
    cpus = core_cpus(load_tree(), os.sched_getaffinity(0))
    prompt, token = spec.values
    for t in sorted({prompt, token}):
        ensure_tuned(args, cache, t)
    ex, sched, phases = splitwise_engine_parts(args.model, cache, cpus=cpus, prompt_cores=prompt,
                                               token_cores=token, max_batch=max_batch,
                                               max_seq=max_seq, ops=args.ops,
                                               weights=weights_arg(args), kv_dtype=kv_dtype_arg(args))
    atexit.register(sched.close)
    engine = Engine(ex, phases=phases, schedule=sched, clock=clock or time.perf_counter)
    if not args.no_warmup:
        engine.warm_up()
    return engine


def _planned_engine(args, cache, *, max_batch: int, max_seq: int, clock=None):
    """The engine of the model's stored plan for its --weights format, or None (no plan,
    --plan off, or the command line places the phases itself). A stale plan is re-planned
    first, or, with --no-tune, left unused with a warning."""
    import atexit
    import warnings

    from sandwich.errors import ConfigWarning
    from sandwich.runtime.planner import make_plan, plan_engine, settings_of, stored_plan
    from sandwich.weight_formats import weights_flag

    explicit = args.prefill_config or args.decode_config or args.tp > 1 or args.threads
    if getattr(args, "plan", "auto") == "off" or explicit:
        return None
    weights = weights_arg(args)
    plan, why, path = stored_plan(args.model, cache, weights=weights)
    if plan is None:
        return None
    if why:
        if args.no_tune:
            warnings.warn(ConfigWarning(f"{path}: stale plan ({why}); not used. `sandwichc tune "
                                        f"--model {args.model}{weights_flag(weights)}` plans "
                                        f"again"), stacklevel=1)
            return None
        print(f"re-planning {args.model}: the stored plan is stale ({why})", file=sys.stderr)
        plan = make_plan(args.model, cache, settings_of(plan),
                         log=lambda msg: print(msg, file=sys.stderr))
    runner = plan_engine(plan, args.model, cache, max_batch=max_batch, max_seq=max_seq,
                         ops=args.ops, warm_up=not args.no_warmup, clock=clock,
                         kv_dtype=kv_dtype_arg(args))
    atexit.register(runner.close)
    return runner.engine
