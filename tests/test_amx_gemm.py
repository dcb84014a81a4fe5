"""bf16 GEMMs on AMX tiles through the kernel cache: which GEMMs get an AMX schedule, its
calling convention and records, and, on a CPU with AMX-BF16, the kernel the cache serves and
the tune that chooses it, against numpy."""

import dataclasses

import numpy as np
import pytest

from sandwich.compiler.gemm_dsl import (
    amx8_schedules,
    amx_panel,
    amx_schedules,
    amx_tvmscript,
    build_gemm_dsl,
    lowering_files,
)
from sandwich.compiler.gemm_runner import aligned_empty, gemm_args
from sandwich.compiler.static_check import cpu_for
from sandwich.compiler.target import detect_cpu
from sandwich.runtime import KernelCache
from sandwich.tuner.budget import get_budget
from sandwich.tuner.record_check import record_problem
from sandwich.tuner.reference import reference_matmul
from sandwich.tuner.trial_log import parse_schedule_key
from sandwich.tuner.tune import tune_op
from sandwich.tuner.tuning_db import StoredRecord
from sandwich.tuner.tvm_measure import kernel_rows, kernel_weights, result_error
from sandwich.types import AMX8_OP, AMX_OP, GemmOp, TuneRecord
from sandwich.weight_formats import dequantize, quantize

pytestmark = pytest.mark.tvm

N, K = 128, 96
HAS_AMX = detect_cpu().amx
HAS_AMX8 = detect_cpu().amx_int8


def test_amx_schedules_only_where_its_32_x_32_blocks_fit():
    spr = cpu_for("sapphirerapids")
    rows, panels = amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=spr)
    for s in (rows, panels):
        assert (s.op, s.dtype, s.pack_n) == (AMX_OP, "bf16", 64)
        assert parse_schedule_key(s.key()) == s  # logs and `bench schedules` name it
        assert s.family() == s and s.family_key() == s.key()  # its blocks are built in
    assert rows.polymerization.t_m == 2 and panels.polymerization.t_n == 2
    assert amx_schedules(n=96, k=K, pack_n=48, threads=2, cpu=spr) == []  # a 48-wide panel
    assert amx_schedules(n=N, k=80, pack_n=64, threads=2, cpu=spr) == []  # K not whole blocks
    assert amx_schedules(n=N, k=K, pack_n=64, threads=5, cpu=spr) == []  # outside its domains
    assert amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu_for("znver4")) == []  # no AMX


@pytest.mark.parametrize("dtype,runs", [("int8-g32", True), ("int4-g32", True), ("int4-g64-asym", True),
                                        ("int8", True), ("int4-k", False), ("int6-k", False),
                                        ("float32", False)])
def test_int_weights_in_groups_of_32_run_on_amx_tiles_too(dtype, runs):
    """Q8_0, Q4_0, Q4_1 (and int8 per column) are rounded to bf16 a block at a time; the
    K-quants' super-blocks and fp32 (which the family's FMAs run exactly) are not offered."""
    spr = cpu_for("sapphirerapids")
    got = amx_schedules(n=N, k=256, pack_n=64, threads=2, cpu=spr, dtype=dtype)
    assert [s.dtype for s in got] == ([dtype] * 2 if runs else [])  # N = 128: the largest
    # blocks are the row split's
    assert amx_panel(n=2304, k=768, pack_n=48, cpu=spr, dtype=dtype) == (64 if runs else 48)


@pytest.mark.parametrize("dtype,runs", [("int8-g32", True), ("int4-g32", True), ("int4-g64-asym", True),
                                        ("int8", True), ("bf16", False), ("int4-k", False),
                                        ("float32", False)])
def test_int_weights_run_on_amx_byte_products_where_the_cpu_has_amx_int8(dtype, runs):
    """One schedule per (N, K): the panels split over the threads, W's blocks sized to a
    quarter of L2; only int8 / int4 in whole blocks of 32 (the family's 8-bit activations),
    only 32- or 64-wide panels, only with AMX-INT8."""
    spr = cpu_for("sapphirerapids")
    got = amx8_schedules(n=N, k=256, pack_n=64, threads=2, cpu=spr, dtype=dtype)
    assert [s.dtype for s in got] == ([dtype] if runs else [])
    for s in got:
        assert (s.op, s.pack_n, s.polymerization.t_n) == (AMX8_OP, 64, 2)
        assert parse_schedule_key(s.key()) == s and s.family() == s and s.family_key() == s.key()
        assert s.slice.b_n == 128  # N: every block of its weights fits a quarter of L2
    assert amx8_schedules(n=96, k=256, pack_n=48, threads=2, cpu=spr, dtype="int8-g32") == []
    assert amx8_schedules(n=N, k=256, pack_n=64, threads=5, cpu=spr, dtype="int8-g32") == []
    assert amx8_schedules(n=N, k=256, pack_n=64, threads=2, cpu=cpu_for("znver4"),
                          dtype="int8-g32") == []


