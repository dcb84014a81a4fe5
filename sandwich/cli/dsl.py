"""DSL subcommands: `ir` prints a kernel's IR, `compile` builds one kernel into a `.so`,
`tune-kernel` searches a kernel's tunables, `bench-attention` regenerates results/attention.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel.printer import print_module
from sandwich.dsl.load import builtin_kernels, load_file, load_source
from sandwich.dsl.lowlevel.printer import print_module as print_low
from sandwich.dsl.lowlevel.transform import parse as parse_low


def _resolve(name: str) -> Path:
    """A path, or the name of a shipped kernel (e.g. `gemm`)."""
    path = Path(name)
    if path.exists():
        return path
    shipped = builtin_kernels()
    if name in shipped:
        return shipped[name]
    raise DSLError(f"{name}: no such file, and no shipped kernel of that name "
                   f"(shipped: {', '.join(shipped)})")


def run_ir(args: argparse.Namespace) -> int:
    path = _resolve(args.file)
    if args.level == "high":
        print(print_module(load_file(path)), end="")
        return 0
    if path.suffix != ".sw":
        raise DSLError(f"{path}: --level low needs a low-level (.sw) source")
    source = path.read_text(encoding="utf-8")
    load_source(source, file=str(path), level="low")  # semantic checks first
    print(print_low(parse_low(source, str(path))), end="")
    return 0


def _params(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise DSLError(f"--param {item!r}: write name=value, e.g. --param b_kv=64")
        if name.strip() in out:
            raise DSLError(f"--param {name.strip()} is given twice")
        out[name.strip()] = value.strip()
    return out


def _pick_kernel(path: Path, name: str | None):
    kernels = load_file(path).kernels
    if name is None and len(kernels) == 1:
        return kernels[0]
    for k in kernels:
        if k.name == name:
            return k
    raise DSLError(f"{path}: pick a kernel with --kernel (defined: "
                   f"{', '.join(k.name for k in kernels)})")


def run_compile(args: argparse.Namespace) -> int:
    from sandwich.compiler.build import export_atomic
    from sandwich.compiler.lower_build import build_kernel, split_params
    from sandwich.compiler.target import detect_cpu

    if args.threads < 1:
        raise DSLError(f"--threads must be at least 1, got {args.threads}")
    path = _resolve(args.file)
    kernel = _pick_kernel(path, args.kernel)
    cpu = detect_cpu()
    tunables, fixed = split_params(kernel, _params(args.param), vlen=cpu.lanes_f32)
    ex = build_kernel(kernel, tunables=tunables, fixed=fixed, cpu=cpu, threads=args.threads)
    export_atomic(ex, Path(args.output))
    print(f"{args.output}: {kernel.name} {tunables} fixed {fixed} for {cpu.mcpu}")
    return 0


def run_bench_attention(args: argparse.Namespace) -> int:
    from sandwich.bench.attention import run

    run(args.threads, args.output)
    return 0


def run_tune_kernel(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from tqdm import tqdm

    from sandwich.tuner import tune_kernel as tk

    if args.threads < 1:
        raise DSLError(f"--threads must be at least 1, got {args.threads}")
    if args.trials is not None and args.trials < 1:
        raise DSLError(f"--trials must be at least 1, got {args.trials}")
    settings = replace(tk.BUDGETS[args.budget], seed=args.seed, threads=args.threads)
    if args.trials is not None:
        settings = replace(settings, trials=args.trials)
    kernel = _pick_kernel(_resolve(args.file), args.kernel)
    with tqdm(total=settings.trials, unit="trial", disable=args.no_progress,
              dynamic_ncols=True, desc=kernel.name) as bar:
        best = [float("inf")]

        def on_trial(trial) -> None:
            if trial.outcome.ok:
                best[0] = min(best[0], trial.outcome.ms)
            bar.set_postfix_str(f"best {best[0]:.4f} ms" if best[0] < float("inf") else "")
            bar.update(1)

        tuning = tk.tune(kernel, shape_args=args.shape, pins=args.pin, settings=settings,
                         on_trial=on_trial)
    shape = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in tuning.shapes.items())
    print(f"{kernel.name} at {shape}, {settings.threads} threads, "
          f"{len(tuning.result.history)} trials (budget {args.budget}, seed {args.seed})")
    print("\n".join(tk.report_lines(tuning)))
    if args.json:
        tk.write_json(tuning, args.json)
        print(f"wrote {args.json}")
    if args.out:
        tk.write_best_so(tuning, args.out)
        print(f"wrote {args.out}")
    return 0


def register(subparsers) -> None:
    """Add the `ir`, `compile`, `tune-kernel` and `bench-attention` subcommands."""
    p = subparsers.add_parser("ir", help="parse, check and print a DSL kernel source",
                              description="Parse a kernel source (.sw low-level C-like IR, "
                              ".swpy high-level Python-like IR), check it, and print it.")
    p.add_argument("file", help="kernel source file, or a shipped kernel name such as gemm")
    p.add_argument("--level", choices=("low", "high"), default="high",
                   help="which IR to print (default: high, the Python-like IR)")
    p.set_defaults(func=run_ir)

    p = subparsers.add_parser("compile", help="build one DSL kernel into a shared library",
                              description="Lower a kernel with values for all its tunables "
                              "(and optionally fixed scalar parameters such as D) to TIR and "
                              "build it for this CPU.")
    p.add_argument("file", help="kernel source file, or a shipped kernel name")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a tunable value, or a scalar parameter to fix (repeatable)")
    p.add_argument("--kernel", help="which kernel, when the file defines several")
    p.add_argument("--threads", type=int, default=2, help="worker threads (default 2)")
    p.add_argument("-o", "--output", required=True, help="the .so to write")
    p.set_defaults(func=run_compile)

    p = subparsers.add_parser("tune-kernel", help="tune a DSL kernel's tunables at one shape",
                              description="Search a kernel's tunables (coordinate descent "
                              "with random restarts); every new point is checked against a "
                              "reference before it is timed.")
    p.add_argument("file", help="kernel source file, or a shipped kernel name")
    p.add_argument("--kernel", help="which kernel, when the file defines several")
    p.add_argument("--shape", action="extend", nargs="+", default=[], metavar="NAME=VALUE",
                   help="scalar arguments, e.g. --shape M=64 N=768 K=768 (all are needed, "
                   "except eps, and scale which defaults to 1/sqrt(D))")
    p.add_argument("--pin", action="extend", nargs="+", default=[], metavar="NAME=VALUE",
                   help="hold tunables at one value each, e.g. --pin t_k=1")
    p.add_argument("--threads", type=int, default=2, help="worker threads (default 2)")
    p.add_argument("--budget", choices=("tiny", "quick", "default"), default="quick",
                   help="trials and timing care: tiny 4, quick 16, default 48 (default quick)")
    p.add_argument("--trials", type=int, help="measured points, overriding the budget")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and the restarts")
    p.add_argument("--json", help="write the best point and the history here")
    p.add_argument("--out", help="write the winning kernel's .so here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_tune_kernel)

    p = subparsers.add_parser("bench-attention", help="benchmark the DSL attention kernels",
                              description="Decode attention vs streaming bandwidth, causal "
                              "prefill vs torch SDPA; writes a Markdown report.")
    p.add_argument("--threads", type=int, default=2, help="threads for kernels and peers")
    p.add_argument("-o", "--output", default="results/attention.md", help="Markdown to write")
    p.set_defaults(func=run_bench_attention)
