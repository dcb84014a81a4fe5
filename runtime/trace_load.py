"""serve-bench's `--trace` argument: a file (any format) or a synthetic trace, scaled in rate
and length to fit the machine."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.trace_synth import Arrivals, profile_trace
from sandwich.runtime.traces import (
    TraceEntry,
    clip,
    detect_format,
    read_trace,
    scale,
    synthetic_trace,
)


@dataclass(frozen=True)
class TraceOptions:
    """How to build a trace. rate/arrivals drive synthetic and ShareGPT arrivals; rate_scale
    speeds up a file's own arrivals; length_scale shrinks every length (a 2-core machine
    cannot replay 1500-token prompts at production rates); clip_files cuts file requests to
    max_seq instead of letting the engine fail those that do not fit."""

    rate: float = 1.0
    duration_s: float = 10.0
    seed: int = 0
    max_seq: int = 256
    arrivals: Arrivals = field(default_factory=Arrivals)
    length_scale: float = 1.0
    rate_scale: float = 1.0
    clip_files: bool = False
    fmt: str | None = None  # None: from the file name / content
    prompt_mean: float = 32.0  # plain 'synthetic' only
    output_mean: float = 16.0
    tokenizer: object | None = None  # ShareGPT texts; None: word-count estimate


@dataclass(frozen=True)
class LoadedTrace:
    entries: list[TraceEntry]
    clipped: int  # requests cut to fit max_seq


def load_trace(spec: str, opts: TraceOptions) -> LoadedTrace:
    """'synthetic' (geometric lengths of the given means), 'synthetic:PROFILE' (trace_synth
    PROFILES) or a trace file, cut at opts.duration_s."""
    if spec == "synthetic":
        return LoadedTrace(*_geometric(opts))
    if spec.startswith("synthetic:"):
        return LoadedTrace(*profile_trace(
            spec.partition(":")[2], rate=opts.rate, duration_s=opts.duration_s, seed=opts.seed,
            max_seq=opts.max_seq, arrivals=opts.arrivals, length_scale=opts.length_scale))
    fmt = opts.fmt or detect_format(spec)
    if fmt == "sharegpt":  # tokenize no more conversations than are replayed
        from sandwich.runtime.trace_sharegpt import read_sharegpt

        entries = read_sharegpt(spec, rate=opts.rate, seed=opts.seed, arrivals=opts.arrivals,
                                tokenizer=opts.tokenizer, until_s=opts.duration_s * opts.rate_scale)
    else:
        entries = read_trace(spec, fmt=fmt)
    entries = [e for e in scale(entries, rate_scale=opts.rate_scale,
                                length_scale=opts.length_scale) if e.arrival_s < opts.duration_s]
    if opts.clip_files:
        return LoadedTrace(*clip(entries, opts.max_seq))
    return LoadedTrace(entries, 0)


def _geometric(opts: TraceOptions) -> tuple[list[TraceEntry], int]:
    """Today's 'synthetic' trace; with Poisson arrivals exactly the trace it always was."""
    mean_in, mean_out = opts.prompt_mean * opts.length_scale, opts.output_mean * opts.length_scale
    if opts.arrivals.kind == "poisson":
        return synthetic_trace(rate=opts.rate, duration_s=opts.duration_s, seed=opts.seed,
                               prompt_mean=max(1.0, mean_in), output_mean=max(1.0, mean_out),
                               max_seq=opts.max_seq), 0
    if not opts.duration_s > 0 or opts.max_seq < 2:
        raise ConfigError(f"--duration must be > 0 and max_seq >= 2, got {opts.duration_s} and "
                          f"{opts.max_seq}")
    rng = np.random.default_rng(opts.seed)
    times = opts.arrivals.times(rng, opts.rate, duration_s=opts.duration_s)
    n = rng.geometric(1.0 / max(1.0, mean_in), len(times))
    m = rng.geometric(1.0 / max(1.0, mean_out), len(times))
    return clip([TraceEntry(t, int(a), int(b)) for t, a, b in zip(times, n, m, strict=True)], opts.max_seq)
