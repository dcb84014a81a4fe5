"""Int weight formats in the GEMM family (issue 26, item 2): int8 and int4 values dequantized
in registers as they stream, checked against numpy on the dequantized weights; tuned and
stored like fp32; a GGUF's Q8_0 / Q4_0 / Q4_1 blocks run as stored, against HF transformers."""

import dataclasses
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import tune_model
from gguf_tiny import write_tiny_gguf

from sandwich.compiler.gemm_runner import pack_weight
from sandwich.errors import ConfigError, ShapeError
from sandwich.models import load_model_config
from sandwich.payload import make_payload
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization
from sandwich.weight_formats import FORMATS, dequantize, gemm_dtype, quantize

INT_FORMATS = [f.name for f in FORMATS if f.quantized]


def _cpu():
    from sandwich.compiler.target import detect_cpu

    return detect_cpu()


@pytest.mark.tvm
@pytest.mark.parametrize("fmt, vnni", [*((f, True) for f in INT_FORMATS),
                                       ("int8-g32", False), ("int4-g32-asym", False),
                                       ("int4-k", False), ("int5-k", False), ("int6-k", False)])
def test_every_int_format_matches_numpy_at_20_random_m(fmt, vnni):
    """One family per format: a 3-row tile (so the 2 and 1-row tail tiles run too), split-K
    over two threads for half the formats, a K panel that is not a multiple of the group, two
    of the K-quants' super-groups of 256. `vnni` False builds for the host without AVX512-VNNI:
    dot8 as two pmaddwd (int8), or pmaddubsw (the 4- to 6-bit formats)."""
    import dataclasses

    from sandwich.compiler.gemm_dsl import build_gemm_dsl
    from sandwich.tuner.tvm_measure import check_against_numpy

    cpu = _cpu()
    if not vnni:
        cpu = dataclasses.replace(cpu, mattr=tuple(a for a in cpu.mattr if a != "+avx512vnni"))
    lanes = cpu.lanes_f32
    n, k = 6 * lanes, 512
    i = INT_FORMATS.index(fmt)
    t_k = 2 if i % 2 else 1
    schedule = KernelSchedule(MicroKernel(3, 2 * lanes), ComputeSlice(6, 4 * lanes, 48),
                              Polymerization(1, 2 // t_k, t_k), 2 * lanes, dtype=gemm_dtype(fmt))
    func = build_gemm_dsl(schedule, n=n, k=k, cpu=cpu, threads=2)["main"]
    rng = np.random.default_rng(i)
    qw = quantize(rng.standard_normal((k, n), dtype=np.float32), fmt)
    packed = pack_weight(qw, schedule.pack_n, schedule.dtype)
    w = dequantize(qw)
    for m in sorted(rng.choice(np.arange(1, 200), size=20, replace=False)):
        a = rng.standard_normal((int(m), k), dtype=np.float32)
        assert check_against_numpy(func, schedule, a, packed, w) == "", (fmt, m)


def test_packing_keeps_int4_nibbles_and_refuses_another_format():
    w = np.random.default_rng(0).standard_normal((64, 32), dtype=np.float32)
    qw = quantize(w, "int4-g32")
    values, scales = pack_weight(qw, 16, "int4-g32", quads=False)
    assert values.shape == (2, 32, 16) and values.dtype == np.uint8
    assert scales.shape == (2, 2, 16) and scales.dtype == np.float16
    # byte kb of column c: value 2 kb (low nibble) and 2 kb + 1 (high), each 0..15
    nib = np.stack([values & 15, values >> 4], axis=2).reshape(2, 64, 16)
    d = scales.astype(np.float32).repeat(32, axis=1)
    back = ((nib.astype(np.float32) - 8) * d).transpose(1, 0, 2).reshape(64, 32)
    np.testing.assert_array_equal(back, dequantize(qw))
    # with 8-bit activations (Q4Q): element 4 b + u of column c holds, in byte q, value
    # 32 b + u + 8 q in its low nibble and 32 b + u + 4 + 8 q in its high one
    quads, _ = pack_weight(qw, 16, "int4-g32")
    assert quads.shape == (2, 8, 16) and quads.dtype == np.int32
    q4 = quads.view(np.uint8).reshape(2, 8, 16, 4)
    vals = nib.transpose(0, 2, 1)  # [panel, column, k]
    for b, u, q in itertools.product(range(2), range(4), range(4)):
        np.testing.assert_array_equal(q4[:, 4 * b + u, :, q] & 15, vals[:, :, 32 * b + u + 8 * q])
        np.testing.assert_array_equal(q4[:, 4 * b + u, :, q] >> 4, vals[:, :, 32 * b + u + 4 + 8 * q])
    with pytest.raises(ShapeError, match="weights are int4-g32, the kernel reads int8-g32"):
        pack_weight(qw, 16, "int8-g32")


def test_payload_carries_the_format_and_refuses_a_k_it_cannot_group(tmp_path):
    from sandwich.models import read_raw_config

    raw, _ = read_raw_config("llama-160m")  # SmolLM2's widths: K = 576 is 18 groups of 32,
    shape = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,  # 9 of 64,
                 num_key_value_heads=3)  # and no whole number of 128s
    (tmp_path / "config.json").write_text(json.dumps(raw | shape))
    cfg = load_model_config(tmp_path / "config.json")
    ops = make_payload(cfg, seq_max=8, weights="int4-g64").ops
    assert {op.dtype for op in ops} == {"int4-g64"}
    assert {op.dtype for op in make_payload(cfg, seq_max=8, weights="fp32").ops} == {"float32"}
    with pytest.raises(ConfigError, match="int4-g128 needs K a multiple of 128"):
        make_payload(cfg, seq_max=8, weights="int4-g128")


@pytest.mark.tvm
def test_cli_tunes_and_verifies_int8_kernels_and_names_bad_formats(tmp_path):
    cache = str(tmp_path / "cache")
    base = [sys.executable, "-m", "sandwich.cli"]
    bad = subprocess.run(base + ["tune", "--weights", "int3", "--cache-dir", cache],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown weight format 'int3'" in bad.stderr
    tune = subprocess.run(base + ["tune", "--model", "llama-160m", "--weights", "int8-g32",
                                  "--ops", "o", "--seq-max", "4", "--budget", "tiny",
                                  "--no-progress", "--cache-dir", cache],
                          capture_output=True, text=True, timeout=600)
    assert tune.returncode == 0, tune.stderr
    assert "weights=int8-g32" in tune.stdout
    ls = subprocess.run(base + ["cache", "ls", "--cache-dir", cache], capture_output=True,
                        text=True, timeout=60)
    assert "gemm_int8-g32_mk" in ls.stdout and "gemm_float32" not in ls.stdout
    verify = subprocess.run(base + ["cache", "verify", "--cache-dir", cache], capture_output=True,
                            text=True, timeout=300)
    assert verify.returncode == 0 and "verified" in verify.stdout, verify.stdout + verify.stderr


@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory):
    """The tiny GGUF with every projection and the (tied) embedding in Q8_0."""
    from gguf_tiny import TYPES

    path = tmp_path_factory.mktemp("q8") / "tiny-q8.gguf"
    return write_tiny_gguf(path, types=dict.fromkeys(TYPES, "Q8_0"))[0]


@pytest.mark.tvm
def test_gguf_q8_0_blocks_run_as_stored_and_give_transformers_logits(q8_gguf, cache):
    """--weights int8-g32 on a Q8_0 file packs the file's own blocks (no re-quantizing),
    and the logits match HF transformers on the same (dequantized) weights with each linear
    layer's input rounded to 8 bits per 32 values as our kernels round it (without that
    rounding, 1e-2 apart: it is the only difference)."""
    from sandwich.gguf_blocks import from_gguf_blocks
    from sandwich.runtime.loader import load_model

    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    tune_model(q8_gguf, cache, weights="int8-g32")
    model = load_model(q8_gguf, cache, threads=2, weights="int8-g32")
    raw = model.layers[0]  # o: one tensor, no RoPE permutation: its blocks as the file has them
    from sandwich.runtime.gguf_file import GGUFCheckpoint

    t = GGUFCheckpoint(q8_gguf).get("model.layers.0.self_attn.o_proj.weight")
    stored = pack_weight(from_gguf_blocks(t.raw.data, "Q8_0", t.shape), model.gemms.o.pack_n,
                         "int8-g32")
    for got, want in zip(raw.o.data, stored, strict=True):
        np.testing.assert_array_equal(got, want)
    assert _error_against_transformers(q8_gguf, model) <= 1e-4


# an HF linear layer's name -> the GEMM of ours that runs it
GEMM_OF = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o", "gate_proj": "gate_up",
           "up_proj": "gate_up", "down_proj": "down", "lm_head": "lm_head"}


