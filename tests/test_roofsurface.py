"""DECA's Roof-Surface model (tuner/roofsurface.py): Table 2 from the paper's own constants,
the BORD lines, and our kernels' signatures on made-up machines. No timing."""

import dataclasses
import math

import pytest

from sandwich.errors import ConfigError
from sandwich.tuner import roofsurface as rs

BY_NAME = {k.name: k for k in rs.TABLE2}
MEM_BOUND = {"BF8", "BF16_50%", "BF16_30%"}  # §4.1: "classified as MEM-bound by both models"


def test_table2_has_the_papers_twelve_kernels():
    assert list(BY_NAME) == ["MXFP4", "BF8", "BF8_50%", "BF8_30%", "BF8_20%", "BF8_10%",
                             "BF8_5%", "BF16_50%", "BF16_30%", "BF16_20%", "BF16_10%", "BF16_5%"]


def test_spr_machine_from_the_papers_constants():
    # §4.1: MOS = f c / 16; §7.1: 56 cores at 2.5 GHz, 850 and 260 GB/s
    assert rs.SPR_HBM.mos == pytest.approx(8.75e9)
    assert (rs.SPR_HBM.mbw, rs.SPR_DDR.mbw) == (850e9, 260e9)
    # the TMUL peak at N = 16: Table 7 prints 72 (decimal TFLOPS), Table 2 caps R-L at 70
    peak = rs.tmul_flops_per_op(16) * rs.SPR_HBM.mos
    assert round(peak / 1e12) == 72
    assert peak / rs.TABLE2_TFLOPS == pytest.approx(70.0)


@pytest.mark.parametrize("kernel", rs.TABLE2, ids=lambda k: k.name)
def test_table2_roofline_row_from_constants(kernel):
    got = rs.table2_roofline(kernel).flops
    assert rs.matches_table(got, kernel.table_rl), (kernel.name, got, kernel.table_rl)


def test_table2_roofline_needs_the_bitmask_and_the_unit():
    # the checks above can fail: a sparse tile without its 1-bit mask, or decimal TFLOPS,
    # misses the printed values
    no_mask = rs.Signature(8 / (512 * 16 * 0.3), math.inf)  # BF16_30% at 4.8 bits per weight
    flops = rs.bound(rs.SPR_HBM, no_mask, rs.tmul_flops_per_op(16)).flops / rs.TABLE2_TFLOPS
    assert not rs.matches_table(flops, BY_NAME["BF16_30%"].table_rl)
    bf8 = BY_NAME["BF8"]
    decimal = rs.table2_roofline(bf8).flops * rs.TABLE2_TFLOPS / 1e12
    assert not rs.matches_table(decimal, bf8.table_rl)


@pytest.mark.parametrize("name", sorted(MEM_BOUND))
def test_table2_rs_of_the_mem_bound_kernels_from_constants(name):
    kernel = BY_NAME[name]
    b = rs.table2_roofline(kernel)
    assert b.resource == "MEM"
    assert rs.matches_table(b.flops, kernel.table_rs), (name, b.flops, kernel.table_rs)
    assert rs.implied_ai_xv(kernel) is None
    assert rs.region(rs.SPR_HBM, rs.table2_signature(kernel)) == "MEM"


@pytest.mark.parametrize("name", sorted(set(BY_NAME) - MEM_BOUND))
def test_table2_rs_of_the_others_is_below_memory_and_matrix(name):
    # their R-S needs the AVX ops per tile, which the paper omits: only check that the printed
    # R-S sits below both other terms of Eq. 1, so the vector term is the one that binds (§4)
    kernel = BY_NAME[name]
    b = rs.table2_roofline(kernel)
    assert kernel.table_rs < b.flops and not rs.matches_table(b.flops, kernel.table_rs)
    assert rs.implied_ai_xv(kernel) > 0
    assert rs.region(rs.SPR_HBM, rs.table2_signature(kernel)) == "VEC"


