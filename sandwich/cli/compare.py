"""`sandwichc compare`: the work is in bench/compare.py."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

from sandwich.cli.common import command_line
from sandwich.errors import ConfigError
from sandwich.models import DEFAULT_MODEL
from sandwich.tuner.budget import BUDGETS


def register(sub) -> None:
    p = sub.add_parser("compare", help="sandwich-kernel vs MetaSchedule, DietCode-, Roller-, "
                       "MikPoly-style and vendor GEMMs: kernel speed and tuning time (results/)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="embedded name or path to an HF config.json")
    p.add_argument("--shapes", type=int, default=8, help="sampled M values, log-spread over [1, seq_max]")
    p.add_argument("--seq-max", type=int, default=2048)
    p.add_argument("--baselines", default="metaschedule,dietcode,roller,mikpoly,vendor")
    p.add_argument("--trials", type=int, default=800, help="MetaSchedule trials per shape")
    p.add_argument("--ops", default="gate_up", help="comma-separated subset of qkv,o,gate_up,down,lm_head")
    p.add_argument("--budget", choices=list(BUDGETS), default="default", help="sandwich tuning budget")
    p.add_argument("--peers", default="numpy,torch,openvino", help="vendor peers")
    p.add_argument("--threads", type=int, default=None,
                   help="threads every method runs with (default: all cores of this process)")
    p.add_argument("--cache-dir", help="kernel cache, MetaSchedule databases and the resumable "
                   "results store (default: $SANDWICHC_CACHE_DIR or ~/.cache/sandwichc)")
    p.add_argument("--out-dir", default="results")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from tqdm import tqdm

    from sandwich.bench import compare as cmp
    from sandwich.cli.common import cache_dir_arg
    from sandwich.tuner.kernel_cache import KernelCache

    threads = args.threads or int(args.env.get("TVM_NUM_THREADS", "0"))
    if threads < 1:
        raise ConfigError("set --threads (TVM_NUM_THREADS must be set before TVM starts)")
    if args.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {args.trials}")
    cfg = cmp.CompareConfig(
        model=args.model, shapes=args.shapes, baselines=cmp.parse_baselines(args.baselines),
        trials=args.trials, threads=threads, seq_max=args.seq_max,
        ops=tuple(x for x in args.ops.split(",") if x), budget=args.budget,
        cache_dir=cache_dir_arg(args), out_dir=Path(args.out_dir),
        peers=tuple(x for x in args.peers.split(",") if x))
    cache = KernelCache(cfg.cache_dir)
    ms = cmp.sample_ms(cfg.shapes, cfg.seq_max)
    print(f"comparing on {cfg.model} ops {','.join(cfg.ops)} at M = {ms} with {threads} threads "
          f"on {cache.cpu.model}; results store in {cfg.cache_dir / 'compare'}")
    with tqdm(total=len(cfg.ops) * cmp.steps_per_op(cfg, len(ms)), unit="step",
              disable=args.no_progress, dynamic_ncols=True) as bar:
        def step(what: str) -> None:
            bar.set_description(what)
            bar.update(1)

        res = cmp.run_compare(cfg, cache=cache, step=step, log=tqdm.write)
    res["summary"] = cmp.summary(res)
    command = command_line()
    machine = (f"{cache.cpu.model} ({cache.cpu.mcpu}, {cache.cpu.isa}, {cache.cpu.cores} cores), "
               f"{platform.python_implementation()} {platform.python_version()}")
    date = datetime.date.today().isoformat()
    res.update(command=command, machine=machine, date=date)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    stem = cfg.out_dir / f"compare_{res['model']}"
    Path(f"{stem}.json").write_text(json.dumps(res, indent=1))
    cmp.write_markdown(res, Path(f"{stem}.md"), command=command, machine=machine, date=date)
    cmp.write_png(res, Path(f"{stem}.png"))
    s = res["summary"]
    print("sandwich geomean speedup over " + ", ".join(
        f"{m} {s[f'sandwich_vs_{m}']:.2f}x" for m in res["methods"] if m != "sandwich"))
    print(f"wrote {stem}.json, {stem}.md, {stem}.png")
    return 0
