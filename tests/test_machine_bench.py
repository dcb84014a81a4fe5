"""Machine micro-benchmarks (issue 2, item 9): they build, run, and give plausible figures."""

import pytest

from sandwich.bench import machine as mb
from sandwich.errors import ConfigError
from sandwich.tuner import machine_bench as mbench
from sandwich.tuner.streaming import llc_bytes


def test_llc_is_detected_and_plausible():
    assert 256 * 1024 <= llc_bytes() <= 4 << 30


def test_isa_is_a_supported_one():
    isa, flags = mbench.isa_flags()
    assert isa in ("avx512", "avx2") and flags


@pytest.mark.parametrize("threads", [1, 2])
def test_peak_gflops_positive_and_plausible(threads):
    g = mbench.peak_gflops(threads, iters=20_000, repeat=3)
    # Any AVX2 core does >= 8 fp32 FMA lanes at >= 1 GHz; nothing here does 10 TFLOPS per core.
    assert 1.0 < g < 10_000.0 * threads


@pytest.mark.parametrize("threads", [1, 2])
def test_read_bandwidth_positive_and_plausible(threads):
    gbs = mbench.read_bandwidth_gbs(threads, size_bytes=1 << 20, repeat=3)  # in cache: fast path only
    assert 0.5 < gbs < 5_000.0


def test_measure_machine_round_trips_json():
    lim = mb.measure_machine(1, read_size_bytes=1 << 20)
    assert lim.threads == 1 and lim.peak_gflops > 0 and lim.read_gbs > 0
    assert mb.MachineLimits.from_json(lim.to_json()) == lim


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, 5000])
def test_bad_thread_count_is_a_config_error(threads):
    with pytest.raises(ConfigError, match="threads"):
        mbench.peak_gflops(threads)


def test_read_bandwidth_over_several_streams_checks_its_sum():
    # the worker sums every float it reads (all ones): any stream count must read them all
    for streams in ((1,), (3,), (1, 2, 4)):
        assert mbench.read_bandwidth_gbs(1, size_bytes=1 << 20, repeat=2, streams=streams) > 0
    with pytest.raises(ConfigError):
        mbench.read_bandwidth_gbs(1, size_bytes=1 << 20, streams=(0,))


def test_bf16_dot_peak_where_the_cpu_has_one(monkeypatch):
    """About twice the FMA peak on Zen 4 (a vdpbf16ps adds two products per lane), half of it
    on a Sapphire Rapids VM (110-115 against 224-231 GFLOPS: there it issues at a quarter of
    the FMAs' rate); a flop count off by two would read below 0.3. None, not an error, on a
    CPU without avx512_bf16."""
    if "avx512_bf16" in mbench._cpu_flags():
        gflops = mbench.peak_bf16_gflops(1, iters=200_000, repeat=3)
        assert gflops > 0.3 * mbench.peak_gflops(1, iters=200_000, repeat=3)
    monkeypatch.setattr(mbench, "_cpu_flags", lambda: {"avx512f", "avx2", "fma"})
    assert mbench.peak_bf16_gflops(1) is None


def test_amx_tile_peak_where_the_cpu_has_it(monkeypatch):
    """tdpbf16ps's rate on operands held in tiles: 3369 GFLOPS on one core of a Sapphire
    Rapids VM, 15x its fp32 FMA peak (Intel states 1024 flops a cycle, 16 times two FMA
    pipes'), and each product's sum comes back: tile 3 adds 32 products of two bf16 0x3A83
    (2^-10 x 1.0234375) a trip. A build without AMX (any CPU without it) has no such entry: None."""
    import ctypes

    if {"amx_tile", "amx_bf16"} <= mbench._cpu_flags():
        assert mbench.peak_amx_bf16_gflops(1, iters=20_000, repeat=3) > \
            4 * mbench.peak_gflops(1, iters=200_000, repeat=3)
        out = ctypes.c_float()
        assert mbench._library()[0].mb_amx_bf16(2, 1000, ctypes.byref(out)) == 0
        assert out.value == pytest.approx(2 * 1000 * 32 * (2 ** -10 * 1.0234375) ** 2, rel=1e-4)
    monkeypatch.setattr(mbench, "isa_flags", lambda: ("avx512", ["-mavx512f"]))
    built = mbench._library.__wrapped__()
    monkeypatch.setattr(mbench, "_library", lambda: built)
    out = ctypes.c_float()
    assert built[0].mb_amx_bf16(1, 10, ctypes.byref(out)) == -1
    assert mbench.peak_amx_bf16_gflops(1) is None


def _check_dot8_sum(lib):
    """Each dot8 of weights 128, 1, 1, 1 (unsigned) and activations -1, 127, 1, 1 (signed)
    adds exactly 1 a lane, and so does each narrow one (weights 15, 1, 1, 1, activations
    -1, 8, 4, 4): the sum counts every lane, chain and trip, and any wrong signedness or lost
    byte pair changes it."""
    import ctypes

    lanes, accs = lib.mb_int8_lanes(), lib.mb_int8_accs()
    assert (lanes, accs) in ((16, lib.mb_fma_accs()), (8, 4))
    for entry in (lib.mb_dpbusd, lib.mb_dot8_narrow):
        out = ctypes.c_float()
        assert entry(2, 1000, ctypes.byref(out)) == 0
        assert out.value == 2 * 1000 * accs * lanes
    # blocks of 8 dot8, each block's sum converted and scaled twice: 8 a lane
    for entry in (lib.mb_dot8_block, lib.mb_dot8_block_narrow):
        out = ctypes.c_float()
        assert entry(2, 1000, ctypes.byref(out)) == 0
        assert out.value == 2 * 1000 * 8 * accs * lanes