def _error_against_transformers(gguf, model) -> float:
    """Max relative error of our last-token logits against HF transformers reading the same
    GGUF, each linear layer's operands rounded as the kernel that runs it at the prompt's M
    rounds them: the family's input to 8 bits per 32 values; on AMX tiles (an AMX CPU's tune
    may pick them even at M = 8) input and weights to bf16 (tvm_measure.kernel_rows,
    kernel_weights)."""
    import torch
    import transformers

    from sandwich.runtime.executor import Executor
    from sandwich.tuner.tvm_measure import kernel_rows, kernel_weights

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           dtype=torch.float32).eval()
    ex = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="dsl", threads=2)
    prompt = [5, 9, 200, 17, 33, 100, 250, 7]

    def rounding(rows):
        def rounded(module, args):
            x = args[0].numpy()
            return (torch.from_numpy(rows(x.reshape(-1, x.shape[-1])).astype(
                np.float32).reshape(x.shape)),)
        return rounded

    for name, lin in hf.named_modules():
        if isinstance(lin, torch.nn.Linear):
            gemm = getattr(model.gemms, GEMM_OF[name.rsplit(".", 1)[-1]])
            s = gemm.schedule_for(1 if name.endswith("lm_head") else len(prompt))
            rows = kernel_rows(gemm.dtype, gemm.k, s.op)
            if rows is not None:
                lin.register_forward_pre_hook(rounding(rows))
            # a Parameter of its own: a tied lm_head's rounding must not reach the embedding
            w = kernel_weights(lin.weight.detach().numpy().T, gemm.dtype, s.op).T
            lin.weight = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(w)))
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, -1].numpy()
    _, logits = ex.start(prompt)
    return float(np.abs(logits - ref).max() / np.abs(ref).max())


