"""Issue 26's AMX path, first part: the DSL's tile statements (dsl/ast.py, Tile) parse at
both levels, are checked, run in the reference interpreter against numpy (dsl/tiles.py), and
lower to LLVM's AMX intrinsics for a CPU that has them. No machine of ours has AMX, so the
shipped AMX GEMM is checked by the interpreter and by cross-compilation only."""

import os
import re

import numpy as np
import pytest

os.environ.setdefault("TVM_NUM_THREADS", "2")

from sandwich.compiler.gemm_runner import pack_weight  # noqa: E402
from sandwich.dsl.errors import DSLError  # noqa: E402
from sandwich.dsl.highlevel.printer import print_module  # noqa: E402
from sandwich.dsl.highlevel.transform import parse as parse_high  # noqa: E402
from sandwich.dsl.interp import run  # noqa: E402
from sandwich.dsl.load import builtin_kernels, load_file, load_kernel, load_source  # noqa: E402
from sandwich.weight_formats import round_bf16  # noqa: E402

HEAD = "kernel k(i32 X[4, 32], i8 Y[64], f32 C[4, 16]) {\n"


def kernel(body: str):
    return load_source(HEAD + body + "\n}", file="k.sw").kernels[0]


BF16_W = {"bits": 16, "asym": 0, "s32": 0}  # the AMX GEMM's tunables for bf16 weights