def test_table2_one_vector_cost_per_family():
    """Read back, the VEC-bound entries give one AI_XV per family whatever the density, and
    sparse BF16's would leave BF16_50% and BF16_30% MEM-bound, as the table has them."""
    for family in ("BF8_", "BF16_"):
        implied = {rs.implied_ai_xv(k) for k in rs.TABLE2
                   if k.name.startswith(family) and k.name not in MEM_BOUND}
        assert max(implied) == pytest.approx(min(implied), rel=0.01), family
    ai_xv = rs.implied_ai_xv(BY_NAME["BF16_5%"])
    for name in ("BF16_50%", "BF16_30%"):
        sig = rs.Signature(BY_NAME[name].ai_xm, ai_xv)
        assert rs.region(rs.SPR_HBM, sig) == "MEM"


def test_ddr_moves_kernels_into_mem():
    # §4.2, Fig. 5b: with DDR "all of our kernels except BF8_10% and BF8_5% are in the MEM-bound
    # area"; the vector costs read back from the HBM column of Table 2 predict just that
    for name in set(BY_NAME) - {"BF8_10%", "BF8_5%"}:
        assert rs.region(rs.SPR_DDR, rs.table2_signature(BY_NAME[name])) == "MEM", name
    for name in ("BF8_10%", "BF8_5%"):
        assert rs.region(rs.SPR_DDR, rs.table2_signature(BY_NAME[name])) == "VEC", name


def test_bound_is_the_smallest_term_times_flops_per_op():
    m = rs.Machine(mbw=100.0, vos=10.0, mos=50.0)
    assert rs.bound(m, rs.Signature(0.2, 10.0), 3.0) == rs.Bound(60.0, "MEM")  # 20 < 100 < 50
    assert rs.bound(m, rs.Signature(1.0, 0.5), 3.0) == rs.Bound(15.0, "VEC")
    assert rs.bound(m, rs.Signature(1.0, 10.0), 3.0) == rs.Bound(150.0, "MTX")
    assert rs.bound(m, rs.Signature(1.0, math.inf), 1.0).resource == "MTX"
    assert rs.bound(m, rs.Signature(0.1, 1.0), 1.0).resource == "MEM"  # tie 10 = 10: MEM first


def test_a_shared_machine_adds_the_vector_and_matrix_times():
    """Where the dequantization and the products take the same ports (Machine.shared), a
    weight vector's compute time is the sum of the two: VEC 20 and MTX 30 give 12, not 20;
    MEM still overlaps them (min), and no vector work leaves MTX as it was."""
    m = rs.Machine(mbw=100.0, vos=10.0, mos=30.0, shared=True)
    assert rs.compute_rate(m, rs.Signature(1.0, 2.0)) == pytest.approx(12.0)
    assert rs.compute_rate(dataclasses.replace(m, shared=False), rs.Signature(1.0, 2.0)) == 20.0
    assert rs.bound(m, rs.Signature(1.0, 2.0), 3.0) == rs.Bound(pytest.approx(36.0), "VEC")
    assert rs.bound(m, rs.Signature(1.0, 6.0), 1.0) == rs.Bound(pytest.approx(20.0), "MTX")
    assert rs.bound(m, rs.Signature(0.1, 2.0), 1.0) == rs.Bound(10.0, "MEM")  # 10 < 12
    assert rs.bound(m, rs.Signature(0.125, 2.0), 1.0).resource == "VEC"  # 12.5 > 12
    assert rs.bound(m, rs.Signature(1.0, math.inf), 1.0) == rs.Bound(30.0, "MTX")
    # on the paper's machine (a TMUL beside the AVX units) the terms stay independent
    assert not rs.SPR_HBM.shared and not rs.SPR_DDR.shared
    host = rs.HostRates(threads=2, lanes=16, mbw=30e9, fma_vector_ops=1e10, vos={"nibbles": 1e10})
    assert host.machine(8, "int4-g32").shared and host.machine(8).shared


def test_bord_lines_split_the_plane_as_eq_1_does():
    m = rs.Machine(mbw=200.0, vos=50.0, mos=100.0)
    lines = rs.bord_lines(m)
    assert (lines.mem_vec_slope, lines.mtx_x, lines.mtx_y) == (4.0, 0.5, 2.0)
    # the three lines meet in one point
    assert lines.mem_vec_slope * lines.mtx_x == pytest.approx(lines.mtx_y)
    eps = 1.05
    # either side of y = 4x, left of x = 0.5
    assert rs.region(m, rs.Signature(0.25, 1.0 * eps)) == "MEM"
    assert rs.region(m, rs.Signature(0.25, 1.0 / eps)) == "VEC"
    # either side of x = 0.5, above y = 2
    assert rs.region(m, rs.Signature(0.5 / eps, 3.0)) == "MEM"
    assert rs.region(m, rs.Signature(0.5 * eps, 3.0)) == "MTX"
    # either side of y = 2, right of x = 0.5
    assert rs.region(m, rs.Signature(1.0, 2.0 / eps)) == "VEC"
    assert rs.region(m, rs.Signature(1.0, 2.0 * eps)) == "MTX"


