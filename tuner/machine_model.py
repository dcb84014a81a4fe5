"""The machine model: what one core of this CPU does, measured rather than assumed.

FMA latency and throughput (how many independent accumulators reach the peak), the rate of
a GEMM's register tile fed from L1 (how much of that peak loads leave), read
bandwidth from L1, L2 and DRAM, the caches' sizes and associativity, and the GFLOPS of the
tallest register tile of each weight-panel width. The tuner derives its weight layout from
these figures (`space.pack_width`), so no constant names a vendor or a CPU model. Measured
once per target fingerprint and kept beside the tuning database.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from sandwich.compiler.target import CpuInfo
from sandwich.errors import BuildError, ConfigError
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization

MODEL_VERSION = 4  # bump when what is measured, or how, changes: older files are re-measured
PEAK_SHARE = 0.95  # a chain count within this of the best rate counts as reaching the peak
PROBE_SHAPE = (256, 768, 768)  # (M, N, K) of the panel probe: N divides 1..4 vectors of 4..16 lanes


@dataclass(frozen=True)
class MachineModel:
    """One core's measured figures (1 thread), with the caches as sysfs describes them."""

    fingerprint: str
    lanes: int
    registers: int
    chain_gflops: tuple[float, ...]  # GFLOPS with 1, 2, ... independent FMA chains
    l1_read_gbs: float
    l2_read_gbs: float
    dram_read_gbs: float
    l1d_bytes: int
    l2_bytes: int
    llc_bytes: int
    l1d_ways: int
    l2_ways: int
    cache_line: int
    panel_gflops: dict[int, float] = field(default_factory=dict)  # vectors per panel -> GFLOPS
    tile_gflops: float = 0.0  # a GEMM's register tile with every load an L1 hit (mb_tile)
    date: str = ""
    version: int = MODEL_VERSION

    @property
    def peak_gflops(self) -> float:
        return max(self.chain_gflops)

    @property
    def fma_latency_ns(self) -> float:
        """One chain issues one vector FMA per latency (2 x lanes flops)."""
        return 2 * self.lanes / self.chain_gflops[0]

    @property
    def accumulators(self) -> int:
        """Independent accumulators that reach the FMA peak: latency x throughput."""
        best = self.peak_gflops
        return next(c for c, g in enumerate(self.chain_gflops, 1) if g >= PEAK_SHARE * best)

    def to_json(self) -> dict:
        return asdict(self) | {"panel_gflops": {str(v): g for v, g in self.panel_gflops.items()}}

    @classmethod
    def from_json(cls, d: dict) -> MachineModel:
        d = dict(d)
        d["chain_gflops"] = tuple(float(g) for g in d["chain_gflops"])
        d["panel_gflops"] = {int(v): float(g) for v, g in d.get("panel_gflops", {}).items()}
        model = cls(**d)
        if not model.chain_gflops or min(model.chain_gflops) <= 0:
            raise ValueError("chain_gflops must be positive")
        return model

    def summary(self) -> dict[str, str]:
        """The figures `sandwichc info` prints, one line each."""
        def kib(b: int) -> str:
            return f"{b >> 10} KiB" if b < 1 << 20 else f"{b >> 20} MiB"

        panels = ", ".join(f"{v} x {self.lanes}: {g:.1f}" for v, g in sorted(self.panel_gflops.items()))
        return {
            "fma peak (1 core)": f"{self.peak_gflops:.1f} GFLOPS",
            "fma latency": f"{self.fma_latency_ns:.2f} ns",
            "accumulators for peak": f"{self.accumulators} (GFLOPS by chains: "
                                     + " ".join(f"{g:.0f}" for g in self.chain_gflops) + ")",
            "read bandwidth (1 core)": f"L1 {self.l1_read_gbs:.0f} GB/s, L2 {self.l2_read_gbs:.0f} "
                                       f"GB/s, DRAM {self.dram_read_gbs:.1f} GB/s",
            "caches": f"L1d {kib(self.l1d_bytes)} {self.l1d_ways}-way, L2 {kib(self.l2_bytes)} "
                      f"{self.l2_ways}-way, LLC {kib(self.llc_bytes)}, line {self.cache_line} B",
            "L1-fed tile (1 core)": (f"{self.tile_gflops:.1f} GFLOPS, {self.tile_gflops / self.peak_gflops:.0%} "
                                     "of the FMA peak (a GEMM's inner loop, every load an L1 hit)"
                                     if self.tile_gflops > 0 else "not measured"),
            "panel probe (GFLOPS)": panels or "not measured",
            "measured": f"{self.date} (model v{self.version})",
        }


