"""`sandwichc ir FILE [--level low|high]`: parse, check and print a kernel source."""

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


def register(subparsers) -> None:
    """Add the `ir` subcommand to the sandwichc argument parser."""
    p = subparsers.add_parser("ir", help="parse, check and print a DSL kernel source",
                              description="Parse a kernel source (.sw low-level C-like IR, "
                              ".swpy high-level Python-like IR), check it, and print it.")
    p.add_argument("file", help="kernel source file, or a shipped kernel name such as gemm")
    p.add_argument("--level", choices=("low", "high"), default="high",
                   help="which IR to print (default: high, the Python-like IR)")
    p.set_defaults(func=run_ir)