def test_kernel_signatures_per_format():
    lanes = 8
    fp32 = rs.kernel_signature("fp32", lanes)
    assert fp32 == rs.Signature(1 / 32, math.inf)
    # groups of 32: products on 8-bit activations; int8 bytes go to the dot8 as they are,
    # int4 nibbles are split (ACT8_VALUE_OPS)
    q8 = rs.kernel_signature("int8-g32", lanes)  # 1 + 2/32 bytes per weight, 0 + 2/32 ops
    assert q8.ai_xm == pytest.approx(1 / 8.5) and q8.ai_xv == pytest.approx(1 / (2 / 32))
    q4 = rs.kernel_signature("int4", lanes)  # = int4-g32: 0.5 + 2/32 bytes, 3/4 + 3/32 ops
    assert q4.ai_xm == pytest.approx(1 / 4.5) and q4.ai_xv == pytest.approx(1 / (3 / 4 + 3 / 32))
    q4a = rs.kernel_signature("int4-g32-asym", lanes)  # + fp16 minimums: 0.625 bytes
    assert q4a.ai_xm == pytest.approx(1 / 5.0) and q4a.ai_xv == pytest.approx(1 / (3 / 4 + 4 / 32))
    q8c = rs.kernel_signature("int8", lanes, k=1000)  # fp32 scale per column: 4 bytes per K,
    assert q8c.ai_xm == pytest.approx(1 / (8 * (1 + 4 / 1000)))  # K no multiple of 32: f32 FMAs
    assert q8c.ai_xv == pytest.approx(1 / (2 + 1 / 1000))
    assert rs.kernel_signature("int8-g32", 16).ai_xm == pytest.approx(q8.ai_xm / 2)


@pytest.mark.parametrize("bad, match", [("int3", "unknown weight format")])
def test_kernel_signature_rejects_unknown_formats(bad, match):
    with pytest.raises(ConfigError, match=match):
        rs.kernel_signature(bad, 8)


FORMATS = ("fp32", "int8-g32", "int4-g32")


def _host(mbw, vos, fma=1e12, lanes=8):
    from sandwich.tuner.machine_bench import DEQUANT_KINDS

    return rs.HostRates(threads=1, lanes=lanes, mbw=mbw, fma_vector_ops=fma,
                        vos=dict.fromkeys(DEQUANT_KINDS, vos))


@pytest.mark.parametrize("fmt", FORMATS)
def test_our_kernels_are_mem_bound_at_m1_with_little_bandwidth(fmt):
    host = _host(mbw=1e9, vos=1e12)
    sig = rs.kernel_signature(fmt, host.lanes)
    b = rs.bound(host.machine(1), sig, rs.gemm_flops_per_op(host.lanes, 1))
    assert b.resource == "MEM"
    # 2 FLOPs per weight per row, the weights' bytes streamed once
    assert b.flops == pytest.approx(2 * host.mbw * sig.ai_xm * host.lanes)


@pytest.mark.parametrize("fmt", ("int4-g32", "int4-g32-asym", "int4"))
def test_int4_kernels_are_vec_bound_when_their_dequantization_is_slow(fmt):
    host = _host(mbw=1e11, vos=1e6)
    b = rs.bound(host.machine(1, fmt), rs.kernel_signature(fmt, host.lanes), 16)
    assert b.resource == "VEC"


@pytest.mark.parametrize("fmt", ("fp32", "int8-g32"))
def test_formats_without_a_sequence_take_the_fma_rate_for_their_vector_work(fmt):
    host = _host(mbw=1e11, vos=1e6)  # no sequence: the slow sequences do not bound them
    sig = rs.kernel_signature(fmt, host.lanes)
    assert rs.bound(host.machine(1, fmt), sig, 16).resource == "MEM"
    assert host.machine(1, fmt).vos == host.fma_vector_ops


