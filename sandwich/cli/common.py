"""Options and settings every command group shares: the kernel cache and the thread count."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", help="kernel cache directory (default: $SANDWICHC_CACHE_DIR or "
                   "~/.cache/sandwichc)")


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="threads the kernels run with (default: all cores of this process)")


def cache_dir_arg(args) -> Path:
    """--cache-dir, else $SANDWICHC_CACHE_DIR, else the user's cache directory."""
    from sandwich.tuner.kernel_cache import default_cache_dir

    if getattr(args, "cache_dir", None):
        return Path(args.cache_dir)
    if args.env_cache_dir:
        return Path(args.env_cache_dir)
    return default_cache_dir(args.env)
