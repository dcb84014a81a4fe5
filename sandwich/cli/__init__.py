"""The `sandwichc` command line: parses arguments, sets thread counts, calls into the folders.
One module per command group; each has `register(subparsers)`."""

from __future__ import annotations

import argparse
import os
import sys
import warnings as _warnings

_python_showwarning = _warnings.showwarning


def _threads_from_argv(argv: list[str]) -> int | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int)
    known, _ = pre.parse_known_args(argv)
    return known.threads


def _set_thread_env(argv: list[str]) -> int:
    """TVM sizes its thread pool once, from TVM_NUM_THREADS, when it starts: set it first."""
    threads = _threads_from_argv(argv) or len(os.sched_getaffinity(0))
    if threads < 1:
        threads = 1
    os.environ["TVM_NUM_THREADS"] = str(threads)
    return threads


def build_parser() -> argparse.ArgumentParser:
    from sandwich import __version__
    from sandwich.cli import (
        bench,
        chat,
        compare,
        dsl,
        plan,
        roofsurface,
        serve,
        serve_bench,
        serve_http,
        topo,
        tune,
    )

    parser = argparse.ArgumentParser(
        prog="sandwichc",
        description="Autotuning compiler and CPU serving runtime for LLMs (the Sandwich design).",
    )
    parser.add_argument("--version", action="version", version=f"sandwichc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (tune, plan, bench, topo, dsl, serve, serve_bench, serve_http, chat, compare,
                  roofsurface):
        group.register(sub)
    return parser


# counts and sizes that must be >= 1 wherever a command takes them (None: the default)
POSITIVE = ("threads", "tp", "seq_max", "max_seq", "max_batch", "trials", "repeats",
            "new_tokens", "max_new_tokens", "ctx", "shards", "shapes", "prompt_len", "passes",
            "max_tokens", "clients", "layers", "batch", "patience", "rounds")


def check_numbers(args: argparse.Namespace) -> None:
    """A zero or negative count is one error line, never a silent default or a stored -3."""
    from sandwich.errors import ConfigError

    for key in POSITIVE:
        v = getattr(args, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {v}")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our own warnings as one line each; everyone else's as Python prints them."""
    from sandwich.errors import ConfigWarning

    if issubclass(category, ConfigWarning):
        print(f"sandwichc: warning: {message}", file=sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> int:
    import warnings

    from sandwich.cli.common import resolve_weights
    from sandwich.errors import SandwichError

    warnings.showwarning = _show_warning

    argv = list(sys.argv[1:] if argv is None else argv)
    _set_thread_env(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.env_cache_dir = os.environ.get("SANDWICHC_CACHE_DIR")
    args.env = dict(os.environ)
    try:
        check_numbers(args)
        resolve_weights(args)
        return int(args.func(args) or 0)
    except SandwichError as e:
        print(f"sandwichc: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sandwichc: interrupted (committed results are kept)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
