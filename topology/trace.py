"""Token traces for the latency simulator: (prompt length, output length) per request."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError


@dataclass(frozen=True)
class Trace:
    """Requests as (prompt tokens, output tokens); `source` says where they came from."""

    requests: tuple[tuple[int, int], ...]
    source: str


def synthetic_trace(n: int = 16, *, seed: int = 0) -> Trace:
    """Log-normal prompt (median ~400) and output (median ~100) lengths, fixed seed."""
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(np.log(400), 0.6, n), 16, 2048).astype(int)
    outputs = np.clip(rng.lognormal(np.log(100), 0.5, n), 8, 512).astype(int)
    return Trace(tuple(zip(prompts.tolist(), outputs.tolist(), strict=True)), f"synthetic(n={n}, seed={seed})")


def load_trace(spec: str) -> Trace:
    """`synthetic`, or a file: JSON/JSONL of {"prompt": p, "output": o} (or [p, o]), or CSV p,o."""
    if spec == "synthetic":
        return synthetic_trace()
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"trace {spec!r}: not a file and not 'synthetic'; pass a JSON or CSV trace")
    text = path.read_text()
    try:
        if path.suffix == ".csv":
            rows = [r for r in csv.reader(text.splitlines()) if r and not r[0].strip().startswith("#")]
            if rows and not rows[0][0].strip().lstrip("-").isdigit():
                rows = rows[1:]  # header
            items: list = [[int(r[0]), int(r[1])] for r in rows]
        elif path.suffix == ".jsonl":
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            items = json.loads(text)
        reqs = tuple(_pair(x) for x in items)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ConfigError(f"trace {spec}: cannot read requests ({e}); expected prompt,output pairs") from None
    if not reqs:
        raise ConfigError(f"trace {spec}: no requests; add at least one prompt,output pair")
    if any(p < 1 or o < 1 for p, o in reqs):
        raise ConfigError(f"trace {spec}: prompt and output lengths must be >= 1")
    return Trace(reqs, str(path))


def _pair(x) -> tuple[int, int]:
    if isinstance(x, dict):
        return int(x["prompt"]), int(x["output"])
    return int(x[0]), int(x[1])