def _cache_ways(level: int) -> int:
    """Associativity of cpu0's data (or unified) cache at `level`, 0 when sysfs does not say."""
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((d / "level").read_text()) == level and \
                    (d / "type").read_text().strip() != "Instruction":
                return int((d / "ways_of_associativity").read_text())
        except (OSError, ValueError):
            continue
    return 0


def measure_chains(registers: int, *, iters: int = 1_000_000) -> tuple[float, ...]:
    """GFLOPS of 1, 2, ... independent FMA chains, as many as the registers hold."""
    from sandwich.tuner.machine_bench import fma_chain_gflops, max_chains

    return tuple(fma_chain_gflops(c, iters=iters) for c in range(1, max_chains(registers) + 1))


def _probe_slices(mk: MicroKernel, shape: tuple[int, int, int]) -> list[ComputeSlice]:
    """A fixed grid of one-thread cache blocks for a tile: row blocks of 4 and 16 tiles,
    column blocks of 2 and 8 tiles, depths of 128, 256 and 512 (clamped to the shape)."""
    from sandwich.tuner.space import clamp, slice_caps

    m, n, k = shape
    caps = slice_caps(m, n, k, mk, Polymerization(1, 1, 1))
    return list(dict.fromkeys(clamp(ComputeSlice(mk.mu_m * bm, mk.mu_n * bn, bk), caps)
                              for bm in (4, 16) for bn in (2, 8) for bk in (128, 256, 512)))


def probe_panels(cpu: CpuInfo, accumulators: int, *, shape: tuple[int, int, int] = PROBE_SHAPE,
                 rounds: int = 5, keep: int = 3) -> dict[int, float]:
    """GFLOPS of one thread per weight-panel width (1 to 4 vectors), each with its tallest
    register tile: which panel feeds the FMA units best is what the loads per FMA, the
    L1/L2 traffic of a panel row and the prefetchers make of a tile, so it is timed, not
    derived. Every width is timed on the same fixed grid of slices (a search per width
    found other slices on each run and moved a width's figure by 20%); each width's `keep`
    best go on to `rounds` interleaved rounds, and a width's figure is the best median. A
    width whose tallest tile holds fewer accumulators than the FMA units need is not tried."""
    import statistics

    from sandwich.tuner.space import Isa, tallest_rows
    from sandwich.tuner.tvm_measure import TvmMeasure

    isa = Isa(cpu.lanes_f32, cpu.vector_registers)
    m, n, k = shape
    finalists: list[tuple[int, TvmMeasure, KernelSchedule]] = []
    for vec in (4, 3, 2, 1):
        rows = tallest_rows(isa, vec)
        if rows < 1 or rows * vec < accumulators or n % (vec * isa.lanes):
            continue
        pack = vec * isa.lanes
        measure = TvmMeasure(cpu, 1, n, k, pack, m)
        mk = MicroKernel(rows, pack)
        timed = [(measure(s, m).gflops, s) for s in
                 (KernelSchedule(mk, sl, Polymerization(1, 1, 1), pack)
                  for sl in _probe_slices(mk, shape))]
        best = sorted((t for t in timed if t[0] > 0), key=lambda t: -t[0])[:keep]
        finalists += [(vec, measure, s) for _, s in best]
    runs: list[list[float]] = [[] for _ in finalists]
    for _ in range(rounds):
        for run, (_, measure, schedule) in zip(runs, finalists, strict=True):
            run.append(measure(schedule, m).gflops)
    out: dict[int, float] = {}
    for run, (vec, _, _) in zip(runs, finalists, strict=True):
        out[vec] = max(out.get(vec, 0.0), statistics.median(run))
    return {vec: round(g, 2) for vec, g in out.items()}