@pytest.mark.tvm
@pytest.mark.parametrize("arch, ggml", [("llama", "Q4_K"), ("qwen2", "Q5_K")])
def test_a_k_quant_file_runs_as_stored_by_default_with_its_blocks_and_transformers_logits(tmp_path, cache, arch, ggml):
    """Issue 26: a Q4_K (Q5_K) file's blocks run as stored (int4-k: the nibbles, 6-bit factors
    and fp16 d, dmin of each super-block; int5-k: those and a fifth bit a value), the default
    for it, and its Q6_K (tied) head and second layer's down and v matrices as int6-k (6-bit
    values, a signed factor per 16, fp16 d), as llama.cpp's Q4_K_M and Q5_K_M keep some
    layers' ffn_down and attn_v: the executor runs each layer's own kernels, v there apart
    from q and k; the logits match transformers on the same file as the Q8_0 case does;
    Qwen2's q, k and v biases added to their own parts."""
    from gguf_tiny import TYPES

    from sandwich.gguf_blocks import from_gguf_blocks
    from sandwich.runtime.gguf_file import GGUFCheckpoint
    from sandwich.runtime.loader import load_model
    from sandwich.weight_choice import auto_weights

    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    six = ["token_embd.weight", "blk.1.ffn_down.weight", "blk.1.attn_v.weight"]
    types = dict.fromkeys(TYPES, ggml) | dict.fromkeys(six, "Q6_K")
    path = write_tiny_gguf(tmp_path / "k.gguf", types=types, arch=arch,
                           config=dict(hidden=256, ffn=512, layers=2))[0]
    base = "int4-k" if ggml == "Q4_K" else "int5-k"
    spec = f"{base},down@1=int6-k,lm_head=int6-k,v@1=int6-k"
    assert auto_weights(str(path)).weights == spec
    tune_model(path, cache, weights=spec, seq_max=1)
    model = load_model(path, cache, threads=2, weights=spec)
    g, (one, two) = model.gemms, model.layers
    assert (g.at(0).down.dtype, g.at(1).down.dtype, g.at(1).o is g.o) == (base, "int6-k", True)
    # layer 1 runs its Q6_K v apart, beside q and k fused in the base format
    assert (one.v, g.at(0).qk, g.at(1).qk.dtype, g.at(1).v.dtype) == (None, None, base, "int6-k")
    ckpt = GGUFCheckpoint(path)
    for (got, gemm), name, stored_as in [((one.o, g.o), "model.layers.0.self_attn.o_proj.weight", ggml),
                                         ((two.down, g.at(1).down), "model.layers.1.mlp.down_proj.weight", "Q6_K"),
                                         ((two.v, g.at(1).v), "model.layers.1.self_attn.v_proj.weight", "Q6_K"),
                                         ((model.lm_head, g.lm_head), "model.embed_tokens.weight", "Q6_K")]:
        t = ckpt.get(name)
        stored = gemm.pack(from_gguf_blocks(t.raw.data, stored_as, t.shape))
        for a, b in zip(got.data, stored.data, strict=True):
            np.testing.assert_array_equal(a, b)
    assert _error_against_transformers(path, model) <= 1e-4


