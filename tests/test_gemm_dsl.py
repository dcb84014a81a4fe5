"""The DSL GEMM family (dsl/kernels/gemm_family.sw via compiler/gemm_dsl.py) vs numpy, and
the compile-time lowering it relies on (compiler/lower_static.py). Issue 3, item 4."""

import os
import re
from dataclasses import replace

import numpy as np
import pytest

os.environ.setdefault("TVM_NUM_THREADS", "2")

from sandwich.compiler.gemm_dsl import build_gemm_dsl, format_tunables, gemm_dsl_tvmscript  # noqa: E402
from sandwich.compiler.gemm_runner import call_gemm, pack_weights  # noqa: E402
from sandwich.compiler.lower_tir import to_tvmscript  # noqa: E402
from sandwich.compiler.target import detect_cpu  # noqa: E402
from sandwich.dsl.errors import DSLError  # noqa: E402
from sandwich.dsl.interp import run  # noqa: E402
from sandwich.dsl.load import load_kernel, load_source  # noqa: E402
from sandwich.errors import ConfigError  # noqa: E402
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization  # noqa: E402

CPU = detect_cpu()
L = CPU.lanes_f32
N, K = 8 * L, 96  # K not a multiple of b_k: partial panels too
MS = (1, 2, 3, 7, 8, 16, 33, 100)  # up to 8 with two row blocks, the stream's next rows are prefetched


def _sched(mu_m, mu_n, b, pl, pack=4 * L):
    return KernelSchedule(MicroKernel(mu_m, mu_n), ComputeSlice(*b), Polymerization(*pl), pack)


# (micro-kernel, [slices of the same family], polymerization); slices do not divide M
FAMILIES = [
    ((1, 4 * L), [(1, 4 * L, 64), (3, 8 * L, 96)], (1, 2, 1)),
    ((2, 2 * L), [(4, 4 * L, 48)], (2, 1, 1)),
    ((3, 4 * L), [(6, 4 * L, 32), (9, 8 * L, 64)], (1, 1, 2)),
    ((4, L), [(8, 2 * L, 40)], (1, 2, 1)),
    ((5, 2 * L), [(10, 2 * L, 64)], (2, 1, 1)),
    ((6, 4 * L), [(12, 8 * L, 48), (6, 4 * L, 96)], (1, 2, 1)),
    ((6, L), [(6, L, 16)], (1, 1, 2)),
    ((14, 2 * L), [(28, 4 * L, 64)], (1, 2, 1)),  # tails of 8, 4, 2 and 1 rows
    ((30, L), [(30, 2 * L, 48)], (1, 1, 2)),  # the tallest AVX-512 tile: a 16-row tail
]


@pytest.mark.tvm
@pytest.mark.parametrize("mk, slices, pl", FAMILIES)
def test_dsl_gemm_matches_numpy(mk, slices, pl):
    _check_family(mk, slices, pl, CPU)


@pytest.mark.tvm
@pytest.mark.parametrize("mk, slices, pl", [FAMILIES[1], FAMILIES[2], FAMILIES[7]])
def test_dsl_gemm_in_chunks_of_rows_matches_numpy(mk, slices, pl):
    """Built for a 16 KiB L2, a thread runs its rows in chunks of a few row blocks (a panel
    of 40-96 values of 4 bytes), the tail rows in the last M-thread's last chunk."""
    _check_family(mk, slices, pl, replace(CPU, l2_bytes=16 << 10))