def test_the_amx_blocks_are_sized_from_the_caches():
    """The row split: W's block takes at most a quarter of L2, 32 rows of A's K block at most
    a third of L1; the panel split runs one panel and the whole K a block; both take a
    thread's rows in chunks whose A takes at most 3/8 of L2, and at most 256 rows. A third,
    the row split in the largest blocks (256 rows, W's b_k rows in a quarter of L2: 1024
    columns), where it differs from the first once the blocks run (N = 128: it does not)."""
    spr = cpu_for("sapphirerapids")  # 48 KiB L1d, 2 MiB L2
    for k, b_m, b_n, whole_k in ((768, 256, 320, 1024), (3072, 128, 64, 4096),
                                 (5504, 64, 64, 8192)):
        rows, panels, large = amx_schedules(n=64 * 96, k=k, pack_n=64, threads=2, cpu=spr)
        assert (rows.slice.b_m, rows.slice.b_n, rows.slice.b_k) == (b_m, b_n, 256)
        assert (panels.slice.b_m, panels.slice.b_n, panels.slice.b_k) == (b_m, 64, whole_k)
        assert (large.slice.b_m, large.slice.b_n, large.slice.b_k) == (256, 1024, 256)
        assert large.polymerization == rows.polymerization
        assert b_n * k * 2 <= spr.l2_bytes // 4 or b_n == 64
        assert b_m * k * 2 <= 3 * spr.l2_bytes // 8
    assert len(amx_schedules(n=128, k=768, pack_n=64, threads=2, cpu=spr)) == 2


def test_bf16_weights_are_packed_in_panels_the_amx_blocks_divide_where_it_runs():
    spr, zen4 = cpu_for("sapphirerapids"), cpu_for("znver4")
    assert amx_panel(n=2304, k=768, pack_n=48, cpu=spr) == 64  # the probe's 48 would leave it out
    assert amx_panel(n=96, k=768, pack_n=48, cpu=spr) == 32
    assert amx_panel(n=2304, k=768, pack_n=64, cpu=spr) == 64
    assert amx_panel(n=2304, k=768, pack_n=48, cpu=zen4) == 48  # no AMX: the probe decides
    assert amx_panel(n=2304, k=80, pack_n=48, cpu=spr) == 48  # K not whole blocks


def test_an_amx_kernel_is_called_as_the_family_without_its_slice():
    s = amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu_for("sapphirerapids"))[0]
    src = amx_tvmscript(s, n=N, k=K, lanes=16)
    assert "def main(A_h: T.handle, WB_h: T.handle, C_h: T.handle)" in src
    a, out = aligned_empty((5, K)), aligned_empty((5, N))
    wb = aligned_empty((N // 64, K // 2, 64), np.int32)
    assert len(gemm_args(a, (wb,), out, s)) == 3
    q8 = amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu_for("sapphirerapids"), dtype="int8-g32")[0]
    assert "def main(A_h: T.handle, Q8Q_h: T.handle, S_h: T.handle, C_h: T.handle)" in \
        amx_tvmscript(q8, n=N, k=K, lanes=16)  # the family's arrays for Q8_0
    assert any(p.name == "gemm_amx_bf16.sw" for p in lowering_files())  # it keys the cache too


def test_an_edited_copy_of_the_amx_kernel_builds_in_its_place(tmp_path):
    """`bench kernels` on an AMX schedule times an edited copy of gemm_amx_bf16.sw: the copy's
    kernel is found by its name and lowered instead of the shipped one; a file without it
    gets one line."""
    from sandwich.compiler.gemm_dsl import AMX_KERNEL, load_family
    from sandwich.dsl.load import builtin_kernels
    from sandwich.errors import ConfigError

    s = amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu_for("sapphirerapids"))[0]
    text = builtin_kernels()[AMX_KERNEL].read_text()
    same, edited = tmp_path / "same.sw", tmp_path / "edited.sw"
    same.write_text("// a copy\n" + text)
    edited.write_text(text.replace("tile_dpbf16(1, 4, 7);", "tile_dpbf16(1, 4, 6);", 1))
    shipped = amx_tvmscript(s, n=N, k=K, lanes=16)
    assert amx_tvmscript(s, n=N, k=K, lanes=16, kernel=load_family(same, AMX_KERNEL)) == shipped
    assert amx_tvmscript(s, n=N, k=K, lanes=16, kernel=load_family(edited, AMX_KERNEL)) != shipped
    with pytest.raises(ConfigError, match="has no kernel named gemm_family$"):
        load_family(same)


