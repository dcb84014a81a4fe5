"""The tuner's trial logs read back: every measured candidate as a `Sample`, for the cost model."""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

# a schedule's dtype: float32, or a weight format's name (bf16, int8, int8-g32, int4-g32-asym)
_DTYPE = r"[a-z]+\d+(?:-[a-z]+\d*)*"
# KernelSchedule.key(): gemm_float32_mk2x32_p1x2x1_n32_s4x32x256, gemm_int8-g32_mk4x64_...
_KEY = re.compile(rf"^(?P<op>\w+?)_(?P<dtype>{_DTYPE})_mk(\d+)x(\d+)_p(\d+)x(\d+)x(\d+)"
                  r"_n(\d+)_s(\d+)x(\d+)x(\d+)$")
# tune.py names a log n{N}_k{K}_{dtype}_t{threads}.jsonl under logs/<fingerprint>/
_FILE = re.compile(rf"^n(\d+)_k(\d+)_({_DTYPE})_t(\d+)$")


def parse_schedule_key(key: str) -> KernelSchedule:
    """The schedule `KernelSchedule.key()` names (ValueError when `key` is not one)."""
    hit = _KEY.match(key)
    if not hit:
        raise ValueError(f"not a schedule key: {key!r}")
    mu_m, mu_n, t_m, t_n, t_k, pack_n, b_m, b_n, b_k = (int(g) for g in hit.groups()[2:])
    if min(mu_m, mu_n, t_m, t_n, t_k, pack_n, b_m, b_n, b_k) < 1:
        raise ValueError(f"schedule key with a zero size: {key!r}")
    return KernelSchedule(MicroKernel(mu_m, mu_n), ComputeSlice(b_m, b_n, b_k),
                          Polymerization(t_m, t_n, t_k), pack_n, hit["op"], hit["dtype"])


@dataclass(frozen=True)
class Sample:
    """One candidate at one M of an (N, K): measured when gflops > 0, to be ranked otherwise.
    The thread count is the schedule's (its polymerization)."""

    schedule: KernelSchedule
    m: int
    n: int
    k: int
    gflops: float = 0.0
    phase: str = ""
    source: str = ""  # the log it came from (its file stem), for held-out evaluation

    @property
    def threads(self) -> int:
        return self.schedule.polymerization.threads

    @property
    def group(self) -> tuple[int, int, str, int, int]:
        """The candidates one search step ranks against each other: (N, K, dtype, threads, M)."""
        return self.n, self.k, self.schedule.dtype, self.threads, self.m


@dataclass(frozen=True)
class Trials:
    """What `read_trials` found: the samples, and how many lines it skipped as malformed."""

    samples: tuple[Sample, ...]
    skipped: int = 0
    files: int = 0


def _log_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*.jsonl") if _FILE.match(p.stem))


def _sample(line: str, n: int, k: int, dtype: str, threads: int, source: str) -> Sample:
    d = json.loads(line)
    schedule = parse_schedule_key(d["schedule"])
    m, gflops = d["m"], d["gflops"]
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError("bad m")
    if not isinstance(gflops, (int, float)) or isinstance(gflops, bool) or not gflops >= 0:
        raise ValueError("bad gflops")
    if schedule.dtype != dtype or schedule.polymerization.threads != threads:
        raise ValueError("schedule of another dtype or thread count than its log")
    return Sample(schedule, m, n, k, float(gflops), str(d.get("phase", "")), source)


def read_trials(path: str | Path) -> Trials:
    """Every trial in the JSONL logs under `path` (a fingerprint's log folder, the logs root,
    or one file). A line that is not JSON, lacks a field, names no schedule, or disagrees
    with its file's dtype or threads is skipped and counted; a log stopped mid-line by a
    killed tune ends in one such line. Files not named like tune.py's logs are ignored."""
    path = Path(path)
    out: list[Sample] = []
    skipped = 0
    files = _log_files(path) if path.exists() else []
    for f in files:
        n, k, dtype, threads = _FILE.match(f.stem).groups()  # type: ignore[union-attr]
        try:
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if not line.strip():
                continue
            try:
                out.append(_sample(line, int(n), int(k), dtype, int(threads), f.stem))
            except (ValueError, KeyError, TypeError, AttributeError):
                skipped += 1
    return Trials(tuple(out), skipped, len(files))


def merge_repeats(samples: Iterable[Sample]) -> list[Sample]:
    """One sample per (group, schedule) with the median of its timings: the search times its
    finalists again (confirm, interleaved rounds), and a repeat is not a new candidate."""
    runs: dict[tuple, list[Sample]] = {}
    for s in samples:
        runs.setdefault((*s.group, s.schedule.key(), s.source), []).append(s)
    return [replace(rs[0], gflops=statistics.median(r.gflops for r in rs)) for rs in runs.values()]


def data_fingerprint(samples: Iterable[Sample]) -> str:
    """A hash of what a model is trained on, independent of order (16 hex digits)."""
    lines = sorted(f"{s.n},{s.k},{s.threads},{s.m},{s.schedule.key()},{s.gflops!r}" for s in samples)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
