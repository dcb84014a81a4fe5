"""Request traces for serve-bench: a JSON Lines file, or seeded synthetic Poisson arrivals.

One JSON object per line: `arrival_s` (seconds from the start, >= 0), `prompt_len` (int >= 1)
or `prompt_ids` (list of token ids), and `output_len` (int >= 1, the max_new_tokens). Blank
lines and lines starting with '#' are skipped; other keys are refused so typos do not pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.engine import Request

_KEYS = {"arrival_s", "prompt_len", "prompt_ids", "output_len"}


class TraceError(ConfigError):
    """A trace file is missing or has a malformed line."""


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace; prompt_ids None means random ids of prompt_len."""

    arrival_s: float
    prompt_len: int
    output_len: int
    prompt_ids: tuple[int, ...] | None = None


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


def read_trace(path: str | Path) -> list[TraceEntry]:
    """Parse a JSON Lines trace, sorted by arrival; the first bad line raises TraceError."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise TraceError(f"{p}: not UTF-8 text (byte {e.start}); give a JSON Lines file or "
                         f"'synthetic'") from None
    except OSError as e:
        raise TraceError(f"{p}: cannot read the trace ({e.strerror}); give a JSON Lines file or "
                         f"'synthetic'") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise TraceError(f"{p}:{i}: not valid JSON ({e.msg})") from None
        out.append(_entry(obj, f"{p}:{i}"))
    if not out:
        raise TraceError(f"{p}: the trace has no requests")
    return sorted(out, key=lambda e: e.arrival_s)


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