@pytest.mark.skipif(not HAS_AMX, reason="the CPU has no AMX-BF16")
def test_bench_kernels_times_two_versions_of_the_amx_kernel(tmp_path):
    from sandwich.bench.kernel_ab import run_kernel_ab
    from sandwich.dsl.load import builtin_kernels

    copy = tmp_path / "gemm_amx_bf16.sw"
    copy.write_text("// a copy\n" + builtin_kernels()["gemm_amx_bf16"].read_text())
    s = amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=detect_cpu())[0]
    res = run_kernel_ab(a_src=None, b_src=str(copy), schedules=[s.key()], n=N, k=K, ms=[40],
                        threads=2, rounds=1, log=lambda _: None, llc=1 << 16)
    assert [(r.op, r.m) for r in res.rows] == [(s.key(), 40)] and res.rows[0].ratio > 0


def test_amx_records_are_bf16_records():
    s = amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu_for("sapphirerapids"))[0]

    def rec(dtype):
        return StoredRecord(TuneRecord("fp", "t", N, K, dtype, 1, 64, s, 900.0, 1, 0.1), 2, False)
    assert record_problem(rec("bf16"), lanes=16) is None
    assert "amx/bf16 for a float32 record" in record_problem(rec("float32"), lanes=16)
    s = amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu_for("sapphirerapids"), dtype="int4-g32")[0]
    assert record_problem(rec("int4-g32"), lanes=16) is None
    s = dataclasses.replace(s, dtype="int4-k")  # a format the AMX kernel does not take
    assert "amx/int4-k for a int4-k record" in record_problem(rec("int4-k"), lanes=16)
    s = amx8_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu_for("sapphirerapids"), dtype="int8-g32")[0]
    assert record_problem(rec("int8-g32"), lanes=16) is None
    s = dataclasses.replace(s, dtype="bf16")  # byte products take int weights only
    assert "amx8/bf16 for a bf16 record" in record_problem(rec("bf16"), lanes=16)


@pytest.mark.skipif(not HAS_AMX, reason="the CPU has no AMX-BF16")
@pytest.mark.parametrize("dtype", ["bf16", "int8-g32", "int4-g32-asym"])
@pytest.mark.parametrize("split", [0, 1], ids=["rows", "panels"])
def test_the_cache_serves_an_amx_record_at_any_m(tmp_path, split, dtype):
    """Stored and recorded as the tuner stores a winner, then loaded by a GemmKernel (which
    asks Linux for the tile state first): 20 random M, every tail of the 32-row blocks."""
    cpu = KernelCache(tmp_path).cpu
    gemm = _served(tmp_path, amx_schedules(n=N, k=K, pack_n=64, threads=2, cpu=cpu, dtype=dtype)[split])
    assert gemm.schedule_for(7).op == AMX_OP
    rng = np.random.default_rng(3)
    assert _errors(gemm, sorted(rng.choice(np.arange(1, 300), 20, replace=False)), rng, dtype) == []


@pytest.mark.skipif(not HAS_AMX8, reason="the CPU has no AMX-INT8")
@pytest.mark.parametrize("dtype", ["int8-g32", "int4-g32", "int4-g32-asym", "int8"])
def test_the_cache_serves_an_amx_byte_record_at_any_m(tmp_path, dtype):
    """The byte-product kernel stored and recorded as a tune's winner, then served at decode's
    Ms and past them (every tail of the 16-row blocks) against numpy on what it multiplies:
    the family's 8-bit activations times the dequantized weights."""
    (s,) = amx8_schedules(n=N, k=K, pack_n=64, threads=2, cpu=KernelCache(tmp_path).cpu, dtype=dtype)
    gemm = _served(tmp_path, s)
    assert gemm.schedule_for(3).op == AMX8_OP
    assert _errors(gemm, [1, 2, 4, 8, 15, 16, 17, 40, 77], np.random.default_rng(6), dtype) == []