@pytest.mark.tvm
def test_a_spec_packs_the_lm_head_in_its_own_format_beside_the_layers(q8_gguf, cache):
    """`int8-g32,lm_head=int4-g32-asym` on a Q8_0 file: the layers from the file's blocks as
    the all-int8 model has them, the (tied) lm_head re-quantized to int4-g32-asym; the
    executor runs both kernels' formats in one model (one more shape to tune: the lm_head's)."""
    from sandwich.gguf_blocks import from_gguf_blocks
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.gguf_file import GGUFCheckpoint
    from sandwich.runtime.loader import load_model

    spec = "int8-g32,lm_head=int4-g32-asym"
    models = {}
    for w in ("int8-g32", spec):
        tune_model(q8_gguf, cache, weights=w)
        models[w] = load_model(q8_gguf, cache, threads=2, weights=w)
    mixed, int8 = models[spec], models["int8-g32"]
    assert (mixed.gemms.lm_head.dtype, mixed.gemms.qkv.dtype) == ("int4-g32-asym", "int8-g32")
    for op in ("qkv", "o", "gate_up", "down"):
        for a, b in zip(getattr(mixed.layers[1], op).data, getattr(int8.layers[1], op).data, strict=True):
            np.testing.assert_array_equal(a, b)
    t = GGUFCheckpoint(q8_gguf).get("model.embed_tokens.weight")
    head = quantize(dequantize(from_gguf_blocks(t.raw.data, t.dtype, t.shape)), "int4-g32-asym")
    for a, b in zip(mixed.lm_head.data, mixed.gemms.lm_head.pack(head).data, strict=True):
        np.testing.assert_array_equal(a, b)
    prompt = [5, 9, 200, 17, 33, 100, 250, 7]
    logits = {w: Executor(m, max_batch=1, max_seq=32, max_tokens=16, ops="dsl", threads=2).start(prompt)[1]
              for w, m in models.items()}
    assert np.isfinite(logits[spec]).all()
    assert not np.array_equal(logits[spec], logits["int8-g32"])  # another lm_head ran


@pytest.mark.tvm
def test_a_q8_0_file_runs_as_int8_g32_by_default_and_says_so(q8_gguf, cache, capsys):
    """`--weights auto` (the default) on a Q8_0 file: the file's int8-g32, the same tokens as
    naming it, one stderr line saying which tensors load as stored; fp32 when named."""
    import json

    from sandwich.cli import main

    tune_model(q8_gguf, cache, weights="int8-g32")
    base = ["generate", "--model", str(q8_gguf), "--prompt-ids", "5,9,200,17", "--max-new-tokens",
            "6", "--cache-dir", str(cache.dir), "--no-tune", "--json", "--threads", "2"]
    runs = {}
    for flags in ([], ["--weights", "int8-g32"]):
        assert main(base + flags) == 0
        out, err = capsys.readouterr()
        runs[tuple(flags)] = json.loads(out)["ids"]
        said = [line for line in err.splitlines() if "weights" in line]
        assert said == ([] if flags else ["sandwichc: --weights auto runs this file in "
                                          "int8-g32: 14 Q8_0 tensors as stored; lm_head int8-g32: "
                                          "Q8_0 as stored (name a format with --weights to "
                                          "choose another)"]), err
    assert runs[()] == runs[("--weights", "int8-g32")]


