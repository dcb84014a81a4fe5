"""Machine limits for the GEMM benchmark: fp32 FMA peak (GFLOPS), the rate of a register tile fed
from L1 (GFLOPS) and streaming-read bandwidth (GB/s)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sandwich.tuner.machine_bench import (
    check_threads,
    default_read_bytes,
    isa_flags,
    peak_gflops,
    read_bandwidth_gbs,
    tile_gflops,
)
from sandwich.tuner.streaming import llc_bytes


@dataclass(frozen=True)
class MachineLimits:
    """What the GEMM benchmark divides by: the measured FMA peak and DRAM read bandwidth."""

    threads: int
    isa: str
    peak_gflops: float
    read_gbs: float
    llc_bytes: int
    read_buffer_bytes: int
    tile_gflops: float = 0.0  # a register tile on L1-resident data: the peak with a GEMM's loads

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> MachineLimits:
        return cls(**d)


def measure_machine(threads: int, *, read_size_bytes: int | None = None) -> MachineLimits:
    """Both limits for `threads` threads, as the benchmark JSON reports them."""
    check_threads(threads)
    isa, _ = isa_flags()
    size = read_size_bytes if read_size_bytes is not None else default_read_bytes()
    return MachineLimits(threads=threads, isa=isa, peak_gflops=peak_gflops(threads),
                         read_gbs=read_bandwidth_gbs(threads, size_bytes=size),
                         llc_bytes=llc_bytes(), read_buffer_bytes=size,
                         tile_gflops=tile_gflops(threads))