def _served(tmp_path, s):
    """Schedule `s`'s kernel stored and recorded for every M as the tuner stores a winner,
    then the GEMM a fresh KernelCache serves from them."""
    cache = KernelCache(tmp_path)
    cache.store_kernel(build_gemm_dsl(s, n=N, k=K, cpu=cache.cpu, threads=2), n=N, k=K,
                       dtype=s.dtype, schedule=s)
    cache.db.put_record(TuneRecord(cache.fingerprint, "t", N, K, s.dtype, 1, 256, s, 900.0, 1, 0.1),
                        threads=2)
    return KernelCache(tmp_path).gemm(n=N, k=K, dtype=s.dtype, threads=2)


def _errors(gemm, ms, rng, dtype: str = "bf16") -> list[str]:
    """The GEMM at each M against float64 on what a kernel on AMX tiles multiplies (A rounded
    to bf16, the weights' values times their scales rounded to bf16), as the tuner checks
    its candidates; a family-run M against what the family multiplies."""
    qw = quantize(rng.standard_normal((K, N), dtype=np.float32), dtype)
    wp, w = gemm.pack(qw), dequantize(qw)
    out = []
    for m in ms:
        a = rng.standard_normal((m, K), dtype=np.float32)
        s = gemm.schedule_for(m)
        rows = kernel_rows(dtype, K, s.op)
        ref = reference_matmul(rows(a) if rows else a, kernel_weights(w, dtype, s.op))
        out.append(result_error(gemm(a, wp), ref, s))
    return [e for e in out if e]


@pytest.mark.skipif(not HAS_AMX, reason="the CPU has no AMX-BF16")
def test_a_bf16_tune_offers_the_amx_kernel_and_keeps_what_matches_numpy(tmp_path):
    """On an AMX CPU a bf16 tune times the AMX kernel at every M beside the family's winner;
    whichever it records, the cache's GEMM matches numpy."""
    cache = KernelCache(tmp_path)
    rep = tune_op(names=["t"], op=GemmOp("t", N, K, "bf16"), seq_max=64, threads=2,
                  budget=get_budget("tiny"), cache=cache)
    assert rep.searched > 0 and cache.verify() == []
    assert {r.schedule.op for r in rep.results} <= {"gemm", AMX_OP}
    gemm = cache.gemm(n=N, k=K, dtype="bf16", threads=2)
    assert _errors(gemm, [1, 5, 33, 64, 100], np.random.default_rng(4)) == []


@pytest.mark.skipif(not HAS_AMX, reason="the CPU has no AMX-BF16")
def test_an_int8_tune_offers_the_amx_kernel_and_keeps_what_matches_numpy(tmp_path, monkeypatch):
    """Q8_0 weights: the tune packs them in panels the AMX kernels take and times them beside
    the VNNI family at every M past decode's (there the family alone: its 8-bit activations
    whatever the batch): bf16 products, and byte products where the CPU has AMX-INT8;
    whichever it records matches what it multiplies."""
    from sandwich.tuner import tune

    offered = []

    def spy(measure, amx, res):
        offered.extend((res.m, s.op) for s in amx)
        return amx_or_family(measure, amx, res)
    amx_or_family = tune._amx_or_family
    monkeypatch.setattr(tune, "_amx_or_family", spy)
    cache = KernelCache(tmp_path)
    budget = get_budget("tiny")
    rep = tune_op(names=["t"], op=GemmOp("t", N, K, "int8-g32"), seq_max=64, threads=2,
                  budget=budget, cache=cache)
    assert rep.searched > 0 and cache.verify() == []
    assert {r.schedule.pack_n for r in rep.results} == {64}
    decode = [r.m for r in rep.results if r.m <= budget.settings.skinny_m]
    assert decode and offered and min(m for m, _ in offered) > budget.settings.skinny_m
    assert all(r.schedule.op == "gemm" for r in rep.results if r.m in decode)
    past = {r.m for r in rep.results if r.m > budget.settings.skinny_m}
    assert {m for m, op in offered if op == AMX8_OP} == (past if HAS_AMX8 else set())
    gemm = cache.gemm(n=N, k=K, dtype="int8-g32", threads=2)
    assert _errors(gemm, [1, 5, 33, 64, 100], np.random.default_rng(4), "int8-g32") == []
