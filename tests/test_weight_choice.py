"""A GGUF file's own weight format: Q4_K super-blocks load as int4-k or int4-g32-asym groups,
Q5_K ones as int5-k and Q6_K ones as int6-k without a round trip through fp32, and `--weights auto` (every
command's default) runs a file in the format most of its GEMM weights are stored in."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize as gg_dequantize
from gguf_tiny import q4_k_blocks, q5_k_blocks, q6_k_blocks, write_tiny_gguf
from test_weight_formats import one_line

from sandwich.errors import ConfigError, ShapeError
from sandwich.gguf_blocks import from_gguf_blocks
from sandwich.weight_choice import auto_weights
from sandwich.weight_formats import dequantize, parse_format, parse_weights, quantize, take_rows

ASYM = parse_format("int4-g32-asym")


def random_q4_k(rng, rows: int, k: int, d: float | None = None, block: int = 144) -> np.ndarray:
    """Random Q4_K bytes: every scale, min and nibble bit pattern; d and dmin random fp16
    in (0, 0.01), or both `d` (a power of two: every product d * sc is exact in fp16).
    `block` 176: Q5_K's, whose head is Q4_K's, with every fifth bit pattern too."""
    b = rng.integers(0, 256, (rows, k // 256, block), dtype=np.uint8)
    heads = (rng.random((rows, k // 256, 2)) * 0.01) if d is None else np.full((rows, k // 256, 2), d)
    b[..., 0:4] = heads.astype(np.float16).view(np.uint8).reshape(rows, k // 256, 4)
    return b.reshape(rows, -1)


def random_q6_k(rng, rows: int, k: int) -> np.ndarray:
    """Random Q6_K bytes: every ql, qh and int8 factor bit pattern; d random finite fp16 of
    either sign, up to 0.01."""
    b = rng.integers(0, 256, (rows, k // 256, 210), dtype=np.uint8)
    d = (rng.random((rows, k // 256, 1)) - 0.5) * 0.02
    b[..., 208:210] = d.astype(np.float16).view(np.uint8)
    return b.reshape(rows, -1)


def test_q6_k_blocks_that_cannot_load_are_one_line_errors():
    raw = random_q6_k(np.random.default_rng(1), 4, 256)
    cases = {"K = 128 is not a multiple of 256": (raw, T.Q6_K, (8, 128)),
             "must hold 840 bytes, got 420": (raw[:2], T.Q6_K, (4, 256)),
             "must hold 840 bytes, got 576": (random_q4_k(np.random.default_rng(1), 4, 256),
                                             T.Q6_K, (4, 256))}  # Q4_K's bytes called Q6_K
    for what, args in cases.items():
        with pytest.raises(ConfigError) as e:
            from_gguf_blocks(*args)
        assert what in one_line(e)


@pytest.mark.parametrize("ggml, fmt, per_256, make", [
    ("Q4_K", "int4-k", 148, lambda rng: random_q4_k(rng, 8, 768)),  # Q4_K's 144, factors a byte each
    ("Q5_K", "int5-k", 180, lambda rng: random_q4_k(rng, 8, 768, block=176)),  # Q5_K's 176, likewise
    ("Q6_K", "int6-k", 210, lambda rng: random_q6_k(rng, 8, 768))])  # as Q6_K
def test_k_quant_blocks_load_in_their_format_every_number_as_stored(ggml, fmt, per_256, make):
    for seed in range(3):  # any d (dmin), factors and values: ggml's float products exactly
        raw = make(np.random.default_rng(seed))
        qw = from_gguf_blocks(raw, ggml.lower(), (8, 768))
        assert qw.fmt == parse_format(fmt) and qw.shape == (768, 8)
        assert np.array_equal(dequantize(qw), gg_dequantize(raw, T[ggml]).T)  # bit for bit
        assert qw.nbytes == 8 * 768 * per_256 // 256
        half = take_rows(qw, slice(256, 768))  # a tensor-parallel share: whole super-groups
        assert np.array_equal(dequantize(half), dequantize(qw)[256:])
        with pytest.raises(ShapeError, match="whole groups of 256"):
            take_rows(qw, slice(0, 384))
    block = raw.shape[1] // 3  # one super-block's bytes a row
    cases = {f"must hold {8 * 3 * block} bytes, got {8 * block}": (raw[:, :block], T[ggml], (8, 768))}
    cases[f"does not load into int8-g32 as stored (it loads into {fmt}"] = (raw, T[ggml], (8, 768), "int8-g32")
    for what, args in cases.items():
        with pytest.raises(ConfigError) as e:
            from_gguf_blocks(*args)
        assert what in one_line(e)


def test_q4_k_blocks_load_as_int4_g32_asym_groups_as_ggml_dequantizes_them():
    rng = np.random.default_rng(0)
    exact = random_q4_k(rng, 16, 512, d=2.0**-10)
    qw = from_gguf_blocks(exact, T.Q4_K, (16, 512), "int4-g32-asym")
    assert qw.fmt == ASYM and qw.shape == (512, 16)
    assert np.array_equal(dequantize(qw), gg_dequantize(exact, T.Q4_K).T)  # bit for bit
    assert qw.nbytes == 16 * 512 * 20 // 32  # Q4_1's 5 bits a value against Q4_K's 4.5
    for seed in range(3):  # each group's scale and min rounded once to fp16
        raw = random_q4_k(np.random.default_rng(seed), 8, 768)
        want = gg_dequantize(raw, T.Q4_K).T
        got = dequantize(from_gguf_blocks(raw, "q4_k", (8, 768), "int4-asym"))
        assert np.abs(got - want).max() <= 2.0**-10 * np.abs(want).max()
    half = take_rows(qw, slice(256, 512))  # a tensor-parallel share of K: whole groups
    assert np.array_equal(dequantize(half), dequantize(qw)[256:])
    with pytest.raises(ConfigError) as e:  # a format its blocks do not hold
        from_gguf_blocks(exact, T.Q4_K, (16, 512), "int4-g32")
    assert "does not load into int4-g32 as stored" in one_line(e)


def test_q4_k_blocks_that_cannot_load_are_one_line_errors():
    rng = np.random.default_rng(1)
    raw = random_q4_k(rng, 4, 256)
    huge = raw.copy().reshape(4, 1, 144)
    huge[..., 0:2] = np.array([60000], np.float16).view(np.uint8)
    cases = {"K = 128 is not a multiple of 256": (raw, T.Q4_K, (8, 128)),
             "must hold 576 bytes, got 288": (raw[:2], T.Q4_K, (4, 256)),
             "do not fit float16": (huge.reshape(4, -1), T.Q4_K, (4, 256), "int4-g32-asym")}
    for what, args in cases.items():
        with pytest.raises(ConfigError) as e:
            from_gguf_blocks(*args)
        assert what in one_line(e)


def test_the_test_writer_makes_blocks_ggml_reads():
    w = np.random.default_rng(2).standard_normal((6, 512)).astype(np.float32)
    back = gg_dequantize(q4_k_blocks(w), T.Q4_K)
    step = (w.reshape(6, 2, 8, 32).max(-1) - np.minimum(w.reshape(6, 2, 8, 32).min(-1), 0)) / 15
    assert np.abs(back - w).max() <= step.max()  # a layout mix-up is off by whole values
    blocks = q6_k_blocks(w)  # int6-k's quantizer's arrays, laid out as block_q6_K
    qw = quantize(w.T, "int6-k")
    assert np.array_equal(gg_dequantize(blocks, T.Q6_K), dequantize(qw).T)
    stored = from_gguf_blocks(blocks, T.Q6_K, w.shape)  # the inverse of the writer
    for key, a in qw.arrays().items():
        assert np.array_equal(a, getattr(stored, key)), key
    blocks, qw = q5_k_blocks(w), quantize(w.T, "int5-k")  # likewise block_q5_K
    assert np.array_equal(gg_dequantize(blocks, T.Q5_K), dequantize(qw).T)
    stored = from_gguf_blocks(blocks, T.Q5_K, w.shape)
    for key, a in qw.arrays().items():
        assert np.array_equal(a, getattr(stored, key)), key


@pytest.fixture(scope="module")
def q4_k_file(tmp_path_factory):
    """A one-layer llama GGUF whose every matrix is Q4_K (widths of 256 and 512)."""
    from gguf_tiny import TYPES

    path = tmp_path_factory.mktemp("q4k") / "tiny-q4k.gguf"
    types = dict.fromkeys([*TYPES, "token_embd.weight"], "Q4_K")
    return write_tiny_gguf(path, types=types, config=dict(hidden=256, ffn=512, layers=1))[0]


def test_a_q4_k_file_loads_its_blocks_as_stored_rope_rows_put_back(q4_k_file):
    from sandwich.runtime.gguf_file import GGUFCheckpoint

    ck = GGUFCheckpoint(q4_k_file)
    matrices = [n for n in ck.keys() if len(ck.get(n).shape) == 2]
    assert len(matrices) == 8
    for name in matrices:
        t = ck.get(name)
        assert t.dtype == "Q4_K"
        assert t.blocks(parse_format("int4-g32")) is None  # Q4_0's format is another one
        want = t.to_f32().T  # the gguf package's dequantizer, q/k rows in HF's order
        assert np.array_equal(dequantize(t.blocks(parse_format("int4-k"))), want), name
        qw = t.blocks(ASYM)
        assert np.abs(dequantize(qw) - want).max() <= 2.0**-10 * np.abs(want).max(), name
    choice = auto_weights(str(q4_k_file))  # the embedding is tied: the lm_head's too
    assert choice.weights == "int4-k"
    assert choice.describe() == "int4-k: 7 Q4_K tensors as stored; lm_head int4-k: Q4_K as stored"
    # under TP=2 a rank's share of o's K (256 / 2) is not a whole super-group: Q4_1's layout
    # for it; down's (512 / 2) is, and qkv, gate_up and the lm_head split N
    assert auto_weights(str(q4_k_file), tp=2).describe() == (
        "int4-k: 6 Q4_K tensors as stored; o@0 int4-g32-asym: 1 Q4_K tensor as stored; "
        "lm_head int4-k: Q4_K as stored")


@pytest.fixture(scope="module")
def q4_k_m_file(tmp_path_factory):
    """A one-layer llama GGUF in llama.cpp's Q4_K_M mix: Q6_K for v, down and the (tied)
    embedding, Q4_K for the other matrices."""
    from gguf_tiny import TYPES

    path = tmp_path_factory.mktemp("q4km") / "tiny-q4km.gguf"
    types = dict.fromkeys(TYPES, "Q4_K") | dict.fromkeys(
        ["attn_v.weight", "ffn_down.weight", "token_embd.weight"], "Q6_K")
    return write_tiny_gguf(path, types=types, config=dict(hidden=256, ffn=512, layers=1))[0]


def test_a_q4_k_m_file_loads_its_q6_k_blocks_as_int6_k_and_its_lm_head_runs_in_it(q4_k_m_file):
    from sandwich.runtime.gguf_file import GGUFCheckpoint

    ck = GGUFCheckpoint(q4_k_m_file)
    six = [n for n in ck.keys() if ck.get(n).dtype == "Q6_K"]
    assert len(six) == 3
    for name in six:
        t = ck.get(name)
        assert t.blocks(parse_format("int8-g32")) is None  # Q6_K loads only into int6-k
        assert np.array_equal(dequantize(t.blocks(parse_format("int6-k"))), t.to_f32().T), name
    choice = auto_weights(str(q4_k_m_file))
    assert choice.weights == "int4-k,down@0=int6-k,lm_head=int6-k,v@0=int6-k"
    assert choice.describe() == ("int4-k: 5 Q4_K tensors as stored; "
                                 "down@0 int6-k: 1 Q6_K tensor as stored; "
                                 "v@0 int6-k: 1 Q6_K tensor as stored; "
                                 "lm_head int6-k: Q6_K as stored")


def _headers_only(path, tensors: dict[str, tuple[str, tuple[int, ...]]]):
    """A GGUF holding just `tensors` (name -> (type, shape, K last)), zero bytes: what the
    choice reads is the header."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES

    w = gguf.GGUFWriter(str(path), "llama")
    for name, (kind, shape) in tensors.items():
        qtype = T[kind]
        per, size = GGML_QUANT_SIZES[qtype]
        w.add_tensor(name, np.zeros((*shape[:-1], shape[-1] // per * size), np.uint8), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_auto_runs_a_file_in_the_format_most_of_its_gemm_values_are_stored_in(tmp_path):
    q4_k_m = {  # llama.cpp's Q4_K_M mix: Q6_K for v, down and the output matrix
        **{f"blk.0.{n}.weight": ("Q4_K", (512, 512)) for n in ("attn_q", "attn_k", "attn_output",
                                                               "ffn_gate", "ffn_up")},
        "blk.0.attn_v.weight": ("Q6_K", (512, 512)), "blk.0.ffn_down.weight": ("Q6_K", (512, 512)),
        "blk.0.ffn_gate_inp.weight": ("F32", (8, 512)),  # a router: fp32 whatever the format
        "blk.0.attn_norm.weight": ("F32", (512,)), "output.weight": ("Q6_K", (1024, 512)),
        "token_embd.weight": ("Q6_K", (4096, 512)),  # a row lookup beside output.weight
    }
    km = _headers_only(tmp_path / "km.gguf", q4_k_m)
    choice = auto_weights(km)
    # Q6_K's blocks as they are: the down matrix, the output, and v apart from Q4_K's q, k
    assert choice.weights == "int4-k,down@0=int6-k,lm_head=int6-k,v@0=int6-k"
    assert choice.describe() == ("int4-k: 5 Q4_K tensors as stored; "
                                 "down@0 int6-k: 1 Q6_K tensor as stored; "
                                 "v@0 int6-k: 1 Q6_K tensor as stored; "
                                 "lm_head int6-k: Q6_K as stored")
    narrow = q4_k_m | {"blk.0.ffn_down.weight": ("Q8_0", (512, 576))}  # a K of 576: not 256s
    assert auto_weights(_headers_only(tmp_path / "n.gguf", narrow)).weights == (
        "int4-k,down@0=int8-g32,lm_head=int6-k,v@0=int6-k")  # that op alone in its own format
    assert auto_weights(km, tp=4).weights == (  # a rank's share of o's and down's K = 512 is
        "int4-k,down@0=int8-g32,lm_head=int6-k,o@0=int4-g32-asym,v@0=int6-k")  # 128: int8-g32 above 6 bits
    # llama.cpp's Q5_K_M: the same mix on Q5_K, which runs as stored too (int5-k); under TP=4
    # a rank's 128 of o's K is not a super-group: int8-g32, the nearest above 5 bits
    q5_k_m = {name: ("Q5_K" if t == "Q4_K" else t, s) for name, (t, s) in q4_k_m.items()}
    k5 = _headers_only(tmp_path / "k5.gguf", q5_k_m)
    assert auto_weights(k5).weights == "int5-k,down@0=int6-k,lm_head=int6-k,v@0=int6-k"
    assert auto_weights(k5).describe().startswith("int5-k: 5 Q5_K tensors as stored; ")
    assert auto_weights(k5, tp=4).weights == (
        "int5-k,down@0=int8-g32,lm_head=int6-k,o@0=int8-g32,v@0=int6-k")
    tied = {k: v for k, v in q4_k_m.items() if k != "output.weight"}  # the embedding is lm_head
    assert auto_weights(_headers_only(tmp_path / "tied.gguf", tied)).weights == choice.weights
    head_q4 = q4_k_m | {"output.weight": ("Q4_0", (1024, 512))}  # fewer bits: the layers' format
    assert auto_weights(_headers_only(tmp_path / "q4.gguf", head_q4)).weights == "int4-k,down@0=int6-k,v@0=int6-k"
    tie = {"blk.0.attn_q.weight": ("Q4_0", (256, 256)), "blk.0.attn_k.weight": ("Q8_0", (256, 256)),
           "output.weight": ("Q4_0", (64, 256))}
    assert auto_weights(_headers_only(tmp_path / "tie.gguf", tie)).weights == "int8-g32"  # more bits
    f16 = {"blk.0.attn_q.weight": ("F16", (64, 64)), "output.weight": ("F16", (64, 64))}
    assert auto_weights(_headers_only(tmp_path / "f16.gguf", f16)).describe() == (
        "bf16: 1 F16 converted; lm_head bf16: F16 converted")
    for other in ("llama-160m", str(tmp_path)):  # an embedded config, a directory: fp32
        assert auto_weights(other).weights == "fp32" and not auto_weights(other).types
    with pytest.raises(ConfigError) as e:
        auto_weights(str(tmp_path / "missing.gguf"))
    assert "no such GGUF file" in one_line(e)


def test_llama_cpp_compares_on_the_file_itself_where_the_spec_runs_it_as_stored(tmp_path):
    """`--weights auto`, or the spec auto gives the file named outright: llama.cpp runs the
    GGUF file itself (`weights_auto`); any other spec, or a model that is not a GGUF file:
    llama.cpp runs what its quantizer makes of the F32 tensors."""
    from argparse import Namespace

    from sandwich.cli.common import resolve_weights

    km = _headers_only(tmp_path / "km.gguf", {
        "blk.0.attn_q.weight": ("Q5_K", (512, 512)), "blk.0.attn_k.weight": ("Q5_K", (512, 512)),
        "blk.0.ffn_down.weight": ("Q6_K", (512, 512)), "output.weight": ("Q6_K", (1024, 512))})
    mix = "int5-k,down@0=int6-k,lm_head=int6-k"
    for model, weights, same in ((km, "auto", True), (km, f" {mix} ", True), ([km, km], mix, True),
                                 (km, "int5-k", False), (km, "int8-g32", False),
                                 ("llama-160m", "fp32", False), (str(tmp_path / "no.gguf"), mix, False)):
        args = Namespace(model=model, weights=weights, tp=1)
        resolve_weights(args)
        assert (args.weights_auto, parse_weights(args.weights).name) == (
            same, mix if weights == "auto" else parse_weights(weights).name), (model, weights)
    # a file of mixed types that auto runs in fp32 (its Q8_0 tensors widened): llama.cpp
    # runs the file itself for auto, and an F32 export for fp32 named outright (the file
    # would have it multiply those tensors as Q8_0, 0.5% off in perplexity)
    f32 = _headers_only(tmp_path / "f32.gguf", {
        "blk.0.attn_q.weight": ("F32", (512, 512)), "blk.0.ffn_down.weight": ("F16", (512, 512)),
        "blk.0.attn_k.weight": ("Q8_0", (256, 512)), "output.weight": ("F32", (1024, 512))})
    for weights, same in (("auto", True), ("fp32", False)):
        args = Namespace(model=f32, weights=weights, tp=1)
        resolve_weights(args)
        assert (args.weights_auto, args.weights) == (same, "fp32"), weights


def test_a_weight_spec_names_the_lm_heads_format_beside_the_layers():
    spec = parse_weights(" int4-asym , lm_head = int8-g32 ")
    assert spec.name == "int4-g32-asym,lm_head=int8-g32" and spec.slug == "int4-g32-asym-lm_head-int8-g32"
    assert spec.for_op("lm_head").name == "int8-g32" and spec.for_op("qkv").name == "int4-g32-asym"
    assert parse_weights("int4,lm_head=int4-g32").name == "int4-g32"  # an override like the base
    assert parse_weights("int8-g32,o=int4,lm_head=fp32").name == "int8-g32,lm_head=fp32,o=int4-g32"
    assert parse_weights(spec) is spec and parse_weights(parse_format("bf16")).name == "bf16"
    layered = parse_weights("int4-k, down@3.2 = q6_k, lm_head=int6-k, o@1=int4-k, qkv=int8-g32")
    assert layered.name == "int4-k,down@2.3=int6-k,lm_head=int6-k,qkv=int8-g32"  # o@1: as o is
    assert [layered.for_op("down", i).name for i in range(4)] == ["int4-k", "int4-k", "int6-k", "int6-k"]
    assert layered.for_op("down").name == "int4-k" and layered.for_op("qkv", 2).name == "int8-g32"
    assert {i: {op: f.name for op, f in ops.items()} for i, ops in layered.layered().items()} == {
        2: {"down": "int6-k"}, 3: {"down": "int6-k"}}
    for bad, what in (("int4,head=int8", "'head=int8' is not OP=FORMAT"),
                      ("int4,lm_head", "'lm_head' is not OP=FORMAT"),
                      ("int4,down@=int8-g32", "'down@=int8-g32' is not OP=FORMAT or OP@LAYER"),
                      ("int4,down@1.x=int8-g32", "is not OP=FORMAT or OP@LAYER.LAYER...=FORMAT"),
                      ("int4,lm_head=int3", "unknown weight format 'int3'")):
        with pytest.raises(ConfigError) as e:
            parse_weights(bad)
        assert what in one_line(e)


def test_the_payload_gives_each_op_its_spec_format(tmp_path):
    import json

    from sandwich.models import load_model_config, read_raw_config
    from sandwich.payload import make_payload, resident_bytes

    cfg = load_model_config("llama-160m")
    ops = {op.name: op.dtype for op in make_payload(cfg, seq_max=8, weights="int4,lm_head=int8-g32").ops}
    assert ops == {"qkv": "int4-g32", "o": "int4-g32", "gate_up": "int4-g32", "down": "int4-g32",
                   "lm_head": "int8-g32"}
    head = cfg.vocab_size * cfg.hidden_size  # the lm_head's values: 34 bytes a 32 against 18
    assert (resident_bytes(cfg, weights="int4,lm_head=int8-g32") - resident_bytes(cfg, weights="int4")
            == head * 16 // 32)
    raw, _ = read_raw_config("llama-160m")  # K = 576: whole groups of 32, not of 128
    (tmp_path / "config.json").write_text(json.dumps(raw | dict(hidden_size=576, num_attention_heads=9,
                                                                num_key_value_heads=3)))
    narrow = load_model_config(tmp_path / "config.json")
    assert make_payload(narrow, seq_max=8, weights="int8-g32,o=int4-g64").ops[1].dtype == "int4-g64"
    with pytest.raises(ConfigError, match="int4-g128 needs K a multiple of 128"):
        make_payload(narrow, seq_max=8, weights="int8-g32,lm_head=int4-g128")
    # an op in another format in some layers: one op per format, each its layers' share
    split = make_payload(cfg, seq_max=8, weights="int4,down@0.5=int8-g32").ops
    assert [(op.name, op.dtype, op.count) for op in split if op.name == "down"] == [
        ("down", "int4-g32", cfg.num_hidden_layers - 2), ("down", "int8-g32", 2)]
    assert (resident_bytes(cfg, weights="int4,down@0.5=int8-g32") - resident_bytes(cfg, weights="int4")
            == 2 * cfg.intermediate_size * cfg.hidden_size * 16 // 32)
    # layer 1's v apart from its q and k: a q|k op in QKV's format and a v op in its own
    h, d, kv = cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads
    apart = [(op.name, op.n, op.k, op.dtype, op.count)
             for op in make_payload(cfg, seq_max=8, weights="int4,v@1=int8-g32").ops if op.name in ("qkv", "qk", "v")]
    assert apart == [("qkv", (cfg.num_attention_heads + 2 * kv) * d, h, "int4-g32", 11),
                     ("qk", (cfg.num_attention_heads + kv) * d, h, "int4-g32", 1), ("v", kv * d, h, "int8-g32", 1)]
    assert parse_weights("int4,v@1=int4").split_v(1) is None  # v in q and k's format: fused
    with pytest.raises(ConfigError, match="name layer 12; .* has 12 .0 to 11."):
        make_payload(cfg, seq_max=8, weights="int4,down@12=int8-g32")


def test_the_command_line_takes_a_spec_and_refuses_a_bad_one(capsys):
    from sandwich.cli import main

    with pytest.raises(SystemExit) as e:
        main(["tune", "--weights", "int4,lm_head=nope"])
    assert e.value.code == 2 and "unknown weight format 'nope'" in capsys.readouterr().err


def test_per_layer_formats_give_each_layer_its_kernels_at_every_tp_degree():
    """`model_gemms` and a TP rank's `shard_gemms` look up one kernel per (op, format) of the
    spec, each layer's at its own shapes: a v apart (q|k and v) and a down in int6-k in layer
    1 only, a rank's share of N or K under TP=2 (a stub cache records what is asked)."""
    from types import SimpleNamespace

    from sandwich.models import load_model_config
    from sandwich.runtime.loader import model_gemms
    from sandwich.runtime.shard import shard_gemms

    class Cache:
        def gemm(self, *, n, k, dtype, threads=None):
            return SimpleNamespace(n_out=n, k=k, dtype=dtype)

    cfg = load_model_config("qwen3-0.6b")
    d, q, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    spec = "int4-k,down@1=int6-k,v@1=int6-k,lm_head=int6-k"
    for tp, g in ((1, model_gemms(cfg, Cache(), weights=spec)),
                  (2, shard_gemms(cfg, Cache(), tp=2, weights=spec))):
        zero, one = g.at(0), g.at(1)
        assert zero is g and g.at(2) is g and (zero.qk, zero.v) == (None, None)
        assert (zero.qkv.n_out, zero.qkv.dtype) == ((q + 2 * kv) * d // tp, "int4-k")
        assert ((one.qk.n_out, one.qk.dtype), (one.v.n_out, one.v.dtype)) == (
            ((q + kv) * d // tp, "int4-k"), (kv * d // tp, "int6-k"))
        assert (one.down.k, one.down.dtype, zero.down.dtype) == (cfg.intermediate_size // tp, "int6-k", "int4-k")
        assert one.o is g.o and one.lm_head.dtype == "int6-k"
    every = model_gemms(cfg, Cache(), weights="int4-k,v=int6-k")  # every layer's v apart
    assert every.qkv is None and every.at(0).v.dtype == "int6-k" and every.at(27).qk.dtype == "int4-k"