@pytest.mark.parametrize("argv, match", [
    (["--weights", "int3"], "unknown weight format 'int3'"),
    (["--m", "0"], "--m values must be >= 1"),
    (["--m", "1,x"], "--m must be comma-separated integers"),
    (["--passes", "0"], "--passes must be >= 1"),
])
def test_bench_formats_bad_input_is_one_line(capsys, tmp_path, argv, match):
    from sandwich.cli import main

    code = main(["bench", "formats", "--cache-dir", str(tmp_path / "c"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("sandwichc: error:"), err
    assert match in err[0], err
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.so"))


@pytest.mark.tvm
def test_bench_formats_checks_int_kernels_on_the_activations_they_multiply(tmp_path, cache):
    """The int8-g32 rows are checked against numpy on the activations rounded to 8 bits as the
    kernel rounds them (against A itself, 1e-4 of sum |a| |w| is out of 8 bits' reach), and
    each row shows its Roof-Surface bound. (The shared cache: the tiny GGUF's shapes are
    tuned by other tests of this file.)"""
    from sandwich.cli import main

    path = write_tiny_gguf(tmp_path / "tiny.gguf", types={"token_embd.weight": "F32"})[0]
    out = tmp_path / "formats.json"
    code = main(["bench", "formats", "--model", str(path), "--weights", "int8-g32", "--m", "16",
                 "--seq-max", "16", "--budget", "tiny", "--no-progress", "--threads", "2",
                 "--passes", "2",
                 "--cache-dir", str(cache.dir), "--json", str(out),
                 "--md", str(tmp_path / "formats.md")])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["weights"] for r in rows} == {"fp32", "int8-g32"}
    assert all(r["gflops"] > 0 for r in rows)
    # each row against its Roof-Surface bound: a tiny model's GEMMs are far below it
    assert all(r["bound_by"] in ("MEM", "VEC", "MTX") and 0 < r["pct_bound"] < 200 for r in rows)
    # two passes: the row is one of them, inside their range
    assert all(lo <= r["pct_bound"] <= hi for r in rows for lo, hi in [r["pct_bound_range"]])
    md = (tmp_path / "formats.md").read_text()
    assert "| bound GFLOPS | bound by | % of bound | range |" in md
    assert "rows the model calls MEM-bound are within 15% of their bound" in md



def test_bench_formats_reads_large_weights_from_dram_at_every_m(monkeypatch):
    """As the tuner times them (streaming.from_dram) and as a model reads them, weights of 1/8
    of the LLC or more are timed over copies beyond the LLC at prefill's M too; only decode
    rows are also taken against the streaming read, and only rows from a cache against the
    read of a buffer their weights' size (that cache's bandwidth: their Roof-Surface MBW)."""
    from types import SimpleNamespace

    from sandwich.bench import formats

    seen = []

    def fake_measure(name, run, a, ref, handles, **kw):
        seen.append(len(handles))
        return SimpleNamespace(timing=SimpleNamespace(median_s=1e-3), gflops=1.0)

    gemm = SimpleNamespace(pack=lambda w: np.ascontiguousarray(w),
                           schedule_for=lambda m: SimpleNamespace(key=lambda: "s", op="gemm"))
    cache = SimpleNamespace(gemm=lambda **kw: gemm)
    monkeypatch.setattr(formats, "measure_runner", fake_measure)
    monkeypatch.setattr(formats, "bound_runner", lambda g, out: None)
    monkeypatch.setattr(formats, "moment_read", lambda limits: 30.0)
    sizes = []  # the buffers read for the cache rows' MBW: their weights' size
    monkeypatch.setattr(formats, "read_bandwidth_gbs",
                        lambda threads, size_bytes, repeat: sizes.append(size_bytes) or 300.0)
    op = SimpleNamespace(n=64, k=64, dtype="float32")  # 16 KiB of weights

    def row(m, llc):
        return formats._time_row(cache, SimpleNamespace(llc_bytes=llc, threads=2), "m", "o", op,
                                 "fp32", m, 2)

    big = row(512, 64 << 10)  # the weights are 1/4 of this LLC
    assert big.rotated and seen[-1] > 1 and big.stored_gbs is None and big.pct_read is None
    assert big.cache_read_gbs is None and not sizes
    hot = row(512, 1 << 20)  # 1/64 of it
    assert not hot.rotated and seen[-1] == 1 and hot.cache_read_gbs == 300.0 and sizes == [16384]
    decode = row(1, 1 << 20)
    assert decode.rotated and seen[-1] > 1 and decode.pct_read == pytest.approx(
        100 * 16384 / 1e-3 / 1e9 / 30.0)
    assert decode.cache_read_gbs is None and sizes == [16384]


def test_bench_formats_pairs_each_format_with_fp32_in_the_same_pass():
    """The machine drifts (here every timing is 10% slower than the one before): `x fp32`
    is the ratio within each pass, in interleaved order (fp32 int8 int4, int4 int8 fp32),
    so a format twice as fast as fp32 reads about 2 on every pass, where taking fp32's
    passes first and the format's after would read it at 1.4."""
    from sandwich.bench import formats

    calls, speed = [], {"fp32": 1.0, "int8-g32": 2.0, "int4-g32": 4.0}

    def time_row(fmt, op):
        calls.append(fmt)
        us = 100.0 / speed[fmt] * 1.1 ** len(calls)
        return formats.FormatRow("m", "qkv", 64, 64, fmt, 8, us, 1.0, 1.0, "s",
                                 pct_bound=100.0 - len(calls))

    rows = formats._paired_rows({f: None for f in speed}, 4, time_row)
    assert calls == ["fp32", "int8-g32", "int4-g32", "int4-g32", "int8-g32", "fp32"] * 2
    x = {r.weights: r.speedup_vs_fp32 for r in rows}
    assert x["fp32"] == 1.0
    assert x["int8-g32"] == pytest.approx(2.0, rel=0.1) and x["int4-g32"] == pytest.approx(4.0, rel=0.25)
    assert all(r.pct_bound_range is not None for r in rows)


@pytest.mark.tvm
def test_int8_tile_is_vpdpbusd_where_avx512_vnni_exists():
    """Cross-compiled for znver4 (any host): dot8 is one vpdpbusd per weight vector and row
    where the target has AVX512-VNNI; without it, two pmaddwd."""
    import tvm

    from sandwich.compiler.build import parse_tvmscript
    from sandwich.compiler.gemm_dsl import gemm_dsl_tvmscript

    s = KernelSchedule(MicroKernel(2, 32), ComputeSlice(4, 64, 64), Polymerization(1, 2, 1), 32,
                       dtype="int8-g32")
    plain = gemm_dsl_tvmscript(s, n=128, k=256, lanes=16, l2_bytes=1 << 20, isa="avx512")
    assert "llvm.x86.avx512.pmaddw.d.512" in plain and "vpdpbusd" not in plain
    src = gemm_dsl_tvmscript(s, n=128, k=256, lanes=16, l2_bytes=1 << 20, isa="avx512",
                             int8_dot=True)
    assert "llvm.x86.avx512.vpdpbusd.512" in src and "pmaddw" not in src
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4",
                                "num-cores": 2})
    asm = tvm.compile(parse_tvmscript(src), target=target).mod.inspect_source("asm")
    assert asm.count("vpdpbusd") >= 2 * 2 * 8  # 2 rows x 2 vectors x 8 elements of a block