def test_int8_dot_peak_sums_every_product():
    """The int formats' dot8 as this CPU runs it (vpdpbusd with AVX512-VNNI, else 2 pmaddwd +
    2 paddd on the split bytes, or pmaddubsw and paddw on int4's): exact sums, and rates of the
    order of the FMA peak (the narrow one has fewer instructions, never many more)."""
    _check_dot8_sum(mbench._library()[0])
    gops = mbench.peak_int8_gops(1, iters=200_000, repeat=3)
    assert gops > 0
    assert gops > 0.25 * mbench.peak_gflops(1, iters=200_000, repeat=3)
    assert mbench.peak_int8_gops(1, narrow=True, iters=200_000, repeat=3) > 0.5 * gops
    # in the tile's blocks (the Roof-Surface model's rate): the same order; gcc merging the
    # rows' identical chains into one would read 4x (this VM's bare rate alone spreads 2x)
    block = mbench.int8_block_gops(1, iters=50_000, repeat=3)
    assert 0.25 * gops < block < 3 * gops


@pytest.mark.parametrize("isa, flags", [("avx512", ["-mavx512f", "-mavx512bw"]),
                                        ("avx2", ["-mavx2", "-mfma"])])
def test_int8_dot_without_vnni_sums_every_product(monkeypatch, isa, flags):
    """The fallback a CPU without AVX512-VNNI runs (bytes split into 16-bit pairs, pmaddwd),
    built for this CPU without -mavx512vnni: the same exact sum."""
    if not {"avx512": {"avx512f", "avx512bw"}, "avx2": {"avx2", "fma"}}[isa] <= mbench._cpu_flags():
        pytest.skip(f"this CPU cannot run an {isa} build")
    monkeypatch.setattr(mbench, "isa_flags", lambda: (isa, flags))
    _check_dot8_sum(mbench._library.__wrapped__()[0])


def _check_dequant(lib):
    """Each dequantization sequence, run on 2 threads, gives the scalar dequantization's
    values (the C side compares and returns -3 otherwise)."""
    import ctypes

    assert lib.mb_dequant_kinds() == len(mbench.DEQUANT_KINDS)
    out = ctypes.c_float()
    for kind in range(lib.mb_dequant_kinds()):
        assert lib.mb_dequant(kind, 2, 100, ctypes.byref(out)) == 0, mbench.DEQUANT_KINDS[kind]
        assert out.value > 0
    assert lib.mb_dequant(lib.mb_dequant_kinds(), 1, 1, ctypes.byref(out)) == -1


def test_dequant_sequences_compute_their_values_at_a_plausible_rate():
    """VOS per sequence: checked values, and a rate within a few times the FMA rate (the
    sequences are single-cycle logic, shifts, widenings and conversions)."""
    _check_dequant(mbench._library()[0])
    fma_ops = mbench.peak_gflops(1, iters=200_000, repeat=3) / (2 * mbench._library()[0].mb_lanes())
    for kind in mbench.DEQUANT_KINDS:
        gops = mbench.dequant_gops(kind, 1, iters=100_000, repeat=3)
        assert 0.25 * fma_ops < gops < 8 * fma_ops, kind
    with pytest.raises(ConfigError, match="unknown dequantization kind"):
        mbench.dequant_gops("int3-widen", 1)


def test_dequant_sequences_on_an_avx2_build(monkeypatch):
    """The AVX2 build writes the sequences with AVX2's mnemonics (vpand, not AVX-512's vpandd
    on ymm registers, which an AVX2-only CPU cannot run): the same values."""
    if not {"avx2", "fma"} <= mbench._cpu_flags():
        pytest.skip("this CPU cannot run an avx2 build")
    monkeypatch.setattr(mbench, "isa_flags", lambda: ("avx2", ["-mavx2", "-mfma"]))
    _check_dequant(mbench._library.__wrapped__()[0])


def test_code_is_kept_only_in_a_private_dir_of_this_user(tmp_path, monkeypatch):
    """The micro-benchmarks' .so and the DSL's pickled parser tables are loaded from
    <tmp>/sandwichc-<uid>: made 0700, and refused when open to others or a symlink (another
    user could plant code there); the DSL then parses without keeping its tables."""
    import os
    import tempfile

    from sandwich.dsl import parsing
    from sandwich.dsl.lowlevel import transform
    from sandwich.errors import BuildError
    from sandwich.private_dir import private_dir

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    d = private_dir("lark")
    assert d == tmp_path / f"sandwichc-{os.getuid()}" / "lark" and d.is_dir()
    assert (d.stat().st_mode & 0o777, d.parent.stat().st_mode & 0o777) == (0o700, 0o700)
    d.chmod(0o777)
    with pytest.raises(PermissionError, match="is not a private directory of this user"):
        private_dir("lark")
    d.chmod(0o700)
    (d.parent / "csrc").symlink_to(tmp_path)
    with pytest.raises(BuildError, match="csrc is not a private directory"):
        mbench._cache_dir()
    d.parent.chmod(0o755)  # the root open to others: nothing under it is used
    transform._lark.cache_clear()
    try:
        assert parsing.open_grammar(transform.__file__).options.cache is False
        assert transform.parse("kernel k(i32 n) { }").kernels[0].name == "k"
    finally:
        transform._lark.cache_clear()