def amx_weights(n: int, k: int, pack_n: int, g: int, **given: np.ndarray) -> dict[str, np.ndarray]:
    """Every weight array of the AMX GEMM: those `given`, the other formats' as zeros (the
    interpreter takes every parameter; the built kernel only its format's)."""
    shapes = {"WB": (k // 2, np.int32), "Q8Q": (k // 4, np.int32), "Q4Q": (k // 8, np.int32),
              "S": (k // g, np.float16), "SF": (k // g, np.float32), "Z": (k // g, np.float16)}
    return {name: given.get(name, np.zeros((n // pack_n, rows, pack_n), dt))
            for name, (rows, dt) in shapes.items()}


def bf16_product(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    return round_bf16(a).astype(np.float64) @ round_bf16(w).astype(np.float64)


@pytest.mark.parametrize("m,n,k,pack_n,t_m,t_n,b_m,b_n,b_k", [
    (37, 64, 64, 32, 2, 1, 32, 32, 32),  # rows split, a tail block, two groups, two K blocks
    (75, 128, 96, 64, 3, 1, 64, 64, 64),  # three row threads, the last K block half full
    (100, 64, 64, 64, 1, 1, 64, 64, 64),  # rows in chunks of 2 blocks, the last chunk short
    (5, 64, 96, 64, 1, 2, 256, 64, 64),  # panels split, A rounded once for both threads
    (32, 32, 32, 32, 2, 1, 4096, 8192, 32768),  # one thread with no rows
    (16, 128, 32, 64, 1, 2, 32, 128, 128),  # one group a thread
    (70, 192, 64, 64, 2, 3, 32, 64, 32768)])  # both: 2 x 3 threads, a chunk a block
def test_the_amx_gemm_matches_numpy_in_the_interpreter(m, n, k, pack_n, t_m, t_n, b_m, b_n, b_k):
    """Row blocks of 32 with a tail of any size, both panel widths, one to three K steps, the
    rows or the panels or both split over threads, rows, W and K in blocks or whole."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    (wb,) = pack_weight(w, pack_n, "bf16")  # the bf16 family's packing is the B tile's layout
    c = np.full((m, n), np.nan, np.float32)
    tunables = {"pack_n": pack_n, "t_m": t_m, "t_n": t_n, "b_m": b_m, "b_n": b_n, "b_k": b_k, **BF16_W}
    run(load_kernel("gemm_amx_bf16"), tunables=tunables, M=m, N=n, K=k, G=k, A=a, C=c,
        **amx_weights(n, k, pack_n, k, WB=wb))
    np.testing.assert_allclose(c, bf16_product(a, w), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt,m,n,k,pack_n,t_m,t_n,b_m,b_n,b_k", [
    ("int8-g32", 37, 64, 64, 32, 2, 1, 32, 32, 32),  # Q8_0: rows split, two K blocks
    ("int4-g32", 75, 128, 96, 64, 3, 1, 64, 64, 64),  # Q4_0: the last K block half full
    ("int4-g64-asym", 5, 128, 128, 64, 1, 2, 256, 64, 32768),  # a minimum, K whole, panels split
    ("int8", 40, 64, 64, 64, 1, 1, 32, 64, 64)])  # a scale per column, in f32; two row chunks
def test_the_amx_gemm_rounds_int_weights_to_bf16_a_block_at_a_time(fmt, m, n, k, pack_n, t_m, t_n,
                                                                   b_m, b_n, b_k):
    """Int weights in the family's dot8 layout (Q8Q / Q4Q) become bf16 pairs a block of W at a
    time, value * scale (+ minimum) as ggml dequantizes them: the products are those of the
    bf16 kernel on the dequantized weights, each rounded to bf16."""
    from sandwich.compiler.gemm_dsl import amx_tunables
    from sandwich.compiler.gemm_formats import weight_args
    from sandwich.types import AMX_OP, ComputeSlice, KernelSchedule, MicroKernel, Polymerization
    from sandwich.weight_formats import dequantize, parse_format, quantize

    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    qw = quantize(rng.standard_normal((k, n), dtype=np.float32), fmt)
    arrays = dict(zip(weight_args(fmt, k), pack_weight(qw, pack_n, fmt), strict=True))
    s = KernelSchedule(MicroKernel(32, 32), ComputeSlice(b_m, b_n, b_k), Polymerization(t_m, t_n, 1),
                       pack_n, AMX_OP, fmt)
    c = np.full((m, n), np.nan, np.float32)
    g = parse_format(fmt).group_size(k)
    run(load_kernel("gemm_amx_bf16"), tunables=amx_tunables(s), M=m, N=n, K=k, G=g, A=a, C=c,
        **amx_weights(n, k, pack_n, g, **arrays))
    np.testing.assert_allclose(c, bf16_product(a, dequantize(qw)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("b_k,want_rows", [
    (64, {1: range(32)}),  # K whole: each block's rows prefetch the next panel
    (32, {0: range(16, 32), 1: range(32)})])  # K in two blocks: the next K block, then panel
def test_the_amx_gemm_prefetches_the_next_block_of_w_while_its_rows_run(b_k, want_rows):
    """In a model W comes from DRAM: the row blocks after a chunk's first share out the lines
    of the block of W that follows (the next K block, else the next panels), every line of
    it once, inside WB; the first block, which nothing runs before, is not prefetched."""
    m, n, k, pack_n = 128, 128, 64, 64  # four row blocks, two panels
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    (wb,) = pack_weight(w, pack_n, "bf16")
    c = np.full((m, n), np.nan, np.float32)
    seen: list = []
    tunables = {"pack_n": pack_n, "t_m": 1, "t_n": 1, "b_m": 128, "b_n": 64, "b_k": b_k, **BF16_W}
    run(load_kernel("gemm_amx_bf16"), tunables=tunables, prefetches=seen, M=m, N=n, K=k, G=k,
        A=a, C=c, **amx_weights(n, k, pack_n, k, WB=wb))
    np.testing.assert_allclose(c, bf16_product(a, w), rtol=1e-5, atol=1e-4)
    lines = [(p, kk, j // 16) for name, (p, kk, j) in seen]
    assert {name for name, _ in seen} == {"WB"} and all(j % 16 == 0 for _, (_, _, j) in seen)
    assert sorted(lines) == sorted(set(lines)), "a line prefetched twice"
    assert set(lines) == {(p, kk, q) for p, rows in want_rows.items() for kk in rows
                          for q in range(pack_n // 16)}


@pytest.mark.parametrize("s,prior,h,kvh,d", [(37, 0, 2, 1, 32), (20, 45, 2, 2, 64)])
def test_amx_prefill_attention_matches_numpy_in_the_interpreter(s, prior, h, kvh, d):
    """flash_prefill_amx reads q's heads from the QKV rows and K/V from a cache column: a
    chunk of S queries (tails in the 32-row and 32-key blocks) after `prior` cached positions,
    GQA or not, against causal attention on the same values rounded to bf16 (P's rounding
    left: 2e-3 here) and within 1e-2 of f32's."""
    from sandwich.tuner.reference import reference_attention
    from sandwich.weight_formats import round_bf16

    rng = np.random.default_rng(s + prior)
    n_kv, max_seq, slots, slot = s + prior, s + prior + 7, 3, 1
    rows = rng.standard_normal((s, h + 2 * kvh, d), dtype=np.float32)  # q, k, v heads
    k_cache, v_cache = rng.standard_normal((2, max_seq, slots, kvh, d), dtype=np.float32)
    o = np.full((s, h, d), np.nan, np.float32)
    run(load_kernel("flash_prefill_amx"), tunables={}, S=s, L=n_kv, H=h, KVH=kvh, D=d,
        R=h + 2 * kvh, LMAX=max_seq, NB=slots, slot=slot, scale=0.3, Q=rows, K=k_cache,
        V=v_cache, O=o)
    q, k, v = rows[:, :h], k_cache[:n_kv, slot], v_cache[:n_kv, slot]
    rounded = reference_attention(*(round_bf16(x) for x in (q, k, v)), 0.3, causal=True)
    np.testing.assert_allclose(o, rounded, atol=4e-3)
    np.testing.assert_allclose(o, reference_attention(q, k, v, 0.3, causal=True), atol=1.5e-2)


def test_tile_statements_round_trip_through_the_high_level_ir():
    k = load_kernel("gemm_amx_bf16")
    text = print_module(load_file(builtin_kernels()["gemm_amx_bf16"]))
    assert "tile_dpbf16(0, 4, 6)" in text and "tile_config(r0, r0, r1, r1, r0, r1, 16, 16)" in text
    assert parse_high(text).kernels[0] == k


@pytest.mark.parametrize("body,message", [
    ("tile_zero(8);", "a tile is an integer literal from 0 to 7"),
    ("i32 t = 1; tile_zero(t);", "a tile is an integer literal"),
    ("tile_zero(0, 1);", "tile_zero takes 1 argument, got 2"),
    ("tile_config(16, 16);", "tile_config takes 8 or 16 arguments, got 2"),
    ("tile_dpbsud(1, 1, 2);", "tile_dpbsud needs three different tiles"),
    ("tile_config(16, 16, 16, 16, 16, 16, 16, 1.5);", "tile rows must be an integer"),
    ("tile_dpbf16(0, 0, 1);", "three different tiles"),
    ("tile_load(0, 3, 16);", "needs an array element"),
    ("tile_load(0, Y[0], 16);", "moves 4-byte elements .i32 or f32.; .Y. is i8"),
    ("tile_store(0, C[0, 0], 1.0);", "tile stride must be an integer"),
    ("tile_load(0, Z[0], 16);", "undefined array 'Z'"),
])
def test_bad_tile_statements_are_one_clear_error(body, message):
    with pytest.raises(DSLError, match=message) as e:
        kernel(body)
    assert str(e.value).startswith("k.sw:2:")  # the place, then the line with a caret


@pytest.mark.parametrize("body,message", [
    ("tile_zero(0);", "before tile_config"),
    ("tile_config(4, 0, 0, 0, 0, 0, 0, 0); tile_zero(1);", "tile 1 has no rows"),
    ("tile_config(17, 0, 0, 0, 0, 0, 0, 0);", "0 to 16 rows, got 17"),
    ("tile_config(4, 0, 0, 0, 0, 0, 0, 0); tile_load(0, X[1, 0], 32);",
     "tile 0 row 3 reads or writes elements 128 to 143 of 'X' \\(size 128\\)"),
    ("tile_config(4, 4, 4, 0, 0, 0, 0, 0); tile_dpbf16(0, 1, 2);",
     "C and A need the same rows and B 16"),
    ("tile_config(4, 0, 0, 0, 0, 0, 0, 0, 30, 64, 64, 64, 64, 64, 64, 64);",
     "a tile row holds 4 to 64 bytes, a multiple of 4, got 30"),
    ("tile_config(4, 4, 4, 0, 0, 0, 0, 0, 64, 32, 64, 64, 64, 64, 64, 64); tile_dpbsud(0, 1, 2);",
     "B a row for each 4 bytes of A's.* gives 4, 4 x 32 bytes and 4 x 64"),
    ("tile_config(1, 0, 0, 0, 0, 0, 0, 0, 32, 64, 64, 64, 64, 64, 64, 64); tile_load(0, X[3, 28], 32);",
     "tile 0 row 0 reads or writes elements 124 to 131"),
])
def test_the_interpreter_stops_where_the_cpu_would_fault(body, message):
    k = kernel(body)
    with pytest.raises(DSLError, match=message):
        run(k, tunables={}, X=np.zeros((4, 32), np.int32), Y=np.zeros(64, np.int8),
            C=np.zeros((4, 16), np.float32))


def test_tile_dpbsud_adds_signed_by_unsigned_byte_products_in_i32():
    """tile_config's second form gives A 32-byte rows (32 values of K), B the 8 rows of 4
    bytes that meet them: C[m, n] += sum of A's signed bytes k times B's unsigned bytes 4 n + k
    % 4 of row k // 4, twice, wrapping in i32 as the instruction does."""
    src = """kernel k(i32 A[5, 8], i32 B[8, 16], i32 C[5, 16]) {
        tile_config(5, 8, 5, 0, 0, 0, 0, 0, 32, 64, 64, 4, 4, 4, 4, 4);
        tile_load(0, A[0, 0], 8);
        tile_load(1, B[0, 0], 16);
        tile_dpbsud(2, 0, 1);
        tile_dpbsud(2, 0, 1);
        tile_store(2, C[0, 0], 16);
    }"""
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (5, 32)).astype(np.int8)
    b = rng.integers(0, 256, (8, 16, 4)).astype(np.uint8)  # row, column, byte
    c = np.full((5, 16), 7, np.int32)
    run(load_source(src, file="k.sw").kernels[0], tunables={}, A=a.view(np.int32).copy(),
        B=b.reshape(8, 64).view(np.int32).copy(), C=c)
    along_k = b.transpose(0, 2, 1).reshape(32, 16).astype(np.int64)  # k = 4 row + byte
    assert (c == 2 * (a.astype(np.int64) @ along_k)).all()


@pytest.mark.parametrize("fmt,m,n,k,pack_n,t_n,b_n,pf", [
    ("int8-g32", 5, 64, 64, 32, 2, 32, 2),  # Q8_0: B tiles straight from Q8Q, 32-wide panels
    ("int4-g32", 19, 128, 96, 64, 2, 64, 2),  # Q4_0: two row blocks, the second of 3 rows
    ("int4-g64-asym", 3, 128, 128, 64, 1, 128, 0),  # Q4_1: a minimum, a scale every 2 blocks
    ("int8", 17, 64, 64, 64, 1, 64, 4)])  # a scale per column, in f32; prefetch past K's end
def test_the_amx_byte_gemm_matches_numpy_in_the_interpreter(fmt, m, n, k, pack_n, t_n, b_n, pf):
    """gemm_amx_int8 on the family's packed int weights and its 8-bit activations: the
    products of the quantized activations and the dequantized weights, whatever the rows'
    tail, the panel width, the threads and the format's scales."""
    from sandwich.compiler.gemm_formats import quantized_activations, weight_args
    from sandwich.weight_formats import dequantize, parse_format, quantize

    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    qw = quantize(rng.standard_normal((k, n), dtype=np.float32), fmt)
    arrays = dict(zip(weight_args(fmt, k), pack_weight(qw, pack_n, fmt), strict=True))
    f = parse_format(fmt)
    g = f.group_size(k)
    c = np.full((m, n), np.nan, np.float32)
    tunables = {"pack_n": pack_n, "t_n": t_n, "b_n": b_n, "pf": pf, "bits": f.bits,
                "asym": int(not f.symmetric), "s32": int(f.scale_dtype == "float32")}
    weights = {name: w for name, w in amx_weights(n, k, pack_n, g, **arrays).items() if name != "WB"}
    run(load_kernel("gemm_amx_int8"), tunables=tunables, M=m, N=n, K=k, G=g, A=a, C=c, **weights)
    ref = quantized_activations(a) @ dequantize(qw).astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_tile_store_writes_exactly_its_rows(order):
    """tile_zero then a store of 2 rows of 16 f32 into C at a stride of 16: rows 1-2 only,
    in whatever memory order the caller's array has (a flattened copy would lose them)."""
    k = kernel("tile_config(2, 0, 0, 0, 0, 0, 0, 0); tile_zero(0); tile_store(0, C[1, 0], 16);")
    c = np.ones((4, 16), np.float32, order=order)
    run(k, tunables={}, X=np.zeros((4, 32), np.int32), Y=np.zeros(64, np.int8), C=c)
    assert (c[1:3] == 0).all() and (c[[0, 3]] == 1).all()


@pytest.mark.tvm
def test_the_amx_gemm_builds_for_sapphire_rapids_and_nowhere_without_amx():
    import collections

    import tvm

    from sandwich.compiler.build import parse_tvmscript
    from sandwich.compiler.lower_tir import to_tvmscript
    from sandwich.compiler.static_check import cpu_for
    from sandwich.compiler.target import tvm_target

    k = load_kernel("gemm_amx_bf16")
    spr, zen4 = cpu_for("sapphirerapids"), cpu_for("znver4")
    assert spr.amx and not zen4.amx
    tunables = {"pack_n": 64, "t_m": 2, "t_n": 1, "b_m": 256, "b_n": 640, "b_k": 256, **BF16_W}
    src = to_tvmscript(k, tunables=tunables, vlen=16, isa=spr.isa, amx=spr.amx)
    ex = tvm.compile(parse_tvmscript(src), target=tvm_target(spr, 2))
    asm = getattr(ex, "mod", ex).inspect_source("asm")
    ops = collections.Counter(line.split()[0] for line in asm.splitlines()
                              if line.strip().startswith(("tile", "tdp", "ldtilecfg")))
    assert {"ldtilecfg", "tilezero", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease"} <= set(ops)
    with pytest.raises(DSLError, match="this target has no AMX-BF16"):
        to_tvmscript(k, tunables=tunables, vlen=16, isa=zen4.isa, amx=zen4.amx)


@pytest.mark.tvm
def test_the_amx_byte_gemm_builds_for_sapphire_rapids_and_needs_amx_int8():
    import tvm

    from sandwich.compiler.build import parse_tvmscript
    from sandwich.compiler.lower_tir import to_tvmscript
    from sandwich.compiler.static_check import cpu_for
    from sandwich.compiler.target import tvm_target

    k = load_kernel("gemm_amx_int8")
    spr = cpu_for("sapphirerapids")
    assert spr.amx_int8
    tunables = {"pack_n": 64, "t_n": 2, "b_n": 256, "pf": 4, "bits": 4, "asym": 0, "s32": 0}
    src = to_tvmscript(k, tunables=tunables, vlen=16, isa=spr.isa, amx=True, amx_int8=True,
                       fixed={"N": 256, "K": 256, "G": 32})
    # wu's rows are written in an unrolled loop, which would hold each row as its own buffer;
    # a tile loads 8 of them at a stride, so the array stays one buffer (it was split once,
    # and the tiles read 7 rows past the first's end: wrong sums on the hardware only)
    assert re.search(r"wu_\w* = T.alloc_buffer\(\(8, 64,\), \"int32\"", src)
    assert not re.search(r"wu_\w*_r\d", src)
    ex = tvm.compile(parse_tvmscript(src), target=tvm_target(spr, 2))
    asm = getattr(ex, "mod", ex).inspect_source("asm")
    assert "tdpbsud" in asm and "ldtilecfg" in asm
    with pytest.raises(DSLError, match="this target has no AMX-INT8"):
        to_tvmscript(k, tunables=tunables, vlen=16, isa=spr.isa, amx=True, amx_int8=False)


def test_linux_refuses_the_tile_state_on_a_cpu_without_amx():
    from sandwich.compiler.amx import request_tiles
    from sandwich.compiler.target import detect_cpu
    from sandwich.errors import ToolError

    if detect_cpu().amx:
        pytest.skip("this CPU has AMX: the request is granted")
    request_tiles.cache_clear()
    with pytest.raises(ToolError, match="refused this process the AMX tile state") as e:
        request_tiles()
    assert "\n" not in str(e.value)


BF16 = "gemm_bf16_mk2x32_p1x2x1_n32_s4x32x64"
Q8_0 = "gemm_int8-g32_mk2x32_p1x2x1_n32_s4x32x64"


@pytest.mark.tvm
@pytest.mark.parametrize("key", [BF16, Q8_0])
def test_bench_amx_checks_and_times_both_kernels_with_the_interpreter_standing_in(monkeypatch, key):
    """On a CPU with AMX, `bench amx` builds the AMX kernels, checks them and the family's
    kernel of the same format (bf16, or Q8_0's on 8-bit activations) against numpy and times
    them in rounds, with the vendors' bf16 GEMMs beside a bf16 one and the byte products
    beside an int one. Here the interpreter runs the AMX kernels in place of the CPU, so all
    but the hardware is exercised; a wrong AMX result is refused."""
    import dataclasses

    from sandwich.bench import amx as bench_amx
    from sandwich.bench import cache_ab
    from sandwich.compiler.gemm_dsl import amx_tunables, kernel_name
    from sandwich.compiler.gemm_formats import weight_args
    from sandwich.compiler.target import detect_cpu
    from sandwich.errors import ConfigError, SandwichError
    from sandwich.weight_formats import parse_format

    cpu = detect_cpu()
    monkeypatch.setattr(bench_amx, "detect_cpu", lambda: dataclasses.replace(
        cpu, mattr=(*cpu.mattr, "+amx-bf16", "+amx-tile", "+amx-int8")))
    wrong = []

    def interpreted(schedule, *, n, k, cpu, threads):
        """The AMX schedule's kernel in the interpreter, called as the built one is (A, the
        format's weight arrays, C)."""
        def main(ta, *rest):
            a, tc = np.from_dlpack(ta), rest[-1]
            c = np.empty((a.shape[0], n), np.float32)
            g = parse_format(schedule.dtype).group_size(k)
            weights = {name: np.from_dlpack(t) for name, t in
                       zip(weight_args(schedule.dtype, k), rest[:-1], strict=True)}
            kernel = load_kernel(kernel_name(schedule.op))
            params = {p.name for p in kernel.params}
            arrays = {name: x for name, x in amx_weights(n, k, schedule.pack_n, g, **weights).items()
                      if name in params}
            run(kernel, tunables=amx_tunables(schedule), M=a.shape[0], N=n, K=k, G=g, A=a, C=c,
                **arrays)
            np.from_dlpack(tc)[...] = c * (2 if wrong else 1)
        return {"main": main}

    monkeypatch.setattr(bench_amx, "build_gemm_dsl", interpreted)
    # two calls a timing (one warm-up, one repeat): the interpreted kernels take seconds a call,
    # and their figures mean nothing here
    monkeypatch.setattr(cache_ab, "TIMING", {"warmup": 1, "repeat": 1, "min_repeat_s": 0.0})
    lines = []
    rows = bench_amx.run_amx(schedule=key, n=64, k=64, ms=[5, 33], threads=2, rounds=2,
                             log=lines.append)
    # a row for each AMX schedule the tuner measures (the rows split, the panels split, and for
    # int weights the byte products) at each M
    per_m = 2 if key == BF16 else 3
    assert [(r.m, len(r.a_gflops), len(r.b_gflops)) for r in rows] == \
        [(5, 2, 2)] * per_m + [(33, 2, 2)] * per_m
    assert len(lines) == 2 * per_m and "B/A" in lines[0]
    dtype = key.split("_")[1]
    assert f"AMX amx_{dtype}_mk32x32_p2x1x1_n32_" in lines[0] and "_p1x2x1_n32_" in lines[1]
    assert key == BF16 or f"AMX amx8_{dtype}_mk16x32_p1x2x1_n32_" in lines[2]
    # the vendors' bf16 GEMMs in the same rounds (bf16 weights only), each checked first
    pytest.importorskip("torch")
    pytest.importorskip("openvino")
    lines.clear()
    rows = bench_amx.run_amx(schedule=key, n=64, k=64, ms=[33], threads=2, rounds=1,
                             peers=("torch", "openvino"), log=lines.append)
    if key == BF16:
        assert [r.op for r in rows][2:] == ["torch-bf16 / family", "openvino-bf16 / family"]
        assert "the best bf16 peer" in lines[-1]
    else:
        assert len(rows) == 3 and "left out for int8-g32" in lines[0]
    with pytest.raises(ConfigError, match="unknown bf16 GEMM peer 'numpy'"):
        bench_amx.run_amx(schedule=key, n=64, k=64, ms=[5], threads=2, rounds=1, peers=("numpy",))
    wrong.append(True)
    with pytest.raises(SandwichError, match="the AMX kernel"):
        bench_amx.run_amx(schedule=key, n=64, k=64, ms=[5], threads=2, rounds=1)


def test_bench_amx_refuses_a_cpu_without_amx_and_a_format_it_does_not_take():
    from cli_run import one_line_error
    from cli_run import run as cli

    from sandwich.compiler.target import detect_cpu

    one_line_error(cli("bench", "amx", "--schedule", "gemm_int4-k_mk4x64_p1x2x1_n64_s8x64x256",
                       "--n", "64", "--k", "256", "--threads", "2"), "groups of 32 values; ")
    if not detect_cpu().amx:
        one_line_error(cli("bench", "amx", "--schedule", BF16, "--n", "64", "--k", "64",
                           "--threads", "2"), "has no AMX-BF16")