def test_bench_formats_keeps_the_median_pass_and_checks_the_model_on_mem_bound_rows():
    from sandwich.bench import formats

    def row(pct, by="MEM"):
        return formats.FormatRow("m", "o", 64, 64, "int8-g32", 1, 1.0, 1.0, 1.0, "s",
                                 bound_by=by, pct_bound=pct)

    best = formats._median_pass([row(90.0), row(60.0), row(120.0), row(100.0)])
    assert best.pct_bound == 90.0 and best.pct_bound_range == (60.0, 120.0)
    assert formats._median_pass([row(70.0)]).pct_bound_range is None
    res = formats.FormatsResult("c", "cpu", 2, 30.0, rows=[
        row(84.0), row(85.0), row(115.0), row(116.0), row(50.0, "MTX")])
    assert res.model_check() == (2, 4)  # 85% and 115% are in, 84% and 116% out, MTX not counted


def test_bench_formats_bounds_a_cache_row_by_the_read_of_its_cache():
    """A row whose weights stay in a cache streams them at that cache's bandwidth: its MEM
    term takes the read measured on a buffer of their size, not DRAM's (fp32 at M = 8 on 30
    GB/s: MEM-bound at 120 GFLOPS; from a cache read at 300 GB/s: MTX at the FMA rate)."""
    from types import SimpleNamespace

    from sandwich.bench import formats
    from sandwich.tuner import roofsurface as rs

    host = rs.HostRates(threads=2, lanes=16, mbw=30e9, fma_vector_ops=460e9 / 32, vos={})
    cpu = SimpleNamespace(lanes_f32=16, bf16_dot=True)

    def row(**kw):
        r = formats.FormatRow("m", "o", 768, 768, "fp32", 8, 1.0, 100.0, 1.0,
                              "gemm_float32_mk8x64_p1x2x1_n64_s8x64x256", **kw)
        formats._roof(r, host, cpu)
        return r

    dram = row(rotated=True)
    assert (dram.bound_by, dram.bound_gflops) == ("MEM", pytest.approx(30 / 64 * 2 * 16 * 8))
    cached = row(cache_read_gbs=300.0)
    assert (cached.bound_by, cached.bound_gflops) == ("MTX", pytest.approx(460.0))


