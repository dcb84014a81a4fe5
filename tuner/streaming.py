"""Weights streamed past the last-level cache: how the tuner and the benchmarks time decode,
which reads every weight from DRAM once per token, and prefill's GEMMs whose weights are
too large to stay cached in a model."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

_FALLBACK_LLC = 32 << 20  # used only when neither sysfs nor lscpu reports an LLC


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text)
    if not m:
        raise ValueError(text)
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def llc_bytes() -> int:
    """Size of the last-level cache (one instance), from sysfs, else lscpu, else 32 MiB."""
    best = (0, 0)
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            best = max(best, (int((d / "level").read_text()), _parse_size((d / "size").read_text())))
        except (OSError, ValueError):
            continue
    if best[1]:
        return best[1]
    try:
        out = subprocess.run(["lscpu", "-B"], capture_output=True, text=True, check=True).stdout
        sizes = [int(m.group(2)) // int(m.group(3) or 1)
                 for m in re.finditer(r"^L(\d) cache:\s*(\d+)(?:\s*\((\d+) instances?\))?", out, re.M)]
        if sizes:
            return max(sizes)
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    return _FALLBACK_LLC


ROTATION_BYTES = 1 << 30  # past this, a rotation takes twice the LLC, not `factor` times


def rotation_bytes(llc_bytes: int, *, factor: int = 8) -> int:
    """Bytes a rotation cycles through so that its reads come from DRAM: `factor` times the
    LLC, but past 1 GiB only twice the LLC. A Sapphire Rapids VM reports a 480 MiB LLC and
    read at the DRAM rate from 256 MiB up (2 threads: 49.6-49.9 GB/s at 64-128 MiB, 33.3 at
    256 MiB, 30.2-31.1 at 512 MiB to 3.75 GiB); 8x its LLC made `bench gemm` cycle 3.75 GiB
    a decode row (90 minutes for two models). Where 8x the LLC is at most 1 GiB (an LLC up
    to 128 MiB) nothing changes."""
    return min(factor * llc_bytes, max(ROTATION_BYTES, 2 * llc_bytes))


def rotation_copies(weight_bytes: int, llc_bytes: int, *, factor: int = 8) -> int:
    """How many weight copies make the rotation `rotation_bytes` (at least 2)."""
    return max(2, math.ceil(rotation_bytes(llc_bytes, factor=factor) / max(1, weight_bytes)))


LARGE_SHARE = 8  # weights of 1/8 of the LLC and more are timed from DRAM at every M
# What a record's timing means, part of the kernel cache's key: schedules timed another way
# rank as no model runs them, so a change here re-tunes every cache. 2: large weights are
# timed from DRAM at every M (before, only at M <= 8).
TIMING_VERSION = 2


def from_dram(m: int, weight_bytes: int, llc: int, *, skinny_m: int = 8) -> bool:
    """Whether the tuner times a GEMM at M with its weights read from DRAM (rotated over
    copies) rather than cache-resident: at decode's M (<= `skinny_m`) always, and at every M
    when the weights are 1/`LARGE_SHARE` of the LLC or more. In a model the other layers'
    weights pass through the cache between two calls, so a schedule that reads such weights
    once per slice of M rows reads them from DRAM each time. Timed hot, the weights stayed in
    the LLC between slices: on Zen 4 the int8 gate_up of Sheared-LLaMA's shapes (22.5 MB, a
    32 MiB L3) ran at M = 128 in 13 ms alone and 26 ms in the model."""
    return m <= skinny_m or weight_bytes * LARGE_SHARE >= llc