def test_large_m_reaches_the_fma_peak():
    host = _host(mbw=50e9, vos=1e11, fma=1e10)
    sig = rs.kernel_signature("fp32", host.lanes)
    b = rs.bound(host.machine(512), sig, rs.gemm_flops_per_op(host.lanes, 512))
    assert b == rs.Bound(pytest.approx(2 * host.lanes * host.fma_vector_ops), "MTX")


def test_calibrate_uses_the_micro_benchmarks(monkeypatch):
    from sandwich.tuner import machine_bench

    monkeypatch.setattr(machine_bench, "read_bandwidth_gbs", lambda threads: 40.0 * threads)
    monkeypatch.setattr(machine_bench, "peak_gflops", lambda threads: 160.0 * threads)
    monkeypatch.setattr(machine_bench, "peak_bf16_gflops", lambda threads: None)
    monkeypatch.setattr(machine_bench, "int8_block_gops", lambda threads, narrow=False: None)
    rates = {kind: 10.0 * (i + 1) for i, kind in enumerate(machine_bench.DEQUANT_KINDS)}
    monkeypatch.setattr(machine_bench, "dequant_gops", lambda kind, threads: rates[kind] * threads)
    host = rs.calibrate(2, lanes=8)
    assert host.mbw == pytest.approx(80e9)
    assert host.fma_vector_ops == pytest.approx(320e9 / 16)
    assert host.vos == {kind: pytest.approx(2e9 * r) for kind, r in rates.items()}
    assert host.machine(4).mos == pytest.approx(host.fma_vector_ops / 4)
    assert host.bf16_dot_ops is None and host.machine(4, "bf16").mos == host.machine(4).mos
    assert host.machine(4, "bf16").vos == host.vos["bf16-widen"]  # no bf16 dot: widened
    assert host.int8_dot_ops is None and host.machine(4, "int8-g32") == host.machine(4)
    # a read and an FMA peak the caller has just measured are taken, not measured again
    for name in ("read_bandwidth_gbs", "peak_gflops"):
        monkeypatch.setattr(machine_bench, name, lambda threads: pytest.fail("measured twice"))
    given = rs.calibrate(2, lanes=8, read_gbs=80.0, peak_gflops=320.0)
    assert (given.mbw, given.fma_vector_ops) == (host.mbw, host.fma_vector_ops)


def test_bf16_weights_halve_the_bytes_and_take_the_dot_product_rate(monkeypatch):
    from sandwich.tuner import machine_bench

    dot, plain = rs.kernel_signature("bf16", 16), rs.kernel_signature("bf16", 16, bf16_dot=False)
    assert dot.ai_xm == pytest.approx(2 * rs.kernel_signature("fp32", 16).ai_xm)
    assert dot.ai_xv == float("inf") and plain.ai_xv == pytest.approx(1 / rs.BF16_WIDEN_OPS)
    monkeypatch.setattr(machine_bench, "read_bandwidth_gbs", lambda threads: 40.0)
    monkeypatch.setattr(machine_bench, "peak_gflops", lambda threads: 200.0)
    monkeypatch.setattr(machine_bench, "peak_bf16_gflops", lambda threads: 400.0)
    monkeypatch.setattr(machine_bench, "int8_block_gops", lambda threads, narrow=False: None)
    host = rs.calibrate(2, lanes=16)
    assert host.bf16_dot_ops == pytest.approx(400e9 / 64)  # 16 lanes x 2 products x 2 FLOPs
    b = rs.bound(host.machine(512, "bf16"), dot, rs.gemm_flops_per_op(16, 512))
    assert b == rs.Bound(pytest.approx(400e9), "MTX")
    b = rs.bound(host.machine(512), rs.kernel_signature("fp32", 16), rs.gemm_flops_per_op(16, 512))
    assert b == rs.Bound(pytest.approx(200e9), "MTX")


