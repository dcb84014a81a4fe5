"""bf16 weights in the GEMM family (issue 26, item 2): A rounded to bf16 as it is read, pairs
along K multiplied by vdpbf16ps where the CPU has avx512_bf16 and by f32 FMAs elsewhere, both
checked against numpy on the same bf16 values."""

import dataclasses

import numpy as np
import pytest

from sandwich.compiler.gemm_dsl import gemm_dsl_tvmscript
from sandwich.compiler.gemm_runner import gemm_args, pack_weight
from sandwich.dsl.interp import _bf16pair, _dotbf16
from sandwich.errors import ShapeError
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization
from sandwich.weight_formats import dequantize, quantize, round_bf16

LANES = 16


def _schedule(lanes: int, t_k: int = 1, b_k: int = 48) -> KernelSchedule:
    return KernelSchedule(MicroKernel(3, 2 * lanes), ComputeSlice(6, 4 * lanes, b_k),
                          Polymerization(1, 2 // t_k, t_k), 2 * lanes, dtype="bf16")


def test_pack_bf16_pairs_values_along_k():
    w = np.random.default_rng(0).standard_normal((6, 32), dtype=np.float32)
    (wb,) = pack_weight(w, 16, "bf16")
    assert wb.shape == (2, 3, 16) and wb.dtype == np.int32
    bits = wb.view(np.uint32)
    lo = ((bits & 0xFFFF) << 16).view(np.float32)
    hi = (bits & 0xFFFF0000).view(np.float32)
    back = np.stack([lo, hi], axis=2)  # [panel, kk, pair, j]: value k = 2 kk + pair
    back = back.reshape(2, 6, 16).transpose(1, 0, 2).reshape(6, 32)
    np.testing.assert_array_equal(back, dequantize(quantize(w, "bf16")))
    with pytest.raises(ShapeError, match="even K"):
        pack_weight(w[:5], 16, "bf16")


def test_an_odd_k_panel_is_refused_before_the_kernel_runs():
    a = np.zeros((4, 64), np.float32)
    (wb,) = pack_weight(np.zeros((64, 32), np.float32), 32, "bf16")
    with pytest.raises(ShapeError, match="b_k=33 must be even"):
        gemm_args(a, wb, np.zeros((4, 32), np.float32), _schedule(16, b_k=33))


def test_the_interpreter_sums_a_pair_as_vdpbf16ps_does():
    x = np.float32([1.00390625, -3.5, 0.1, 7.0])  # 1 + 2^-8 rounds to 1 (even), 0.1 rounds
    p = _bf16pair(float(x[0]), float(x[1]))
    w = _bf16pair(float(x[2]), float(x[3]))
    r = round_bf16(x)
    assert p & 0xFFFF == int(np.float32(r[0]).view(np.uint32) >> 16)
    expect = np.float32(np.float32(2.0) + r[3] * r[1]) + r[2] * r[0]
    assert _dotbf16(2.0, w, p) == float(np.float32(expect))


def test_vdpbf16ps_only_where_the_target_has_it():
    s = _schedule(LANES)
    with_dot = gemm_dsl_tvmscript(s, n=6 * LANES, k=256, lanes=LANES, l2_bytes=1 << 20, isa="avx512", bf16_dot=True)
    without = gemm_dsl_tvmscript(s, n=6 * LANES, k=256, lanes=LANES, l2_bytes=1 << 20, isa="avx512")
    assert "sandwich_dpbf16ps" in with_dot
    assert "dpbf16ps" not in without and "-65536" in without
    avx2 = gemm_dsl_tvmscript(_schedule(8), n=48, k=256, lanes=8, l2_bytes=1 << 20, isa="avx2", bf16_dot=True)
    assert "dpbf16ps" not in avx2


def _cpus():
    from sandwich.compiler.target import detect_cpu

    cpu = detect_cpu()
    plain = dataclasses.replace(cpu, mattr=tuple(a for a in cpu.mattr if a != "+avx512bf16"))
    return [pytest.param(cpu, id="host"), pytest.param(plain, id="no-avx512bf16")]


@pytest.mark.tvm
@pytest.mark.parametrize("cpu", _cpus())
@pytest.mark.parametrize("t_k", [1, 2])
def test_bf16_family_matches_numpy_at_20_random_m(cpu, t_k):
    """A 3-row tile (the 2 and 1-row tail tiles run too), split-K over two threads or not,
    a K panel of 48 (24 pairs), against numpy on A and W rounded to bf16."""
    from sandwich.compiler.gemm_dsl import build_gemm_dsl
    from sandwich.tuner.tvm_measure import check_against_numpy

    lanes = cpu.lanes_f32
    n, k = 6 * lanes, 256
    schedule = _schedule(lanes, t_k)
    func = build_gemm_dsl(schedule, n=n, k=k, cpu=cpu, threads=2)["main"]
    rng = np.random.default_rng(t_k)
    qw = quantize(rng.standard_normal((k, n), dtype=np.float32), "bf16")
    packed = pack_weight(qw, schedule.pack_n, schedule.dtype)
    w = dequantize(qw)
    for m in sorted(rng.choice(np.arange(1, 200), size=20, replace=False)):
        a = rng.standard_normal((int(m), k), dtype=np.float32)
        assert check_against_numpy(func, schedule, a, packed, w) == "", m


SPECIAL = np.array([0x7F800001, 0xFF800100, 0x7FC00000, 0x7F7FFFFF, 0x7F800000, 0x00000001],
                   np.uint32).view(np.float32)  # NaNs with a low payload, max float, inf, denormal


def test_the_interpreter_rounds_special_values_as_the_weights_are_rounded():
    """The interpreter's bf16pair on special values is weight_formats.round_bf16's (ggml's):
    NaNs stay NaN, the largest float rounds to inf, inf and denormals keep their upper half.
    (Its values pass through Python floats, which already quiet a NaN; the kernel test below
    is the one a payload carried into an infinity would fail.)"""
    got = [_bf16pair(float(v), 0.0) & 0xFFFF for v in SPECIAL]
    want = (round_bf16(SPECIAL).view(np.uint32) >> 16).tolist()
    assert got == want and all(b & 0x7FFF > 0x7F80 for b in got[:3])


@pytest.mark.tvm
@pytest.mark.parametrize("cpu", _cpus())
def test_the_kernel_rounds_special_activations_as_numpy(cpu):
    """Each special value in its own row of A: the kernel's rows are numpy's on A rounded by
    weight_formats.round_bf16 (a NaN row all NaN, the largest float an inf times W)."""
    from sandwich.compiler.gemm_dsl import build_gemm_dsl

    lanes = cpu.lanes_f32
    n, k = 6 * lanes, 256
    schedule = _schedule(lanes)
    func = build_gemm_dsl(schedule, n=n, k=k, cpu=cpu, threads=2)["main"]
    rng = np.random.default_rng(3)
    qw = quantize(rng.standard_normal((k, n), dtype=np.float32), "bf16")
    a = rng.standard_normal((len(SPECIAL), k), dtype=np.float32)
    a[np.arange(len(SPECIAL)), 2 * np.arange(len(SPECIAL)) + 1] = SPECIAL
    out = np.zeros((len(SPECIAL), n), np.float32)
    func(*gemm_args(a, pack_weight(qw, schedule.pack_n, "bf16"), out, schedule))
    with np.errstate(invalid="ignore", over="ignore"):
        ref = round_bf16(a).astype(np.float64) @ dequantize(qw).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(out[fin], ref[fin], rtol=1e-4, atol=1e-3)


@pytest.mark.tvm
def test_bf16_tile_is_vdpbf16ps_when_built_for_zen4():
    """Cross-compiled for znver4 (any host): TVM cannot type bf16 vectors, so the lowering calls
    a stand-in that compiler/llvm_splice.py rewrites into the intrinsic after TVM's passes."""
    import tvm

    from sandwich.compiler.build import parse_tvmscript
    from sandwich.compiler.llvm_splice import splice_module

    src = gemm_dsl_tvmscript(_schedule(LANES), n=6 * LANES, k=256, lanes=LANES, l2_bytes=1 << 20, isa="avx512",
                             bf16_dot=True)
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4",
                                "num-cores": 2})
    mod = splice_module(tvm.compile(parse_tvmscript(src), target=target))
    asm = mod.inspect_source("asm")
    assert asm.count("vdpbf16ps") >= 6 and "sandwich_dpbf16ps" not in asm