def test_bench_formats_bounds_an_amx_int_row_by_its_schedules_chunks():
    """An int8-g32 row the AMX kernel ran gets the Roof-Surface bound of its schedule: AMX's
    tile rate as MTX, and the rounding to bf16 once per chunk of b_m rows of each row thread
    as VEC (32-row chunks on two threads at M = 2048: VEC-bound); without an AMX rate, none."""
    from types import SimpleNamespace

    from sandwich.bench import formats
    from sandwich.tuner import roofsurface as rs

    host = rs.HostRates(threads=2, lanes=16, mbw=30e9, fma_vector_ops=460e9 / 32, vos={},
                        amx_flops=6000e9)
    cpu = SimpleNamespace(lanes_f32=16, bf16_dot=True)

    def row(schedule):
        return formats.FormatRow("m", "o", 768, 768, "int8-g32", 2048, 1.0, 1500.0, 1.0, schedule)

    small = row("amx_int8-g32_mk32x32_p2x1x1_n64_s32x64x768")
    formats._roof(small, host, cpu)
    ops = rs.AMX_ROUND_OPS[8]
    assert small.bound_by == "VEC"  # the rounding's time adds to the tiles'
    rounding = 460 / 32 * 2 * 16 * 2048 / (64 * ops)
    assert small.bound_gflops == pytest.approx(1 / (1 / rounding + 1 / 6000))
    big = row("amx_int8-g32_mk32x32_p1x2x1_n64_s256x64x768")
    formats._roof(big, host, cpu)
    bound = 1 / (1 / 6000 + 8 * ops / (460 / 32 * 2 * 16 * 2048))  # 2048 / 256 roundings
    assert (big.bound_by, big.bound_gflops, big.pct_bound) == (
        "MTX", pytest.approx(bound), pytest.approx(100 * 1500 / bound))
    none = row("amx_int8-g32_mk32x32_p1x2x1_n64_s256x64x768")
    formats._roof(none, dataclasses.replace(host, amx_flops=None), cpu)
    assert none.bound_by is None