def _cli(monkeypatch, capsys, *argv):
    from sandwich.cli import main
    from sandwich.compiler import target

    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    # LLVM's name of the host CPU would start TVM (seconds); the flags are enough here
    host_cpu = target.detect_cpu(llvm_cpu="x86-64")
    monkeypatch.setattr(target, "detect_cpu", lambda: host_cpu)
    monkeypatch.setattr(rs, "calibrate", lambda threads, lanes: dataclasses.replace(
        _host(20e9, 5e9, 5e9, lanes), int8_dot_ops=2e9))
    code = main(["roofsurface", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv, match", [
    (("--format", "int3"), "unknown weight format"),
    (("--m", "1,x"), "--m must be comma-separated integers"),
    (("--m", "0"), "--m values must be >= 1"),
])
def test_cli_input_errors_are_one_line(monkeypatch, capsys, argv, match):
    code, out = _cli(monkeypatch, capsys, *argv)
    lines = out.err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and match in lines[0], out.err


def test_cli_prints_every_format_and_m_and_draws(monkeypatch, capsys, tmp_path):
    png = tmp_path / "bord" / "bord.png"
    code, out = _cli(monkeypatch, capsys, "--format", "int8-g32", "--format", "int4",
                     "--m", "8,1", "--png", str(png))
    assert code == 0, out.err
    assert "ASSUMPTION" not in out.out and "nibbles 5.00" in out.out
    assert [line.split()[:4] for line in out.out.splitlines() if line.startswith("INT8")] == [
        ["INT8", "2.00", "G", "dot8/s"]]
    rows = [line.split() for line in out.out.splitlines()
            if line.startswith(("int8-g32 ", "int4-g32 "))]
    assert [(r[0], r[1]) for r in rows] == [("int8-g32", "1"), ("int8-g32", "8"),
                                            ("int4-g32", "1"), ("int4-g32", "8")]
    assert all(r[-1] in rs.RESOURCES for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_int_formats_on_8_bit_activations_take_the_dot8_rate(monkeypatch):
    """Groups of 32: the matrix op is dot8 at its rate measured in the tile's blocks (8 ops a
    lane; four weight vectors a dot8 per row; the block's 3 scaling ops are in that rate),
    other groups scale the block by its op count (one group along K: 8 + 2 + 32 / 4096 of the
    measured 11); a weight vector's dequantization is 0 ops for int8, 3/4 for int4's nibble
    split, plus the group's scaling; a per-column int8 whose K is no multiple of 32 keeps f32
    FMAs on converted values. int4's bytes stay below 128, so its dot8 runs at the narrow
    rate (pmaddubsw without VNNI), int8's at the full-byte one."""
    from sandwich.tuner import machine_bench

    monkeypatch.setattr(machine_bench, "read_bandwidth_gbs", lambda threads: 30.0)
    monkeypatch.setattr(machine_bench, "peak_gflops", lambda threads: 200.0)
    monkeypatch.setattr(machine_bench, "peak_bf16_gflops", lambda threads: None)
    monkeypatch.setattr(machine_bench, "peak_int8_gops", lambda threads, narrow=False: 1e6)
    monkeypatch.setattr(machine_bench, "int8_block_gops",
                        lambda threads, narrow=False: 600.0 if narrow else 400.0)
    host = rs.calibrate(2, lanes=16)
    assert host.int8_dot_ops == pytest.approx(400e9 / 128)  # 16 lanes x 4 products x 2 ops
    assert host.narrow_dot_ops == pytest.approx(600e9 / 128)
    for fmt, ops, peak in (("int8-g32", 0.0, 400e9), ("int4-g32", 0.75, 600e9)):
        sig = rs.kernel_signature(fmt, 16)
        assert 1 / sig.ai_xv == pytest.approx(ops + (3 if fmt == "int4-g32" else 2) / 32)
        # M = 512: 4 x 400e9 / 128 / 512 weight vectors/s of 2 x 16 x 512 FLOPs: the block
        # rate as measured; the bound adds the dequantization's time to the products'
        per_op = rs.gemm_flops_per_op(16, 512)
        terms = rs.rates(host.machine(512, fmt), sig)
        assert terms["MTX"] * per_op == pytest.approx(peak)
        b = rs.bound(host.machine(512, fmt), sig, per_op)
        assert b == rs.Bound(pytest.approx(per_op / (1 / terms["VEC"] + 1 / terms["MTX"])), "MTX")
    per_column = host.machine(512, "int8", k=4096).mos
    assert per_column == pytest.approx(4 * 11 / (10 + 32 / 4096) * host.int8_dot_ops / 512)
    assert host.machine(512, "int8", k=1000).mos == pytest.approx(host.fma_vector_ops / 512)
    assert 1 / rs.kernel_signature("int8", 16, k=1000).ai_xv > 2


def test_vos_is_each_sequence_rate_with_the_epilogue_at_the_fma_rate():
    """A format's VOS combines its dequantization sequence at that sequence's measured rate
    with its group epilogue (scaling FMAs, fp16 conversions) at the FMA rate; a format with
    no sequence takes the FMA rate, and the VEC term follows the measured rate."""
    fma = 1e10
    host = rs.HostRates(threads=1, lanes=16, mbw=1e9, fma_vector_ops=fma, bf16_dot_ops=1e10,
                        int8_dot_ops=1e10, vos={"nibbles": 2 * fma, "int8-widen": 3 * fma,
                                                "int4-widen": 4 * fma, "bf16-widen": 5 * fma})
    d = rs.dequantization("int4-g32")
    assert (d.kind, d.ops, d.epilogue_ops) == ("nibbles", 0.75, 3 / 32)
    assert host.vos_for("int4-g32") == pytest.approx(d.total / (0.75 / (2 * fma) + 3 / 32 / fma))
    assert host.vos_for("int8-g32") == fma and host.vos_for("fp32") == fma
    assert host.vos_for("int8", k=1000) == pytest.approx(  # K no multiple of 32: f32 FMAs
        (2 + 1 / 1000) / (2 / (3 * fma) + 1 / 1000 / fma))
    plain = dataclasses.replace(host, bf16_dot_ops=None)
    assert plain.vos_for("bf16") == pytest.approx(5 * fma) and host.vos_for("bf16") == fma
    sig = rs.kernel_signature("int4-g32", 16)
    slow = dataclasses.replace(host, vos={**host.vos, "nibbles": fma / 100})
    for h in (host, slow):
        assert rs.rates(h.machine(8, "int4-g32"), sig)["VEC"] == pytest.approx(
            h.vos_for("int4-g32") * sig.ai_xv)
    assert slow.vos_for("int4-g32") < host.vos_for("int4-g32") / 10


def test_bf16_on_amx_tiles_takes_the_tile_rate(monkeypatch):
    """A row the AMX kernel runs has AMX's measured tile rate for its MTX term (6000 GFLOPS
    here, 26x the bf16 dot product's 230): at M = 512 a bf16 GEMM is bound there; at M = 1
    by its weights' bytes (2 FLOPs a 2-byte weight: the read in GFLOPS). No AMX rate, or
    weights that are not 16-bit, no AMX machine."""
    from sandwich.tuner import machine_bench

    monkeypatch.setattr(machine_bench, "read_bandwidth_gbs", lambda threads: 30.0)
    monkeypatch.setattr(machine_bench, "peak_gflops", lambda threads: 460.0)
    monkeypatch.setattr(machine_bench, "peak_bf16_gflops", lambda threads: 230.0)
    monkeypatch.setattr(machine_bench, "peak_amx_bf16_gflops", lambda threads: 6000.0)
    monkeypatch.setattr(machine_bench, "int8_block_gops", lambda threads, narrow=False: 400.0)
    host = rs.calibrate(2, lanes=16)
    assert host.amx_flops == pytest.approx(6000e9)
    sig = rs.kernel_signature("bf16", 16, bf16_dot=True)
    big = rs.bound(host.machine(512, "bf16", amx=True), sig, rs.gemm_flops_per_op(16, 512))
    assert big == rs.Bound(pytest.approx(6000e9), "MTX")
    assert rs.bound(host.machine(512, "bf16"), sig, rs.gemm_flops_per_op(16, 512)).flops == \
        pytest.approx(230e9)  # the family's vdpbf16ps
    one = rs.bound(host.machine(1, "bf16", amx=True), sig, rs.gemm_flops_per_op(16, 1))
    assert one == rs.Bound(pytest.approx(30e9), "MEM")
    with pytest.raises(ConfigError, match="no AMX rate"):
        dataclasses.replace(host, amx_flops=None).machine(512, "bf16", amx=True)
    with pytest.raises(ConfigError, match="no AMX rate for fp32"):
        host.machine(512, "fp32", amx=True)
    with pytest.raises(ConfigError, match="no AMX rate for int4-k"):
        host.machine(512, "int4-k", amx=True)  # the AMX kernel does not take K-quants


def test_int_weights_on_amx_tiles_are_bound_by_their_rounding_where_few_rows_share_it():
    """The AMX kernel rounds int weights to bf16 once per chunk of b_m rows of each row
    thread: AI_XV = 1 / (ops a weight vector x roundings), at the FMA rate, its time added to
    the tiles'. With the largest chunks (256 rows) the tiles take most of M = 512's (MTX);
    with 32-row chunks split over two threads M = 2048 rounds each vector 64 times and the
    rounding takes most (VEC); at M = 1
    the bytes do (int8-g32: 34 bytes per 32 values)."""
    host = rs.HostRates(threads=2, lanes=16, mbw=30e9, fma_vector_ops=460e9 / 32, vos={},
                        amx_flops=6000e9)
    ops = rs.AMX_ROUND_OPS[8]
    sig = rs.amx_signature("int8-g32", 16, m=512)
    assert sig.ai_xv == pytest.approx(1 / (2 * ops))
    assert sig.ai_xm == pytest.approx(rs.kernel_signature("int8-g32", 16).ai_xm)
    per_op = rs.gemm_flops_per_op(16, 512)
    rounding = 460e9 / 32 * per_op / (2 * ops)  # the rounding's time adds to the tiles'
    assert rs.bound(host.machine(512, "int8-g32", amx=True), sig, per_op) == \
        rs.Bound(pytest.approx(1 / (1 / 6000e9 + 1 / rounding)), "MTX")
    small = rs.amx_signature("int8-g32", 16, m=2048, rows=32, t_m=2)
    assert small.ai_xv == pytest.approx(1 / (64 * ops))
    b = rs.bound(host.machine(2048, "int8-g32", amx=True), small, rs.gemm_flops_per_op(16, 2048))
    rounding = 460e9 / 32 * 2 * 16 * 2048 / (64 * ops)
    assert b == rs.Bound(pytest.approx(1 / (1 / 6000e9 + 1 / rounding)), "VEC")
    one = rs.bound(host.machine(1, "int8-g32", amx=True), rs.amx_signature("int8-g32", 16, m=1),
                   rs.gemm_flops_per_op(16, 1))
    assert one == rs.Bound(pytest.approx(30e9 / 34 * 32 * 2), "MEM")
    for fmt in ("int4-k", "bf16", "fp32"):
        with pytest.raises(ConfigError, match="does not take"):
            rs.amx_signature(fmt, 16, m=512)


def test_int_weights_on_amx_byte_products_are_bound_by_their_scaling_per_row():
    """The byte-product AMX kernel scales each block's sums on the vector units once per row
    (AMX8_ROW_OPS a weight vector) and splits int4's nibbles once per block: its VEC term
    grows with M where the rounding kernel's does not, int4's lies above int8's, and the
    tiles' time adds to it (the same ports do not run them, but each block's tiles and its
    scaling run one after the other). Weights from a cache (300 GB/s), so compute bounds."""
    host = rs.HostRates(threads=2, lanes=16, mbw=300e9, fma_vector_ops=460e9 / 32, vos={},
                        amx_flops=6000e9)
    int8, int4 = (rs.amx8_signature(f, 16, m=16) for f in ("int8-g32", "int4-g32"))
    assert int8.ai_xv == pytest.approx(1 / (rs.AMX8_BLOCK_OPS[8] + 16 * rs.AMX8_ROW_OPS))
    assert int4.ai_xv < int8.ai_xv and int4.ai_xm == rs.kernel_signature("int4-g32", 16).ai_xm
    assert rs.amx8_signature("int8-g32", 16, m=64).ai_xv < int8.ai_xv  # more rows, more scaling
    per_op = rs.gemm_flops_per_op(16, 16)
    vec = 460e9 / 32 * per_op * int8.ai_xv
    assert rs.bound(host.machine(16, "int8-g32", amx=True), int8, per_op) == \
        rs.Bound(pytest.approx(1 / (1 / 6000e9 + 1 / vec)), "VEC")
    for fmt in ("int4-k", "bf16", "fp32"):
        with pytest.raises(ConfigError, match="does not take"):
            rs.amx8_signature(fmt, 16, m=16)
