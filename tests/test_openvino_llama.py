"""The OpenVINO serving peer computes what HF's LlamaForCausalLM computes on the same weights:
greedy ids and prefill logits, for GQA, MHA, and tied embeddings with llama3 RoPE scaling."""

import json

import numpy as np
import pytest

pytest.importorskip("openvino")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sandwich.bench.openvino_llama import OpenVinoLlamaPeer, causal_mask  # noqa: E402
from sandwich.errors import ConfigError  # noqa: E402
from sandwich.runtime.checkpoint import write_checkpoint  # noqa: E402

TINY = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "vocab_size": 256, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
    "initializer_range": 0.2,  # large enough that greedy argmax has no near-ties
}
LLAMA3_ROPE = {"rope_theta": 500000.0, "rope_scaling": {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32}}
CASES = {
    "gqa": {},
    "mha": {"num_key_value_heads": 4},
    "tied-llama3": {"tie_word_embeddings": True, **LLAMA3_ROPE},
}
PROMPT = [5, 17, 99, 3, 250, 42, 7, 128, 64, 11]
NEW = 8


def _checkpoint(tmp_path_factory, over: dict):
    cfg = tmp_path_factory.mktemp("cfg") / "config.json"
    cfg.write_text(json.dumps(TINY | over))
    return write_checkpoint(cfg, tmp_path_factory.mktemp("ckpt"), seed=5, norm_std=0.1)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(OpenVINO peer, HF model) on one random checkpoint."""
    d = _checkpoint(tmp_path_factory, CASES[request.param])
    peer = OpenVinoLlamaPeer(d, threads=1, max_seq=32)
    hf = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    yield peer, hf
    peer.close()


def _hf_greedy(hf, prompt, n):
    """HF's own cached greedy loop, as HfPeer runs it."""
    ids = []
    with torch.inference_mode():
        out = hf(torch.tensor([prompt]), use_cache=True)
        for i in range(n):
            if i:
                out = hf(torch.tensor([[ids[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            ids.append(int(out.logits[0, -1].argmax()))
    return ids


def test_greedy_ids_match_hf(pair):
    peer, hf = pair
    want = _hf_greedy(hf, PROMPT, NEW)
    got = peer.generate(PROMPT, NEW)
    assert got.ids == want
    assert got.ttft_ms > 0 and got.tpot_ms > 0
    assert peer.generate(PROMPT, NEW).ids == want  # reset_state: a rerun starts from an empty cache


def test_prefill_logits_match_hf(pair):
    peer, hf = pair
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPT])).logits[0, -1].numpy()
    got = peer.logits(PROMPT)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-3


def test_stateful_fused_attention_and_rope(pair):
    """The CPU plugin folded the KV concat into its SDPA (beam_idx + the two states are its
    inputs, no Concatenation left) and fused RoPE; else TPOT would not be OpenVINO's best."""
    peer, _ = pair
    types = peer.exec_layer_types()
    assert types.get("ScaledDotProductAttention") == TINY["num_hidden_layers"]
    assert "Concatenation" not in types
    assert types.get("RoPE") == 2 * TINY["num_hidden_layers"]


def test_causal_mask():
    m = causal_mask(2, 3)[0, 0]
    assert m.shape == (3, 5)
    assert (m == 0).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert not causal_mask(7, 1).any()


def test_config_errors(tmp_path, pair):
    peer, _ = pair
    (tmp_path / "config.json").write_text(json.dumps(TINY | {"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="not Llama-family"):
        OpenVinoLlamaPeer(tmp_path, threads=1, max_seq=32)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(ConfigError, match="safetensors"):
        OpenVinoLlamaPeer(tmp_path, threads=1, max_seq=32)
    with pytest.raises(ConfigError, match="max_seq"):
        peer.generate(PROMPT, 30)


def test_hf_uses_the_same_rope(pair):
    """Guards the comparison itself: HF read the same RoPE (llama3 scaling included)."""
    from sandwich.runtime.loader import read_config
    from sandwich.runtime.rope_tables import inv_freq

    peer, hf = pair
    _, spec = read_config(hf.name_or_path)
    np.testing.assert_allclose(hf.model.rotary_emb.inv_freq.numpy(), inv_freq(spec), rtol=1e-6)


INT_FORMATS = ["int8-g32", "int4-g32", "int4-g64-asym", "int8"]


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    """A tied-embedding checkpoint: its lm_head is the embedding's values, compressed too."""
    return _checkpoint(tmp_path_factory, CASES["tied-llama3"])


def _hf_dequantized_logits(model_dir, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """HF's prefill logits with every Linear (lm_head included, untied from the embedding,
    which stays fp32) on the dequantized values of sandwichc's quantization; and on fp32."""
    from sandwich.weight_formats import dequantize, quantize

    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        fp32 = hf(torch.tensor([PROMPT])).logits[0, -1].numpy()
    with torch.no_grad():
        for mod in hf.modules():
            if isinstance(mod, torch.nn.Linear):
                w = dequantize(quantize(mod.weight.numpy().T, fmt)).T
                mod.weight = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(w)))
        return hf(torch.tensor([PROMPT])).logits[0, -1].numpy(), fp32


def _fc_precisions(peer) -> list[str]:
    """The weight precision of each FullyConnected in the compiled (runtime) graph."""
    return [op.get_rt_info()["runtimePrecision"].astype(str)
            for op in peer.compiled.get_runtime_model().get_ops()
            if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]


@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_int_weights_match_hf_on_the_dequantized_weights(tied_dir, fmt):
    """OpenVINO runs sandwichc's int values and scales: with activations kept f32 its logits
    are HF's on the dequantized weights (not fp32's), and the CPU plugin kept every weight
    compressed inside its FullyConnected (no f32 FullyConnected, no decompression Multiply)."""
    ref, fp32 = _hf_dequantized_logits(tied_dir, fmt)
    peer = OpenVinoLlamaPeer(tied_dir, threads=1, max_seq=32, weights=fmt, dynamic_quantization=False)
    try:
        assert peer.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == 0
        got = peer.logits(PROMPT)
        scale = np.abs(ref).max()
        assert np.abs(got - ref).max() / scale < 1e-4
        assert np.abs(got - fp32).max() / scale > 1e-3  # the quantization shows: not fp32 weights
        want = {"int8-g32": "i8", "int8": "i8", "int4-g32": "i4", "int4-g64-asym": "u4"}[fmt]
        assert _fc_precisions(peer) == [want] * (7 * TINY["num_hidden_layers"] + 1)
        # two residual Adds and gate * up per layer, as in fp32: no decompression Multiply left
        assert peer.exec_layer_types().get("Eltwise") == 3 * TINY["num_hidden_layers"]
    finally:
        peer.close()


def test_int_weights_generate_with_the_plugins_defaults(tied_dir):
    """The benchmark's configuration: the plugin's default dynamic quantization of activations
    (groups of 32) on; it still generates, and its logits stay near the f32-activation ones."""
    peer = OpenVinoLlamaPeer(tied_dir, threads=1, max_seq=32, weights="int4-g32")
    try:
        assert peer.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") != 0
        assert len(peer.generate(PROMPT, NEW).ids) == NEW
        ref, _ = _hf_dequantized_logits(tied_dir, "int4-g32")
        assert np.abs(peer.logits(PROMPT) - ref).max() / np.abs(ref).max() < 0.2
    finally:
        peer.close()


def test_bf16_weights_run_under_the_plugins_bf16_precision(tied_dir):
    """bf16: the fp32 graph compiled with bf16 inference precision; it generates, and its
    logits stay within bf16's error of HF's fp32 ones on the same checkpoint."""
    from sandwich.compiler.target import detect_cpu

    peer = OpenVinoLlamaPeer(tied_dir, threads=1, max_seq=32, weights="bf16")
    try:
        if detect_cpu().bf16_dot:  # without bf16 units the plugin runs f32
            assert "bfloat16" in str(peer.compiled.get_property("INFERENCE_PRECISION_HINT"))
        assert len(peer.generate(PROMPT, NEW).ids) == NEW
        ref, _ = _hf_dequantized_logits(tied_dir, "bf16")  # HF on the bf16-rounded weights
        assert np.abs(peer.logits(PROMPT) - ref).max() / np.abs(ref).max() < 0.1
    finally:
        peer.close()


@pytest.mark.parametrize("fmt, match", [("int3", "unknown weight format 'int3'"),
                                        ("bf16,o=int8", "runs one format for every GEMM"),
                                        ("int4-g128", "needs K a multiple of 128")])
def test_bad_weight_format_is_one_line_config_error(tied_dir, fmt, match):
    with pytest.raises(ConfigError, match=match) as e:
        OpenVinoLlamaPeer(tied_dir, threads=1, max_seq=32, weights=fmt)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fmt", ["int4-g32-asym", "int4-g32", "int8-g32", "int4-k", "int5-k",
                                 "int6-k"])
def test_compressed_weight_of_flat_groups(fmt):
    """Groups with one value everywhere (scale 0; for Q4_1 the minimum alone) decompress to
    that value: the asymmetric zero point -min/scale would divide by zero. int4-k (K of 256:
    one super-group) decompresses with its d*sc and dmin*m as float32 scales and minimums,
    int5-k likewise on its 5-bit values as u8, int6-k with its values - 32 as i8 and d*sc per 16 as float32 scales."""
    import openvino as ov
    import openvino.opset13 as ops

    from sandwich.bench.openvino_weights import compressed_weight
    from sandwich.weight_formats import dequantize, parse_format, quantize

    k = 256 if parse_format(fmt).super_group else 64
    w = np.random.default_rng(1).standard_normal((k, 4)).astype(np.float32)  # (K, N)
    w[:32, 1] = 0.75
    w[32:, 2] = 0.0
    qw = quantize(w, fmt)
    x = ops.parameter([2, k], np.float32)
    model = ov.Model([ops.matmul(x, compressed_weight(ops, qw), False, True)], [x])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    a = np.random.default_rng(2).standard_normal((2, k)).astype(np.float32)
    np.testing.assert_allclose(compiled([a])[0], a @ dequantize(qw), rtol=1e-5, atol=1e-5)
