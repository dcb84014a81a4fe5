"""`sandwichc plan show`: the stored plan of a model on this machine, and whether it is current."""

from __future__ import annotations

import json

from sandwich.cli.common import add_cache_arg, add_weights_arg, cache_dir_arg
from sandwich.models import DEFAULT_MODEL


def register(sub) -> None:
    p = sub.add_parser("plan", help="show the plan `sandwichc tune` stored for a model")
    psub = p.add_subparsers(dest="plan_cmd", required=True)
    show = psub.add_parser("show", help="the chosen prefill/decode configurations and every "
                           "candidate's simulated and measured figures")
    show.add_argument("--model", default=DEFAULT_MODEL, help="embedded name, HF directory or GGUF")
    show.add_argument("--json", action="store_true", help="print the stored plan JSON")
    add_cache_arg(show)
    add_weights_arg(show)
    show.set_defaults(func=cmd_plan_show)


def cmd_plan_show(args) -> int:
    from sandwich.errors import CacheError
    from sandwich.runtime.plan import format_plan
    from sandwich.runtime.planner import stored_plan
    from sandwich.tuner.kernel_cache import KernelCache
    from sandwich.weight_formats import weights_flag

    plan, why, path = stored_plan(args.model, KernelCache(cache_dir_arg(args)), weights=args.weights)
    if plan is None:
        raise CacheError(f"no plan for {args.model} with {args.weights} weights in {path.parent}; "
                         f"`sandwichc tune --model {args.model}{weights_flag(args.weights)}` "
                         f"makes one")
    if args.json:
        print(json.dumps(json.loads(plan.to_json()) | {"stale": why}, indent=1))
        return 0
    print(format_plan(plan))
    print(f"{path}: " + (f"STALE, {why}: the next run re-plans it" if why else "current"))
    return 0