def _check_family(mk, slices, pl, cpu):
    family = _sched(*mk, slices[0], pl)
    func = build_gemm_dsl(family, n=N, k=K, cpu=cpu, threads=2)["main"]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N), dtype=np.float32)
    wp = pack_weights(w, 4 * L)
    for b in slices:
        s = _sched(*mk, b, pl)
        for m in MS:
            a = rng.standard_normal((m, K), dtype=np.float32)
            out = np.full((m, N), np.nan, dtype=np.float32)
            ws = np.full((pl[2] * m, N), np.nan, np.float32) if pl[2] > 1 else None
            call_gemm(func, a, wp, out, s, ws)
            np.testing.assert_allclose(out, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{s.key()} M={m}")


@pytest.mark.parametrize("tun, sl, m", [
    (dict(mu_m=3, mu_n=4, pack_n=8, t_m=1, t_n=2, t_k=1), (2, 1, 4), 7),
    (dict(mu_m=2, mu_n=8, pack_n=8, t_m=2, t_n=1, t_k=2), (1, 2, 3), 5),
    (dict(mu_m=5, mu_n=4, pack_n=4, t_m=1, t_n=1, t_k=1), (1, 4, 16), 13),
])
def test_source_is_right_in_the_reference_interpreter(tun, sl, m):
    """The kernel source itself, without TVM: tails, split-K and slices, vlen = 4."""
    _interpret(tun, sl, m, "fp32", k=10)


@pytest.mark.parametrize("fmt", ["int8-g32", "int8", "int4-g32", "int4-g32-asym"])
@pytest.mark.parametrize("act", [0, 1])
def test_int_formats_are_right_in_the_reference_interpreter(fmt, act):
    """The int branches of the source, without TVM (act 0: products on the values converted
    to f32; act 1: on 8-bit activations): a 3-row tile with its tails, split-K over two K
    groups, K panels (48) that are not a multiple of the group (32)."""
    _interpret(dict(mu_m=3, mu_n=4, pack_n=8, t_m=1, t_n=1, t_k=2), (1, 2, 48), 7, fmt, k=96,
               act=act)


@pytest.mark.parametrize("fmt, k", [("int4-g32", 96), ("int4-g32-asym", 96), ("int4-k", 512),
                                    ("int5-k", 512)])
def test_16_bit_sums_are_right_in_the_reference_interpreter(fmt, k):
    """The int4 and int5 branch x86 builds without VNNI (h16: products summed in 16-bit halves
    by dot8h, folded by halves once a block for int4, twice for int5): a 3-row tile with its
    tails, split-K, K panels of 48."""
    _interpret(dict(mu_m=3, mu_n=4, pack_n=8, t_m=1, t_n=1, t_k=2, h16=1), (1, 2, 48), 7, fmt,
               k=k, act=1)


@pytest.mark.parametrize("act", [0, 1])
def test_int4_k_is_right_in_the_reference_interpreter(act):
    """int4-k (Q4_K's factors of an fp16 d and dmin per 256 values) without TVM, over two
    super-groups: split-K, K panels of 48, a 3-row tile with its tails."""
    _interpret(dict(mu_m=3, mu_n=4, pack_n=8, t_m=1, t_n=1, t_k=2), (1, 2, 48), 5, "int4-k",
               k=512, act=act)


@pytest.mark.parametrize("tun, sl, m", [
    (dict(mu_m=3, mu_n=4, pack_n=8, t_m=1, t_n=1, t_k=2), (1, 2, 48), 5),
    (dict(mu_m=2, mu_n=4, pack_n=4, t_m=2, t_n=2, t_k=1), (1, 2, 64), 9),
])
def test_int5_k_is_right_in_the_reference_interpreter(tun, sl, m):
    """int5-k (Q5_K: int4-k's nibbles and factors plus a fifth bit a value) without TVM, over
    two super-groups, on the activations as the kernel quantizes them: split-K with K panels
    of 48, a 3-row tile with its tails; threads over M and N."""
    _interpret(tun, sl, m, "int5-k", k=512, act=1, rtol=1e-6)


@pytest.mark.parametrize("tun, sl, m", [
    (dict(mu_m=3, mu_n=4, pack_n=8, t_m=1, t_n=1, t_k=2), (1, 2, 48), 5),
    (dict(mu_m=2, mu_n=4, pack_n=4, t_m=2, t_n=2, t_k=1), (1, 2, 64), 9),
])
def test_int6_k_is_right_in_the_reference_interpreter(tun, sl, m):
    """int6-k (Q6_K: 6-bit values, a signed factor per 16 and an fp16 d per 256) without TVM,
    over two super-groups, on the activations as the kernel quantizes them in consecutive
    quads: split-K with K panels of 48 (not whole blocks of 32), a 3-row tile with its tails;
    threads over M and N, each quantizing only its own rows."""
    _interpret(tun, sl, m, "int6-k", k=512, act=1, rtol=1e-6)


@pytest.mark.parametrize("tun, sl, m", [
    (dict(mu_m=3, mu_n=4, pack_n=8, t_m=1, t_n=1, t_k=2), (1, 2, 48), 7),
    (dict(mu_m=2, mu_n=4, pack_n=4, t_m=2, t_n=2, t_k=1), (1, 2, 16), 9),
])
def test_bf16_is_right_in_the_reference_interpreter(tun, sl, m):
    """The bf16 branch without TVM (dotbf16 on pairs along K), against numpy on the
    activations and weights rounded to bf16: tails, split-K, threads over M and N."""
    _interpret(tun, sl, m, "bf16", k=96, rtol=1e-5)


@pytest.mark.parametrize("fmt, act", [("fp32", 0), ("bf16", 0), ("int8-g32", 1), ("int4-g32", 0)])
def test_rows_run_in_chunks_sized_by_the_l2(fmt, act):
    """An L2 of 512 bytes leaves 2-4 rows a chunk (b_k 16, 2-row tiles): each thread runs 2-3
    chunks of 13 rows, the last M-thread's last one with the tail row, across two K panels."""
    _interpret(dict(mu_m=2, mu_n=4, pack_n=4, t_m=2, t_n=2, t_k=1), (1, 2, 16), 13, fmt, k=64,
               act=act, rtol=1e-5, l2=512)


@pytest.mark.parametrize("fmt", ["int8-g32", "int4-g64", "int4-g32-asym"])
def test_8_bit_activations_are_the_same_math_as_numpys(fmt):
    """act 1 against numpy on the activations quantized as the kernel does (to 1e-6), with
    threads over M and N, so that each thread quantizes only its own rows and K groups."""
    _interpret(dict(mu_m=2, mu_n=4, pack_n=4, t_m=2, t_n=2, t_k=1), (1, 2, 64), 9, fmt, k=128,
               act=1, rtol=1e-6)


def _interpret(tun: dict, sl: tuple, m: int, fmt: str, *, k: int, act: int = 0,
               rtol: float = 1e-4, l2: int = 1 << 20) -> None:
    """Run the family in the interpreter for one weight format; every array the signature
    names is passed (the ones the format leaves out as empty placeholders). With act = 1 the
    reference takes the activations as the kernel quantizes them. `l2`: the L2 bytes that
    size a thread's chunks of rows (a few hundred bytes: several chunks at a small M)."""
    from sandwich.compiler.gemm_formats import quantized_activations, weight_args
    from sandwich.compiler.gemm_runner import pack_weight
    from sandwich.weight_formats import dequantize, gemm_dtype, parse_format, quantize, round_bf16

    n, pack = 16, tun["pack_n"]
    f = parse_format(fmt)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((k, n)).astype(np.float32)
    if f.quantized or f.bits == 16:
        qw = quantize(w, f)
        w = dequantize(qw)
    dtype = gemm_dtype(f)
    g = f.group_size(k)
    arrays = {"W": np.zeros((n // pack, k, pack), np.float32),
              "Q8": np.zeros((n // pack, k, pack), np.int8),
              "Q4": np.zeros((n // pack, k // 2, pack), np.uint8),
              "Q8Q": np.zeros((n // pack, k // 4, pack), np.int32),
              "Q4Q": np.zeros((n // pack, k // 8, pack), np.int32),
              "Q6Q": np.zeros((n // pack, k // 8, pack), np.int32),
              "Q6H": np.zeros((n // pack, k // 16, pack), np.int32),
              "Q5H": np.zeros((n // pack, k // 32, pack), np.int32),
              "WB": np.zeros((n // pack, k // 2, pack), np.int32),
              **{name: np.zeros((n // pack, k // g, pack), dt)
                 for name, dt in (("S", np.float16), ("SF", np.float32), ("Z", np.float16),
                                  ("SK", np.uint8), ("ZK", np.uint8), ("SC", np.int8))},
              **{name: np.zeros((n // pack, k // 256, pack), np.float16) for name in ("SD", "ZD")}}
    packed = pack_weight(qw if f.quantized or f.bits == 16 else w, pack, dtype, quads=bool(act))
    names = weight_args(dtype, k)
    if f.quantized and not act:  # the same format read as Q8 / Q4 (act = 0)
        names = (names[0].removesuffix("Q"), *names[1:])
    arrays.update(zip(names, (np.ascontiguousarray(x) for x in packed), strict=True))
    a = rng.standard_normal((m, k)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    ws = np.full((tun["t_k"] * m, n), np.nan, np.float32)
    tunables = {**format_tunables(f, k), **tun, "act": act}
    run(load_kernel("gemm_family"), tunables=tunables, vlen=4, M=m, N=n, K=k, G=g, L2=l2, A=a, C=c,
        WS=ws, bmb=sl[0], bnt=sl[1], bk=sl[2], **arrays)
    rows = quantized_activations(a) if act else round_bf16(a) if f.bits == 16 else a
    ref = rows.astype(np.float64) @ w
    np.testing.assert_allclose(c, ref, rtol=rtol, atol=rtol * np.abs(ref).max())


def test_calling_convention_is_the_hand_templates():
    plain = gemm_dsl_tvmscript(_sched(4, 4 * L, (8, 4 * L, 32), (1, 2, 1)), n=N, k=K, lanes=L, l2_bytes=1 << 20)
    split = gemm_dsl_tvmscript(_sched(4, 4 * L, (8, 4 * L, 32), (1, 1, 2)), n=N, k=K, lanes=L, l2_bytes=1 << 20)
    sig = re.compile(r"def main\((.*)\):")
    names = [[p.split(":")[0].strip() for p in sig.search(src).group(1).split(",")]
             for src in (plain, split)]
    assert names[0] == ["A_h", "W_h", "C_h", "bmb_", "bnt_", "bk_"]
    assert names[1] == ["A_h", "W_h", "C_h", "WS_h", "bmb_", "bnt_", "bk_"]
    # skinny M prefetches the next weight tile into L2, half a 64-byte-line row a step
    assert plain.count("llvm.prefetch.p0") == 4 * L // 32 and "M_ <= 8" in plain


def test_skinny_tiles_keep_their_own_stream_in_flight():
    """A tile of <= 8 accumulators also prefetches 16 rows ahead in its own tile when it is
    the thread's only row block (M = 1 and 2 in decode); wider tiles leave that to the
    hardware, which measured faster for them."""
    lines = 4 * L // 16  # 64-byte lines per weight row of the tile
    one_row = gemm_dsl_tvmscript(_sched(1, 4 * L, (1, 4 * L, 32), (1, 2, 1)), n=N, k=K, lanes=L, l2_bytes=1 << 20)
    split = 2  # a 1 x 4-vector tile keeps two accumulator sets
    # own stream, and the next tile's half rows (a slice of two or more row blocks)
    assert one_row.count("llvm.prefetch.p0") == split * lines + split * lines // 2
    assert one_row.count("+ 16") >= split * lines
    four_rows = gemm_dsl_tvmscript(_sched(4, 4 * L, (4, 4 * L, 32), (1, 2, 1)), n=N, k=K, lanes=L, l2_bytes=1 << 20)
    assert four_rows.count("llvm.prefetch.p0") == lines // 2  # the next-tile prefetch only


def test_fp32_next_tile_prefetch_walks_a_running_address():
    """Decode with two row blocks in a slice: each block fetches its share of the next tile
    (from row blk/nblk of it) at a fixed step of half a row, so the address inside the K loop
    is the loop index times a constant. A clamp in it cost 9-12 instructions a step, and the
    tile ran 7-30% slower streaming from DRAM (Zen 3); a division by nblk (the share's first
    row) stayed in the loop where LLVM did not unswitch it (test_static_loop's 9 x 48 tile
    for skylake-avx512), so that row is a multiplication by nblk's reciprocal."""
    src = gemm_dsl_tvmscript(_sched(4, 4 * L, (8, 4 * L, 32), (1, 2, 1)), n=N, k=K, lanes=L, l2_bytes=1 << 20)
    pfs = [x for x in src.splitlines() if "llvm.prefetch.p0" in x]
    assert len(pfs) == max(1, 2 * L // 16)  # one a 64-byte line of half the tile's row
    for pf in pfs:
        row, col = re.search(r"W_\[[^,]+, (.*), (\(+0 \* \d+\).*)\]\), 0, 2, 1", pf).groups()
        assert "blk" in row and "nrcp" in row and "kn" in row  # the block's share starts here
        assert "T.min" not in pf and "nblk" not in pf and "nrcp" not in col  # and runs on by a constant step
        assert re.search(rf"\* {2 * L}\)", col)  # half the tile's 4 L-lane row


def test_int8_tiles_in_a_slice_of_two_row_blocks_prefetch_the_next_tile():
    """Decode with int8 weights: a slice's only row block keeps 16 rows of its own tile in
    flight, and in a slice of two or more row blocks each block fetches its share of the next
    tile's rows instead (the later blocks re-read this tile from cache while DRAM would idle):
    one prefetch per 64-byte line of a weight row for each (before: the own stream alone).
    int4 keeps its own stream only."""
    lines = 4 * L // 16

    def prefetches(fmt):
        return gemm_dsl_tvmscript(replace(_sched(4, 4 * L, (8, 4 * L, 64), (1, 2, 1)), dtype=fmt),
                                  n=N, k=128, lanes=L, l2_bytes=1 << 20).count("llvm.prefetch.p0")

    assert prefetches("int8-g32") == 2 * lines and prefetches("int4-g32") == lines


def test_accumulators_are_one_stack_row_per_buffer():
    """TVM 0.27 keeps only "global" buffers under 1024 B on the stack (in registers)."""
    src = gemm_dsl_tvmscript(_sched(6, 4 * L, (12, 4 * L, 32), (1, 2, 1)), n=N, k=K, lanes=L, l2_bytes=1 << 20)
    shapes = re.findall(r"T\.alloc_buffer\(\(([^)]*)\)", src)
    assert shapes and all(len(s.strip(", ").split(",")) == 1 for s in shapes)
    assert all(int(s.strip(", ")) * 4 < 1024 for s in shapes)
    assert "T.unroll(6)" not in src  # the rows are expanded when the kernel is written


def test_refuses_what_the_hand_template_refuses():
    with pytest.raises(ConfigError, match="multiple of the micro-kernel"):
        gemm_dsl_tvmscript(_sched(3, 4 * L, (4, 4 * L, 16), (1, 1, 1)), n=N, k=K, lanes=L, l2_bytes=1 << 20)
    with pytest.raises(ConfigError, match="outside gemm_family"):  # mu_m 11: not in the domain
        gemm_dsl_tvmscript(_sched(11, L, (11, L, 16), (1, 1, 1)), n=N, k=K, lanes=L, l2_bytes=1 << 20)


SRC = """
kernel k(tunable i32 r in {2, 3}, i32 n, f32 X[n, 4], f32 Y[n, 4], f32 Z[n]) {
    f32 acc[r, 4];
    for (i32 t = 0; t < n; t++) {
        unroll for (i32 i = 0; i < r; i++) {
            vectorize for (i32 j = 0; j < 4; j++) { acc[i, j] = X[t, j]; }
        }
        if (r > 2) {
            vectorize for (i32 j = 0; j < 4; j++) { Y[t, j] = acc[r - 1, j]; }
        } else {
            vectorize for (i32 j = 0; j < 4; j++) { Y[t, j] = acc[t % r, j]; }
        }
    }
}
"""


def _lower(r, **kw):
    kernel = load_source(SRC).kernels[0]
    return to_tvmscript(kernel, tunables={"r": r}, vlen=4, **kw)


def test_static_unroll_if_and_split_rows():
    src = _lower(3)
    assert "acc_1__r2 = T.alloc_buffer((4,)" in src and "if (3 > 2)" not in src
    assert "T.unroll(3)" not in src


def test_split_falls_back_when_a_row_is_not_constant():
    src = _lower(2)  # acc[t % r, j]: the row depends on t
    assert "acc_1_ = T.alloc_buffer((2, 4,)" in src and "_r0" not in src


def test_signature_binds_dims_and_leaves_out_arrays():
    src = _lower(3, args=("X", "Y"))
    assert "def main(X_h: T.handle, Y_h: T.handle):" in src and "n_ = T.int32()" in src
    with pytest.raises(DSLError, match="leaves out"):
        _lower(3, args=("Z",))  # X and Y are used
    with pytest.raises(DSLError, match="must be fixed or be a dimension"):
        _lower(3, args=())


def test_parity_script_parses_schedules_and_times_pairs():
    from sandwich.bench.dsl_parity import parse_schedule, time_pair

    s = parse_schedule("mk4x64 p1x2x1 s8x64x768", 64)
    assert (s.micro_kernel.mu_m, s.polymerization.t_n, s.slice.b_k, s.pack_n) == (4, 2, 768, 64)
    with pytest.raises(ValueError, match="is not like"):
        parse_schedule("mk4x64 s8x64x768", 64)
    calls = []
    hand, dsl, paired = time_pair(lambda: calls.append("h"), lambda: calls.append("d"), rounds=3)
    assert hand > 0 and dsl > 0 and paired > 0
    assert abs(calls.count("h") - calls.count("d")) <= 1  # one calibration call of hand