def measure_model(cpu: CpuInfo, fingerprint: str, *,
                  log: Callable[[str], None] = lambda _: None) -> MachineModel:
    """Measure every figure on one thread (about 20 s on a 2-core Zen 3, most of it the
    panel probe's builds)."""
    from sandwich.tuner.machine_bench import default_read_bytes, read_bandwidth_gbs, tile_gflops
    from sandwich.tuner.streaming import llc_bytes

    log("machine model: FMA chains, and a register tile fed from L1")
    chains = measure_chains(cpu.vector_registers)
    tile = tile_gflops(1)
    log("machine model: read bandwidth from L1, L2 and DRAM")
    l1, l2 = cpu.l1d_bytes or 32 << 10, cpu.l2_bytes or 1 << 20
    one = (1,)
    l1_gbs = read_bandwidth_gbs(1, size_bytes=l1 // 2, streams=one)
    l2_gbs = read_bandwidth_gbs(1, size_bytes=l2 // 2, streams=one)
    dram_gbs = read_bandwidth_gbs(1, size_bytes=default_read_bytes(), repeat=3)
    model = MachineModel(
        fingerprint=fingerprint, lanes=cpu.lanes_f32, registers=cpu.vector_registers,
        chain_gflops=tuple(round(g, 2) for g in chains), l1_read_gbs=round(l1_gbs, 1),
        l2_read_gbs=round(l2_gbs, 1), dram_read_gbs=round(dram_gbs, 2), l1d_bytes=l1,
        l2_bytes=l2, llc_bytes=cpu.l3_bytes or llc_bytes(), l1d_ways=_cache_ways(1),
        l2_ways=_cache_ways(2), cache_line=cpu.cache_line, tile_gflops=round(tile, 2),
        date=datetime.date.today().isoformat())
    log("machine model: the tallest register tile of each weight-panel width, on a grid of slices")
    return replace(model, panel_gflops=probe_panels(cpu, model.accumulators))


def model_path(cache_dir: Path, fingerprint: str) -> Path:
    return Path(cache_dir) / "machine" / f"{fingerprint}.json"


def load_model(cache_dir: Path, fingerprint: str) -> MachineModel | None:
    """The stored model of this target, or None when there is none, it is from an older
    version, or it is damaged (it is then measured again; nothing else depends on it)."""
    path = model_path(cache_dir, fingerprint)
    try:
        model = MachineModel.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):  # absent, unreadable or damaged
        return None
    if model.version != MODEL_VERSION or model.fingerprint != fingerprint:
        return None
    return model


def save_model(cache_dir: Path, model: MachineModel) -> Path:
    """Write atomically: a reader sees the old file or the new one."""
    path = model_path(cache_dir, model.fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(model.to_json(), f, indent=1)
    os.replace(tmp, path)
    return path


def machine_model(cache_dir: Path, cpu: CpuInfo, fingerprint: str, *, remeasure: bool = False,
                  log: Callable[[str], None] = lambda _: None) -> MachineModel | None:
    """The stored model, else measured now and stored. None where the micro-benchmarks
    cannot run (no gcc, a CPU without AVX2): the tuner then falls back to the register
    file alone, and says so."""
    model = None if remeasure else load_model(cache_dir, fingerprint)
    if model is not None:
        return model
    try:
        model = measure_model(cpu, fingerprint, log=log)
    except (BuildError, ConfigError) as e:
        log(f"machine model not measured ({e}); the weight layout follows the register file")
        return None
    save_model(cache_dir, model)
    return model
