"""Options and settings every command group shares: the kernel cache and the thread count."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", help="kernel cache directory (default: $SANDWICHC_CACHE_DIR or "
                   "~/.cache/sandwichc)")


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="threads the kernels run with (default: all cores of this process)")


def threads_of(args) -> int:
    """--threads, else TVM_NUM_THREADS as the CLI set it before TVM started, else 1."""
    return args.threads or int(args.env.get("TVM_NUM_THREADS", "1"))


def add_weights_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", default="auto", type=_weights_format, metavar="FORMAT",
                   help="how the GEMMs store their weights: auto (default: a GGUF file's own "
                   "format, the one most of its weights are stored in, e.g. int4-k for Q4_K, "
                   "int4-g32-asym for Q4_1, int8-g32 for Q8_0; fp32 for anything else), fp32, bf16 "
                   "(activations rounded to bf16 too: vdpbf16ps where the CPU has avx512_bf16), "
                   "int8-g32 (llama.cpp's Q8_0), int8 (a scale per column), int4 (= int4-g32, "
                   "Q4_0), int4-g64, int4-g128, int4-g32-asym (Q4_1), int4-k (Q4_K: K a multiple "
                   "of 256), int5-k (Q5_K) and int6-k (Q6_K): likewise, OP=FORMAT overrides such as "
                   "int4-k,lm_head=int6-k; int formats "
                   "dequantize in the kernel")


def resolve_weights(args) -> None:
    """Replace `--weights auto` by the format it means for `--model` (see weight_choice);
    `say_weights` tells the user once the command gets to the model. A spec named outright
    that is the one auto gives a GGUF file (every tensor as stored) also has llama.cpp
    compare on that file (`weights_auto`), not on one its quantizer makes."""
    weights = getattr(args, "weights", None)
    if weights is None:
        return
    from sandwich.errors import ConfigError
    from sandwich.weight_choice import auto_weights

    model = getattr(args, "model", None)
    tp = getattr(args, "tp", 1)
    tp = tp if isinstance(tp, int) and tp > 0 else 1  # a bad --tp is its command's error
    if weights != "auto":
        args.weights_auto = _as_stored(model, weights, tp)
        return
    choices = [auto_weights(m, tp) for m in (model if isinstance(model, list) else [model])] or [
        auto_weights(None)]  # `bench serving` takes several models: one format for the run
    if len({c.weights for c in choices}) > 1:
        raise ConfigError(f"--weights auto gives these models different formats "
                          f"({', '.join(sorted({c.weights for c in choices}))}); name one with --weights")
    choice = choices[0]
    args.weights = choice.weights
    args.weights_choice = choice if choice.from_file and choice.weights != "fp32" else None
    args.weights_auto = choice.from_file  # llama.cpp compares on the same file


def _as_stored(model, weights: str, tp: int) -> bool:
    """Whether `weights` is what `--weights auto` runs every GGUF file of `model` in. Never
    for fp32 named outright: auto gives a file of mixed types fp32 too, which runs its Q8_0 or
    F16 tensors widened where llama.cpp on the file would run them as stored, so llama.cpp
    compares on an F32 export of the same tensors (on a Q8_0 tiny GGUF the two perplexities
    were 0.5% apart, against 1e-6 on the export)."""
    from sandwich.errors import ConfigError
    from sandwich.gguf_config import is_gguf
    from sandwich.weight_choice import auto_weights
    from sandwich.weight_formats import parse_weights

    models = model if isinstance(model, list) else [model]
    try:
        name = parse_weights(weights).name
        return bool(models) and name != "fp32" and all(
            is_gguf(m) and auto_weights(m, tp).weights == name for m in models)
    except ConfigError:  # a missing or damaged file: its command says so when it loads it
        return False


def say_weights(args) -> None:
    """On stderr, once: what `--weights auto` chose for a GGUF file and which of its
    tensors load as stored (nothing where it runs in fp32: every type converts exactly)."""
    choice = getattr(args, "weights_choice", None)
    if choice is not None:
        print(f"sandwichc: --weights auto runs this file in {choice.describe()} (name a "
              f"format with --weights to choose another)", file=sys.stderr)
        args.weights_choice = None


def add_kv_cache_dtype_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache-dtype", choices=("f32", "bf16"), default="f32",
                   help="element type of the KV cache: f32, or bf16 (K/V rounded to bf16 as they "
                   "are written: half the memory, and half the bytes a decode step reads of it)")


def _weights_format(name: str) -> str:
    """argparse type: the canonical format name, or argparse's one-line error."""
    from sandwich.errors import ConfigError
    from sandwich.weight_formats import parse_weights

    if name.strip().lower() == "auto":
        return "auto"
    try:
        return parse_weights(name).name
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0: the system picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0-65535, got {port}")
    return port


def cache_dir_arg(args) -> Path:
    """--cache-dir, else $SANDWICHC_CACHE_DIR, else the user's cache directory."""
    from sandwich.tuner.kernel_cache import default_cache_dir

    if getattr(args, "cache_dir", None):
        return Path(args.cache_dir)
    if args.env_cache_dir:
        return Path(args.env_cache_dir)
    return default_cache_dir(args.env)


def int_list(text: str, flag: str) -> list[int]:
    """A comma-separated list as sorted distinct positive integers, or a one-line error
    naming the flag."""
    from sandwich.errors import ConfigError

    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise ConfigError(f"{flag} values must be >= 1, got {text!r}")
    return values


def read_text(path: str, what: str | None = None) -> str:
    """A UTF-8 text file the user named, or a one-line error saying which (`what`: the flag)."""
    from sandwich.errors import ConfigError

    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        where = f"{what} {path}" if what else path
        raise ConfigError(f"{where}: cannot read it as UTF-8 text ({e})") from None


def command_line() -> str:
    """The command as typed, quoted, for a results file's "Regenerate" line."""
    import shlex
    import sys

    return "sandwichc " + " ".join(map(shlex.quote, sys.argv[1:]))