def test_splice_rewrites_every_stand_in_call_and_refuses_a_foreign_one():
    from sandwich.compiler.llvm_splice import splice_ir

    ir = ("declare <16 x float> @sandwich_dpbf16ps(<16 x float>, <16 x i32>, <16 x i32>) #1\n"
          "  %7 = tail call fast <16 x float> @sandwich_dpbf16ps(<16 x float> zeroinitializer, "
          "<16 x i32> %5, <16 x i32> <i32 1, i32 2>), !dbg !9\n  ret void\n")
    out, n = splice_ir(ir)
    assert n == 1 and "sandwich_dpbf16ps" not in out
    assert "%sandwich_bf0_1 = bitcast <16 x i32> <i32 1, i32 2> to <32 x bfloat>" in out
    assert ("%7 = tail call fast <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> "
            "zeroinitializer, <32 x bfloat> %sandwich_bf0_0, <32 x bfloat> %sandwich_bf0_1), "
            "!dbg !9") in out
    from sandwich.errors import BuildError

    with pytest.raises(BuildError, match="unexpected sandwich_dpbf16ps call"):
        splice_ir("  %1 = call <16 x float> @sandwich_dpbf16ps(<16 x float> %0, <8 x i64> %2)\n")


def test_splice_rounds_pairs_with_vcvtne2ps2bf16():
    """bf16pair's stand-ins: two vectors' bf16s interleaved (x low, y high: the intrinsic
    takes the high source first, then a shuffle pairs lane j of each), and 32 consecutive
    floats' (their halves' bf16s side by side); one declaration for both."""
    from sandwich.compiler.llvm_splice import splice_ir

    ir = ("declare <16 x i32> @sandwich_bf16pair(<16 x float>, <16 x float>) #1\n"
          "declare <16 x i32> @sandwich_bf16x32(<32 x float>) #1\n"
          "  %3 = tail call <16 x i32> @sandwich_bf16pair(<16 x float> %x, <16 x float> %y), !dbg !4\n"
          "  %4 = call <16 x i32> @sandwich_bf16x32(<32 x float> %w)\n")
    out, n = splice_ir(ir)
    assert n == 2 and "sandwich_bf16pair" not in out and "sandwich_bf16x32" not in out
    assert out.count("declare <32 x bfloat> @llvm.x86.avx512bf16.cvtne2ps2bf16.512(") == 1
    assert ("%sandwich_bf0_c = call <32 x bfloat> @llvm.x86.avx512bf16.cvtne2ps2bf16.512("
            "<16 x float> %y, <16 x float> %x)") in out
    assert ("%sandwich_bf0_s = shufflevector <32 x bfloat> %sandwich_bf0_c, <32 x bfloat> poison, "
            "<32 x i32> <i32 0, i32 16, i32 1, i32 17, i32 2, i32 18,") in out
    assert "%3 = bitcast <32 x bfloat> %sandwich_bf0_s to <16 x i32>" in out
    assert ("%sandwich_bf1_hi = shufflevector <32 x float> %w, <32 x float> poison, "
            "<16 x i32> <i32 16, i32 17,") in out
    assert ("%sandwich_bf1_c = call <32 x bfloat> @llvm.x86.avx512bf16.cvtne2ps2bf16.512("
            "<16 x float> %sandwich_bf1_hi, <16 x float> %sandwich_bf1_lo)") in out
    assert "%4 = bitcast <32 x bfloat> %sandwich_bf1_c to <16 x i32>" in out


