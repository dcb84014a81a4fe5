"""Machine micro-benchmarks (csrc/machine_bench.c, built with gcc at first use): fp32 FMA
peak, FMA chains, the bf16 dot-product peak where the CPU has one, the int formats' 8-bit dot
product peak, the dequantization sequences' rates (VOS), and read bandwidth from a buffer of
any size. The tuner's machine model and the benchmarks' limits are measured with them."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from sandwich.errors import BuildError, ConfigError
from sandwich.private_dir import private_dir
from sandwich.tuner.streaming import llc_bytes, rotation_bytes
from sandwich.tuner.timing import time_callable

_SOURCE = Path(__file__).with_name("csrc") / "machine_bench.c"
_MIB = 1 << 20
_MAX_THREADS = 1024  # MAX_THREADS in csrc/machine_bench.c


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError as e:
        raise BuildError(f"cannot read /proc/cpuinfo for the CPU flags: {e}") from e
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def isa_flags() -> tuple[str, list[str]]:
    """The widest vector ISA of this CPU that the micro-benchmarks support, and its gcc flags."""
    flags = _cpu_flags()
    if "avx512f" in flags:
        extra = {"avx512bw": "-mavx512bw", "avx512_vnni": "-mavx512vnni", "avx512_bf16": "-mavx512bf16"}
        amx = ["-mamx-tile", "-mamx-bf16"] if {"amx_tile", "amx_bf16"} <= flags else []
        return "avx512", ["-mavx512f"] + [flag for name, flag in extra.items() if name in flags] + amx
    if {"avx2", "fma"} <= flags:
        return "avx2", ["-mavx2", "-mfma"]
    raise BuildError("machine benchmark needs an x86 CPU with AVX2+FMA or AVX-512F")


def _cache_dir() -> Path:
    """A private dir under the temp dir (sandwich/private_dir.py): we load code from it."""
    try:
        return private_dir("csrc")
    except PermissionError as e:
        raise BuildError(str(e)) from None


@functools.lru_cache(maxsize=None)
def _library() -> tuple[ctypes.CDLL, str]:
    """Compile machine_bench.c once per (source, flags) into a private temp dir and load it."""
    isa, flags = isa_flags()
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("machine benchmark needs gcc (or cc) on PATH; install gcc")
    args = ["-O2", "-shared", "-fPIC", "-pthread", *flags]
    src = _SOURCE.read_bytes()
    key = hashlib.sha256(src + " ".join([cc, *args]).encode()).hexdigest()[:16]
    so = _cache_dir() / f"machine_bench-{key}.so"
    if not so.exists():
        tmp = so.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run([cc, *args, str(_SOURCE), "-o", str(tmp)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            first = (proc.stderr.strip().splitlines() or ["no output"])[0]
            raise BuildError(f"compiling {_SOURCE.name} with {cc} failed: {first}")
        os.replace(tmp, so)  # atomic: a concurrent reader sees the old or the new file
    lib = ctypes.CDLL(str(so))
    lib.mb_fma.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    lib.mb_fma_chains.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    lib.mb_tile.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    lib.mb_read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    for fn in (lib.mb_dpbf16, lib.mb_dpbusd, lib.mb_dot8_narrow, lib.mb_dot8_block,
               lib.mb_dot8_block_narrow, lib.mb_amx_bf16):
        fn.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    lib.mb_dequant.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long,
                               ctypes.POINTER(ctypes.c_float)]
    lib.mb_dequant_ops.argtypes = [ctypes.c_int]
    for fn in (lib.mb_fma, lib.mb_fma_chains, lib.mb_tile, lib.mb_tile_flops, lib.mb_read,
               lib.mb_lanes, lib.mb_fma_accs,
               lib.mb_read_block, lib.mb_max_chains, lib.mb_dpbf16, lib.mb_dpbusd,
               lib.mb_dot8_narrow, lib.mb_dot8_block, lib.mb_dot8_block_narrow, lib.mb_int8_lanes,
               lib.mb_int8_accs, lib.mb_dequant,
               lib.mb_dequant_kinds, lib.mb_dequant_ops, lib.mb_dequant_accs, lib.mb_amx_bf16,
               lib.mb_amx_accs):
        fn.restype = ctypes.c_int
    return lib, isa


def check_threads(threads: int) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= _MAX_THREADS:
        raise ConfigError(f"threads must be an integer in 1..{_MAX_THREADS}, got {threads!r}")


def default_read_bytes() -> int:
    """Read-buffer size: a rotation's (streaming.rotation_bytes: 8x the LLC, twice a large
    one) and at least 256 MiB, so the reads come from DRAM."""
    return max(rotation_bytes(llc_bytes()), 256 * _MIB)


def _check_rc(rc: int, what: str) -> None:
    if rc != 0:
        raise BuildError(f"{what} micro-benchmark failed with code {rc} (bad arguments or pthread_create)")


def peak_gflops(threads: int, *, iters: int = 3_000_000, repeat: int = 7) -> float:
    """Peak fp32 GFLOPS of `threads` threads, each running independent FMA chains: the best
    repeat, since another process only ever slows a repeat down (a median once read half
    the peak here while something else ran for a moment)."""
    check_threads(threads)
    return _peak("mb_fma", "FMA", 2.0, threads, iters, repeat)


def tile_gflops(threads: int, *, iters: int = 40_000, repeat: int = 7) -> float:
    """GFLOPS of `threads` threads, each running a GEMM's register tile on weights and
    activations that stay in L1 (csrc/machine_bench.c, mb_tile): the FMA peak with the loads
    a GEMM's inner loop cannot do without. The best repeat, as peak_gflops."""
    check_threads(threads)
    lib, _ = _library()
    # a pass is mb_tile_flops() / 2 multiply-adds: as _peak counts them, that many links a lane
    return _peak("mb_tile", "register tile", 2.0, threads, iters, repeat,
                 accs=lib.mb_tile_flops() // (2 * lib.mb_lanes()))


def peak_bf16_gflops(threads: int, *, iters: int = 3_000_000, repeat: int = 7) -> float | None:
    """Peak GFLOPS of vdpbf16ps (avx512_bf16: 2 bf16 products per f32 lane) on `threads`
    threads, as peak_gflops measures FMAs; None where the CPU has no avx512_bf16."""
    check_threads(threads)
    if "avx512_bf16" not in _cpu_flags():
        return None
    return _peak("mb_dpbf16", "bf16 dot", 4.0, threads, iters, repeat)


def peak_amx_bf16_gflops(threads: int, *, iters: int = 100_000, repeat: int = 7) -> float | None:
    """Peak GFLOPS of AMX's bf16 tile product (tdpbf16ps: 16 x 16 x 32 products into f32) on
    `threads` threads, 4 accumulator tiles each on operands loaded once: the matrix unit's
    rate, the MTX term of the AMX kernel's Roof-Surface bound. None where the CPU has no
    AMX-BF16. The process asks Linux for the tile state first (compiler/amx.py)."""
    from sandwich.compiler.amx import request_tiles

    check_threads(threads)
    lib, _ = _library()
    if lib.mb_amx_accs() == 0:
        return None
    request_tiles()
    # a link is one tile product: 16 x 16 f32 elements (the "lanes"), 32 products each
    return _peak("mb_amx_bf16", "AMX tile", 64.0, threads, iters, repeat, lanes=256,
                 accs=lib.mb_amx_accs())


def peak_int8_gops(threads: int, *, narrow: bool = False, iters: int = 3_000_000,
                   repeat: int = 7) -> float | None:
    """Peak G ops/s of the int formats' dot8 (vpdpbusd with AVX512-VNNI, else the bytes
    split into 16-bit pairs: an and, a shift and an and, 2 pmaddwd + 2 paddd; `narrow`: int4's
    as the kernel runs it without VNNI, weight bytes below 128 in a pmaddubsw and a paddw into
    16-bit sums, folded by a pmaddwd by ones every 8) on `threads` threads. A dot8 adds 4
    products of an unsigned and a signed byte to each 32-bit lane and each product counts a
    multiply and an add, as peak_gflops counts an FMA: 8 ops per lane, so dot8 instructions
    per second on L 32-bit lanes are this * 1e9 / (8 L). None on an AVX-512 CPU without
    AVX-512BW."""
    check_threads(threads)
    lib, _ = _library()
    lanes = lib.mb_int8_lanes()
    if lanes == 0:
        return None
    return _peak("mb_dot8_narrow" if narrow else "mb_dpbusd", "int8 dot", 8.0, threads, iters,
                 repeat, lanes=lanes, accs=lib.mb_int8_accs())


def int8_block_gops(threads: int, *, narrow: bool = False, iters: int = 400_000,
                    repeat: int = 7) -> float | None:
    """G ops/s of dot8 (8 a lane, as peak_int8_gops counts them) when it runs as the int
    formats' tile runs it: blocks of 8 dot8 per row and column vector, each block's sum then
    converted to f32 and scaled twice (vcvtdq2ps and 2 FMAs, a group of 32): where the dot8
    and the FMAs share ports (Zen 4's vpdpbusd) those 3 ops may cost as much as 3 dot8, where
    the dot8 is a longer integer sequence (2 pmaddwd + 2 paddd on a Zen 3) they may hide
    behind it. `narrow`: int4's h16 sequence. None where peak_int8_gops is None."""
    check_threads(threads)
    lib, _ = _library()
    lanes = lib.mb_int8_lanes()
    if lanes == 0:
        return None
    # a block is 8 dot8 of 8 ops a lane
    return _peak("mb_dot8_block_narrow" if narrow else "mb_dot8_block", "int8 block", 64.0,
                 threads, iters, repeat, lanes=lanes, accs=lib.mb_int8_accs())


# The dequantization sequences of csrc/machine_bench.c (DQ_*), in its order: the vector work
# one weight format does before its products (tuner/roofsurface.py: dequantization).
DEQUANT_KINDS = ("nibbles", "int8-widen", "int4-widen", "bf16-widen")


def dequant_gops(kind: str, threads: int, *, iters: int = 2_000_000, repeat: int = 7) -> float:
    """G vector ops/s of one dequantization sequence (DEQUANT_KINDS) on `threads` threads, its
    weights in registers: DECA's VOS for the formats that run it. The best repeat, as
    peak_gflops. BuildError if its outputs are not the scalar dequantization's."""
    check_threads(threads)
    if kind not in DEQUANT_KINDS:
        raise ConfigError(f"unknown dequantization kind {kind!r}; one of {', '.join(DEQUANT_KINDS)}")
    lib, _ = _library()
    index = DEQUANT_KINDS.index(kind)
    if lib.mb_dequant_kinds() != len(DEQUANT_KINDS):
        raise BuildError("csrc/machine_bench.c and DEQUANT_KINDS list different sequences")
    out = ctypes.c_float()

    def call() -> None:
        rc = lib.mb_dequant(index, threads, iters, ctypes.byref(out))
        if rc == -3:
            raise BuildError(f"the {kind} dequantization micro-benchmark computed wrong values")
        _check_rc(rc, f"{kind} dequantization")

    t = time_callable(call, warmup=2, repeat=repeat, min_repeat_s=0.0)
    ops = threads * iters * lib.mb_dequant_accs() * lib.mb_dequant_ops(index)
    return ops / t.min_s / 1e9


def _peak(entry: str, what: str, flops_per_lane: float, threads: int, iters: int,
          repeat: int, *, lanes: int | None = None, accs: int | None = None) -> float:
    """GFLOPS of a C entry point running `accs` (default FMA_ACCS) independent chains per
    thread, each link `flops_per_lane` per lane of `lanes` (default: the f32 lanes): the best
    repeat."""
    lib, _ = _library()
    out = ctypes.c_float()

    def call() -> None:
        _check_rc(getattr(lib, entry)(threads, iters, ctypes.byref(out)), what)

    t = time_callable(call, warmup=2, repeat=repeat, min_repeat_s=0.0)
    links = threads * iters * (accs or lib.mb_fma_accs())
    flops = flops_per_lane * links * (lanes or lib.mb_lanes())
    return flops / t.min_s / 1e9


def fma_chain_gflops(chains: int, *, iters: int = 400_000, repeat: int = 5) -> float:
    """GFLOPS of one thread running `chains` independent FMA chains (1..max_chains()), the
    best repeat: one chain runs at one FMA per latency; more chains hide it until the FMA
    units are full, which is how many accumulators a register tile needs."""
    lib, _ = _library()
    if isinstance(chains, bool) or not isinstance(chains, int) or not 1 <= chains <= lib.mb_max_chains():
        raise ConfigError(f"chains must be an integer in 1..{lib.mb_max_chains()}, got {chains!r}")
    out = ctypes.c_float()

    def call() -> None:
        _check_rc(lib.mb_fma_chains(chains, iters, ctypes.byref(out)), "FMA chain")

    t = time_callable(call, warmup=1, repeat=repeat, min_repeat_s=0.0)
    return 2.0 * iters * chains * lib.mb_lanes() / t.min_s / 1e9


def max_chains(registers: int) -> int:
    """The most chains that keep their accumulators and the two constants in registers."""
    lib, _ = _library()
    return max(1, min(lib.mb_max_chains(), registers - 2))


def _aligned_buffer(nbytes: int, block: int) -> np.ndarray:
    """A 64-byte aligned float32 buffer of about nbytes, a multiple of `block` floats, all pages touched."""
    n = max(block, nbytes // 4 // block * block)
    raw = np.empty(n + 16, dtype=np.float32)
    off = (-raw.ctypes.data % 64) // 4
    buf = raw[off:off + n]
    buf.fill(1.0)
    return buf


READ_STREAMS = (1, 2, 4)  # concurrent streams per thread tried by read_bandwidth_gbs


def read_bandwidth_gbs(threads: int, *, size_bytes: int | None = None, repeat: int = 7,
                       streams: tuple[int, ...] = READ_STREAMS) -> float:
    """Streaming-read GB/s of `threads` threads over size_bytes (default: default_read_bytes()):
    the best over `streams` concurrent streams per thread, since one core may keep more
    loads in flight over several streams than over one."""
    check_threads(threads)
    lib, _ = _library()
    nbytes = size_bytes if size_bytes is not None else default_read_bytes()
    if nbytes <= 0:
        raise ConfigError(f"read buffer size must be positive, got {nbytes}")
    if not streams or min(streams) < 1:
        raise ConfigError(f"stream counts must be >= 1, got {streams}")
    buf = _aligned_buffer(nbytes, lib.mb_read_block() * threads * math.lcm(*streams))
    # Small (in-cache) buffers are read several times per call so one call is not all overhead.
    passes = max(1, (64 * _MIB) // buf.nbytes)
    out = ctypes.c_float()
    best = 0.0
    for n_streams in streams:
        def call(n_streams: int = n_streams) -> None:
            _check_rc(lib.mb_read(threads, buf.ctypes.data, buf.size, passes, n_streams,
                                  ctypes.byref(out)), "read")

        t = time_callable(call, warmup=2, repeat=repeat)
        adds_per_lane = buf.size * passes // lib.mb_read_block()
        if adds_per_lane < (1 << 23) and abs(out.value - buf.size * passes) > 1e-3 * buf.size * passes:
            raise BuildError(f"read micro-benchmark summed {out.value}, expected {buf.size * passes}")
        best = max(best, buf.nbytes * passes / t.median_s / 1e9)
    return best
