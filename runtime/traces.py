"""Request traces for serve-bench: the entry type, JSON Lines, picking a format, rate and
length scaling, and turning entries into engine requests.

Formats (one module each): JSON Lines (here), the Azure LLM inference CSV
(trace_azure.py), ShareGPT conversations (trace_sharegpt.py), synthetic arrivals and
lengths (trace_synth.py). Every file reader stops at the first bad line with
`FILE:LINE: reason` (a TraceError); arrivals must not go backwards, since a replay of a
file someone sorted wrongly would measure another workload without saying so.

JSON Lines: one object per line: `arrival_s` (seconds from the start, >= 0),
`prompt_len` (int >= 1) or `prompt_ids` (list of token ids), and `output_len` (int >= 1,
the max_new_tokens). Blank lines and lines starting with '#' are skipped; other keys are
refused so typos do not pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.engine import Request

_KEYS = {"arrival_s", "prompt_len", "prompt_ids", "output_len"}
FORMATS = ("jsonl", "azure", "sharegpt")


class TraceError(ConfigError):
    """A trace file is missing or has a malformed line."""


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace; prompt_ids None means random ids of prompt_len."""

    arrival_s: float
    prompt_len: int
    output_len: int
    prompt_ids: tuple[int, ...] | None = None


def read_text(path: str | Path) -> str:
    """The file as text, or a TraceError saying why not."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{p}: not UTF-8 text (byte {e.start}); give a trace file "
                         f"({', '.join(FORMATS)}) or 'synthetic'") from None
    except OSError as e:
        raise TraceError(f"{p}: cannot read the trace ({e.strerror}); give a trace file "
                         f"({', '.join(FORMATS)}) or 'synthetic'") from None


def check_order(entries: list[tuple[int, TraceEntry]], path: str | Path) -> list[TraceEntry]:
    """The entries of (line, entry) pairs, refusing an empty trace or an arrival that goes
    backwards (named by its line)."""
    if not entries:
        raise TraceError(f"{path}:1: the trace has no requests")
    for (la, a), (lb, b) in pairwise(entries):
        if b.arrival_s < a.arrival_s:
            raise TraceError(f"{path}:{lb}: arrival {b.arrival_s:g} s is before line {la}'s "
                             f"{a.arrival_s:g} s; sort the trace by arrival time")
    return [e for _, e in entries]


def _entry(obj, where: str) -> TraceEntry:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    extra = sorted(set(obj) - _KEYS)
    if extra:
        raise TraceError(f"{where}: unknown key {extra[0]!r} (allowed: {', '.join(sorted(_KEYS))})")
    missing = [k for k in ("arrival_s", "output_len") if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing {missing[0]!r}")
    arrival, out = obj["arrival_s"], obj["output_len"]
    if not isinstance(arrival, (int, float)) or isinstance(arrival, bool) or not arrival >= 0:
        raise TraceError(f"{where}: 'arrival_s' must be a number >= 0, got {arrival!r}")
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise TraceError(f"{where}: 'output_len' must be an integer >= 1, got {out!r}")
    ids = obj.get("prompt_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise TraceError(f"{where}: 'prompt_ids' must be a non-empty list of token ids >= 0")
        return TraceEntry(float(arrival), len(ids), out, tuple(ids))
    n = obj.get("prompt_len")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise TraceError(f"{where}: needs 'prompt_len' (an integer >= 1) or 'prompt_ids', got {n!r}")
    return TraceEntry(float(arrival), n, out)


def read_jsonl(path: str | Path) -> list[TraceEntry]:
    """Parse a JSON Lines trace; the first bad line raises TraceError."""
    p = Path(path)
    out = []
    for i, line in enumerate(read_text(p).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise TraceError(f"{p}:{i}: not valid JSON ({e.msg})") from None
        out.append((i, _entry(obj, f"{p}:{i}")))
    return check_order(out, p)


def detect_format(path: str | Path) -> str:
    """jsonl, azure or sharegpt: from the suffix (.jsonl, .csv, .json), else the content."""
    p = Path(path)
    by_suffix = {".jsonl": "jsonl", ".csv": "azure", ".json": "sharegpt"}
    if p.suffix.lower() in by_suffix:
        return by_suffix[p.suffix.lower()]
    head = read_text(p).lstrip()[:200]
    if head.startswith("["):
        return "sharegpt"
    if head.upper().startswith("TIMESTAMP") or "ContextTokens" in head.split("\n", 1)[0]:
        return "azure"
    return "jsonl"


def read_trace(path: str | Path, *, fmt: str | None = None, rate: float = 1.0, seed: int = 0,
               arrivals=None, tokenizer=None) -> list[TraceEntry]:
    """Parse a trace file in `fmt` (None: detect_format), in arrival order. rate, seed,
    arrivals and tokenizer serve ShareGPT, whose files carry no times or token counts."""
    fmt = fmt or detect_format(path)
    if fmt == "jsonl":
        return read_jsonl(path)
    if fmt == "azure":
        from sandwich.runtime.trace_azure import read_azure_csv

        return read_azure_csv(path)
    if fmt == "sharegpt":
        from sandwich.runtime.trace_sharegpt import read_sharegpt

        return read_sharegpt(path, rate=rate, seed=seed, arrivals=arrivals, tokenizer=tokenizer)
    raise ConfigError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")


def mean_rate(entries: list[TraceEntry]) -> float:
    """Requests per second between the first and the last arrival (inf if they coincide)."""
    if len(entries) < 2:
        raise ConfigError("a rate needs at least two requests in the trace")
    span = entries[-1].arrival_s - entries[0].arrival_s
    return (len(entries) - 1) / span if span > 0 else float("inf")


def scale(entries: Iterable[TraceEntry], *, rate_scale: float = 1.0,
          length_scale: float = 1.0) -> list[TraceEntry]:
    """Arrivals divided by rate_scale (x2 = twice the requests per second); prompt and output
    lengths times length_scale, at least 1 each (prompt ids keep their first tokens)."""
    if not rate_scale > 0 or not length_scale > 0:
        raise ConfigError(f"rate and length scales must be > 0, got {rate_scale} and {length_scale}")
    out = []
    for e in entries:
        n = max(1, round(e.prompt_len * length_scale))
        ids = e.prompt_ids[:n] if e.prompt_ids is not None else None
        out.append(replace(e, arrival_s=e.arrival_s / rate_scale, prompt_len=n if ids is None
                           else len(ids), output_len=max(1, round(e.output_len * length_scale)),
                           prompt_ids=ids))
    return out


def clip(entries: Iterable[TraceEntry], max_seq: int) -> tuple[list[TraceEntry], int]:
    """Each request cut to fit max_seq cache positions (prompt <= max_seq, then output);
    returns the entries and how many were cut."""
    out, cut = [], 0
    for e in entries:
        n = min(e.prompt_len, max_seq)
        new = max(1, min(e.output_len, max_seq - n + 1))
        if (n, new) != (e.prompt_len, e.output_len):
            cut += 1
            e = replace(e, prompt_len=n, output_len=new,
                        prompt_ids=e.prompt_ids[:n] if e.prompt_ids is not None else None)
        out.append(e)
    return out, cut


def synthetic_trace(*, rate: float, duration_s: float, seed: int, prompt_mean: float,
                    output_mean: float, max_seq: int) -> list[TraceEntry]:
    """Poisson arrivals at `rate` req/s over [0, duration); geometric prompt and output lengths
    with the given means, clipped so each request fits max_seq."""
    if rate <= 0 or duration_s <= 0:
        raise ConfigError(f"--rate and --duration must be > 0, got {rate} and {duration_s}")
    if prompt_mean < 1 or output_mean < 1 or max_seq < 2:
        raise ConfigError("prompt and output means must be >= 1 and max_seq >= 2")
    rng = np.random.default_rng(seed)
    out, t = [], float(rng.exponential(1.0 / rate))
    while t < duration_s:
        n = int(min(rng.geometric(1.0 / prompt_mean), max_seq - 1))
        new = int(min(rng.geometric(1.0 / output_mean), max_seq - n + 1))
        out.append(TraceEntry(t, n, new))
        t += float(rng.exponential(1.0 / rate))
    return out


def to_requests(entries: list[TraceEntry], *, vocab_size: int, seed: int,
                temperature: float = 0.0) -> list[Request]:
    """Requests with seeded random prompt ids where the trace gives only lengths."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i, e in enumerate(entries):
        ids = e.prompt_ids or tuple(int(x) for x in rng.integers(0, vocab_size, e.prompt_len))
        reqs.append(Request(prompt=ids, max_new_tokens=e.output_len, temperature=temperature,
                            seed=seed + i, rid=i))
    return reqs