@pytest.mark.tvm
@pytest.mark.parametrize("config", [None, {"heads": 2, "kv": 1}])
def test_a_tiny_model_with_bf16_weights_gives_transformers_logits(tmp_path, cache, config):
    """--weights bf16 end to end: logits against HF transformers on the same weights rounded
    to bf16 (ours also rounds each GEMM's activations: hence 2e-2, not 1e-4); fp32 for scale.
    Heads of 32 values (the second model, same GEMM shapes): prefill attention in bf16 on AMX
    tiles where the CPU has them."""
    from conftest import tune_model
    from gguf_tiny import write_tiny_gguf

    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    path = write_tiny_gguf(tmp_path / "tiny.gguf", types={"token_embd.weight": "F32"},
                           config=config)[0]
    tune_model(path, cache, weights="bf16")
    model = load_model(path, cache, threads=2, weights="bf16")
    hf = transformers.LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                       dtype=torch.float32).eval()
    with torch.no_grad():
        for lin in (m for m in hf.modules() if isinstance(m, torch.nn.Linear)):
            lin.weight.copy_(lin.weight.to(torch.bfloat16).to(torch.float32))
        prompt = [5, 9, 200, 17, 33, 100, 250, 7]
        ref = hf(torch.tensor([prompt])).logits[0, -1].numpy()
    ex = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="dsl", threads=2)
    assert ex.ops._prefill.amx == (config is not None and model.gemms.o.cache.cpu.amx)
    _, logits = ex.start(prompt)
    err = np.abs(logits - ref).max() / np.abs(ref).max()
    assert err <= 2e-2, err
