"""Qwen2-MoE and Qwen3-MoE: logits equal transformers' Qwen2MoeForCausalLM / Qwen3MoeForCausalLM
on the same random checkpoint (Qwen2-MoE's shared expert and its sigmoid gate, unnormalized
top-k weights; Qwen3-MoE's q/k head norms, renormalized ones), the same weights through a GGUF
file (llama.cpp's qwen2moe/qwen3moe layout: experts stacked per projection) equal the
safetensors ones and transformers reading that file, quantized expert stacks load as their
own blocks, TP=2 splits the shared expert like the others, and malformed configs are one line.

The models are shrunk so their GEMMs share tests/test_moe.py's tuned shapes (hidden 128,
heads 4 of 32, experts 128 wide, a 4-column router): Qwen2-MoE has 3 experts (+ the shared
gate's column) and a shared expert 256 wide (its gate/up is lm_head's 512 x 128).
"""

import importlib.util
import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import tune_model, tuned_checkpoint

from sandwich.errors import ConfigError
from sandwich.models import load_model_config
from sandwich.payload import make_payload
from sandwich.runtime.executor import Executor
from sandwich.runtime.loader import load_model
from sandwich.runtime.moe import route
from sandwich.runtime.tp import TPExecutor

pytestmark = pytest.mark.tvm
try:
    import torch
    import transformers
except ImportError:
    torch = transformers = None

SHAPES = dict(hidden_size=128, moe_intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, vocab_size=512)
TINY = {
    "qwen3-30b-a3b": SHAPES | dict(num_experts=4, num_experts_per_tok=2),
    "qwen1.5-moe-a2.7b": SHAPES | dict(num_experts=3, num_experts_per_tok=2,
                                       shared_expert_intermediate_size=256),
}
HF_CLASS = {"qwen3-30b-a3b": "Qwen3MoeForCausalLM", "qwen1.5-moe-a2.7b": "Qwen2MoeForCausalLM"}
PROMPT = [1, 5, 9, 200, 100, 7, 11, 13, 40, 41, 300]


@pytest.fixture(scope="module", params=sorted(TINY))
def qmoe(request, tmp_path_factory, cache):
    name = request.param
    d = tuned_checkpoint(tmp_path_factory, cache, name, **TINY[name])
    return name, d, load_model(d, cache, threads=2)


def _rel(a, ref) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def _greedy_errors(ex: Executor, step, steps: int = 6) -> list[float]:
    """Our logits against `step(tokens) -> reference logits` over PROMPT and `steps` greedy
    tokens (the reference's choices), each as the error relative to the largest logit."""
    slot, logits = ex.start(PROMPT)
    ref = step(PROMPT)
    errors = [_rel(logits, ref)]
    for _ in range(steps):
        tok = int(ref.argmax())
        assert int(logits.argmax()) == tok  # the same greedy token
        logits, ref = ex.decode([slot], [tok])[0], step([tok])
        errors.append(_rel(logits, ref))
    return errors


def _hf_stepper(hf):
    """A function feeding tokens to an HF model with its KV cache, returning the last logits."""
    past = None

    def step(tokens):
        nonlocal past
        with torch.no_grad():
            r = hf(torch.tensor([tokens]), past_key_values=past, use_cache=True)
        past = r.past_key_values
        return r.logits[0, -1].numpy()

    return step


def test_payload_router_carries_the_shared_gate_and_the_expert_width():
    q3 = load_model_config("qwen3-30b-a3b")
    assert (q3.intermediate_size, q3.num_local_experts, q3.num_experts_per_tok,
            q3.norm_topk_prob, q3.qk_norm) == (768, 128, 8, True, True)
    ops = {op.name: (op.n, op.k, op.count) for op in make_payload(q3).ops}
    assert ops["router"] == (128, 2048, 48) and ops["expert_gate_up"] == (1536, 2048, 384)
    assert "shared_gate_up" not in ops
    q2 = load_model_config("qwen1.5-moe-a2.7b")
    assert (q2.intermediate_size, q2.shared_expert_intermediate_size, q2.router_outputs,
            q2.norm_topk_prob, q2.qkv_bias) == (1408, 5632, 61, False, True)
    ops = {op.name: (op.n, op.k, op.count) for op in make_payload(q2, tp=2).ops}
    assert ops["shared_gate_up"] == (5632, 2048, 24) and ops["shared_down"] == (2048, 2816, 24)
    assert ops["expert_down"] == (2048, 704, 96)
    int4 = {op.name: op.dtype for op in make_payload(q3, weights="int4").ops}
    assert int4["router"] == "float32" and int4["expert_gate_up"] == "int4-g32"  # FP32_OPS


def test_unnormalized_routing_keeps_the_softmax_probabilities():
    logits = np.random.default_rng(3).standard_normal((9, 6), np.float32)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids, w = route(logits, 2, normalize=False)
    np.testing.assert_allclose(w, np.take_along_axis(p, ids, axis=1), rtol=1e-6)
    assert (w.sum(axis=1) < 1).all()
    _, wn = route(logits, 2)
    np.testing.assert_allclose(wn.sum(axis=1), 1, rtol=1e-6)


def test_logits_equal_transformers(qmoe):
    """DSL ops (the shared expert's SiLU-mul at its own width) against transformers' own
    Qwen MoE classes on the hub-layout checkpoint; a skipped shared expert, a renormalized
    Qwen2-MoE routing or a missing head norm each move the logits far past the bound."""
    if transformers is None:
        pytest.skip("transformers is not installed (pip install -e .[dev])")
    name, d, model = qmoe
    hf = getattr(transformers, HF_CLASS[name]).from_pretrained(d, dtype=torch.float32).eval()
    ex = Executor(model, max_batch=2, max_seq=64, max_tokens=16, ops="dsl", threads=2)
    errors = _greedy_errors(ex, _hf_stepper(hf))
    assert max(errors) <= 1e-4, errors


def test_gguf_file_gives_the_same_logits_as_safetensors_and_transformers(qmoe, tmp_path, cache):
    """The checkpoint written as llama.cpp lays it out (bench/gguf_export.py: qwen2moe/qwen3moe,
    ffn_*_exps stacked, the shared gate a vector): sandwichc reading it equals sandwichc on
    the safetensors, and transformers reading the same file (its GGUF reader is given the
    expert width and llama.cpp's routing, which its qwen*moe mapping leaves at defaults)."""
    from test_gguf import _generate_json

    from sandwich.bench.gguf_export import write_gguf
    from sandwich.bench.serving_peers import hf_model

    name, d, model = qmoe
    path = write_gguf(d, tmp_path / "m.gguf")
    gmodel = load_model(path, cache, threads=2)
    assert replace(gmodel.config, name=model.config.name,  # GGUF keeps eps in float32
                   rms_norm_eps=model.config.rms_norm_eps) == model.config
    ours = Executor(model, max_batch=1, max_seq=64, max_tokens=16, ops="numpy", threads=2)
    ref_step = _executor_stepper(ours)
    theirs = Executor(gmodel, max_batch=2, max_seq=64, max_tokens=16, ops="numpy", threads=2)
    assert max(_greedy_errors(theirs, ref_step)) <= 1e-5
    want = [int(theirs.start(PROMPT)[1].argmax())]  # the first greedy token, in a fresh slot
    got = _generate_json(["--model", str(path), "--cache-dir", str(cache.dir), "--no-tune",
                          "--threads", "2", "--plan", "off", "--prompt-ids",
                          ",".join(map(str, PROMPT)), "--max-new-tokens", "3"])
    assert got["ids"][:1] == want and len(got["ids"]) == 3  # the CLI path, DSL ops
    if transformers is None:
        return
    hf = hf_model(path).eval()
    ex = Executor(gmodel, max_batch=1, max_seq=64, max_tokens=16, ops="numpy", threads=2)
    errors = _greedy_errors(ex, _hf_stepper(hf))
    assert max(errors) <= 1e-4, errors


def _executor_stepper(ex: Executor):
    slot = None

    def step(tokens):
        nonlocal slot
        if slot is None:
            slot, logits = ex.start(tokens)
        else:
            logits = ex.decode([slot], tokens)[0]
        return logits.copy()

    return step


def test_quantized_expert_stacks_load_as_their_own_blocks(qmoe, tmp_path, cache):
    """A GGUF whose expert stacks are Q8_0 (llama.cpp's quantizer's layout: blocks along each
    expert's rows) loads with --weights int8-g32 as those blocks, no re-quantizing: expert
    e's packed weights equal its slice of the stack's blocks packed."""
    import gguf
    from gguf.quants import quantize

    from sandwich.bench.gguf_export import write_gguf
    from sandwich.gguf_blocks import from_gguf_blocks
    from sandwich.runtime.gguf_file import GGUFCheckpoint

    name, d, _ = qmoe
    f32 = GGUFCheckpoint(write_gguf(d, tmp_path / "f32.gguf"))
    reader = gguf.GGUFReader(f32.path)
    q8 = gguf.GGMLQuantizationType.Q8_0
    w = gguf.GGUFWriter(str(tmp_path / "q8.gguf"), f32.metadata["general.architecture"])
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if "_exps." in t.name:
            w.add_tensor(t.name, quantize(data, q8), raw_dtype=q8)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tune_model(tmp_path / "q8.gguf", cache, weights="int8-g32", seq_max=1)
    model = load_model(tmp_path / "q8.gguf", cache, threads=2, weights="int8-g32")
    q = GGUFCheckpoint(tmp_path / "q8.gguf")
    e, layer = 2, 1
    key = "mlp.experts.2.down_proj.weight"
    t = q.get(f"model.layers.{layer}.{key}")
    assert t.dtype == "Q8_0" and t.shape == (128, 128)
    want = model.gemms.down.pack(from_gguf_blocks(t.raw.data, "Q8_0", t.shape))
    got = model.layers[layer].moe.experts[e].down
    for a, b in zip(got.data, want.data, strict=True):
        np.testing.assert_array_equal(a, b)
    fp = Executor(load_model(tmp_path / "f32.gguf", cache, threads=2), max_batch=1, max_seq=32,
                  max_tokens=16, ops="numpy", threads=2)
    ex = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="numpy", threads=2)
    _, want_logits = fp.start(PROMPT)
    _, got_logits = ex.start(PROMPT)
    assert _rel(got_logits, want_logits) <= 5e-2  # 8-bit weights and activations


def test_tp2_equals_tp1(qmoe, cache):
    """Each rank holds half of every expert's (and the shared expert's) intermediate columns;
    the shared gate rides in the replicated router, so both ranks scale their halves alike."""
    name, d, model = qmoe
    tune_model(d, cache, tp=2, threads=1)
    ref = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="numpy", threads=2)
    tp = TPExecutor(d, cache, tp=2, max_batch=1, max_seq=32, max_tokens=16, ops="numpy",
                    cpu_sets=[[0], [1]])
    try:
        errors = _greedy_errors(tp, _executor_stepper(ref), steps=4)
    finally:
        tp.close()
    assert max(errors) <= 1e-4, errors


def test_every_peer_emits_the_same_greedy_tokens(qmoe, tmp_path, cache):
    """`bench serving` on the MoE checkpoints: sandwichc, HF transformers and llama.cpp (its
    own qwen2moe/qwen3moe graph on the exported F32 GGUF; where llama-cpp-python is
    installed) emit the same greedy tokens; OpenVINO, whose graph has dense MLPs only, is
    refused in one line."""
    from sandwich.bench.serving import _make_peer

    _, d, _ = qmoe
    with pytest.raises(ConfigError, match="MoE model") as e:
        _make_peer("openvino", d, threads=2, max_seq=32, cache=cache, work=tmp_path)
    assert "\n" not in str(e.value)
    names = ["sandwichc"] + (["hf-transformers"] if transformers is not None else [])
    if importlib.util.find_spec("llama_cpp") is not None:
        names.append("llama.cpp")
    ids = {}
    for name in names:
        peer = _make_peer(name, d, threads=2, max_seq=32, cache=cache, work=tmp_path)
        ids[name] = peer.generate(PROMPT, 8).ids
        peer.close()
    assert all(v == ids["sandwichc"] for v in ids.values()), ids


def _config(tmp_path, name, **over):
    from sandwich.models import read_raw_config

    raw, _ = read_raw_config(name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw | TINY[name] | over))
    return path


@pytest.mark.parametrize("name,over,message", [
    ("qwen3-30b-a3b", {"mlp_only_layers": [0]}, "dense MLP layers among the MoE ones"),
    ("qwen1.5-moe-a2.7b", {"decoder_sparse_step": 2}, "every layer must be sparse"),
    ("qwen3-30b-a3b", {"num_experts": 2, "num_experts_per_tok": 3},
     "num_experts_per_tok 3 exceeds num_experts 2"),
    ("qwen3-30b-a3b", {"norm_topk_prob": "yes"}, "'norm_topk_prob' must be true or false"),
    ("qwen1.5-moe-a2.7b", {"shared_expert_intermediate_size": 0},
     "'shared_expert_intermediate_size' must be a positive integer"),
])
def test_malformed_qwen_moe_config_is_one_line(tmp_path, name, over, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_model_config(_config(tmp_path, name, **over))
    assert "\n" not in str(e.value)


def test_gguf_moe_metadata_maps_to_the_config_and_errors_are_one_line():
    """A qwen3moe header (llama.cpp's keys) gives the Qwen3-MoE config: the expert width from
    expert_feed_forward_length (the dense feed_forward_length may be absent), top-k weights
    renormalized as llama.cpp's qwen3moe graph does; per-expert tensors (an older converter)
    and a missing expert key are one line each."""
    from sandwich.gguf_config import hf_config
    from sandwich.models import parse_model_config

    meta = {"general.architecture": "qwen3moe", "qwen3moe.embedding_length": 128,
            "qwen3moe.attention.head_count": 4, "qwen3moe.attention.head_count_kv": 2,
            "qwen3moe.block_count": 2, "qwen3moe.context_length": 64,
            "qwen3moe.expert_count": 4, "qwen3moe.expert_used_count": 2,
            "qwen3moe.expert_feed_forward_length": 96, "tokenizer.ggml.tokens.count": 512}
    stacked = {"blk.0.ffn_gate_exps.weight"}
    cfg = parse_model_config(hf_config(meta, stacked, source="m.gguf"), source="m.gguf", name="m")
    assert (cfg.model_type, cfg.intermediate_size, cfg.num_local_experts,
            cfg.num_experts_per_tok, cfg.norm_topk_prob, cfg.qk_norm) == (
        "qwen3_moe", 96, 4, 2, True, True)
    q2meta = {k.replace("qwen3moe", "qwen2moe"): v for k, v in meta.items()}
    q2meta |= {"general.architecture": "qwen2moe", "qwen2moe.expert_shared_feed_forward_length": 160}
    q2 = hf_config(q2meta, stacked, source="m.gguf")
    assert (q2["model_type"], q2["shared_expert_intermediate_size"], q2["norm_topk_prob"]) == (
        "qwen2_moe", 160, False)
    for names, drop, message in [({"blk.0.ffn_gate.0.weight"}, None, "one tensor per expert"),
                                 (stacked, "qwen3moe.expert_used_count",
                                  "lacks qwen3moe.expert_used_count")]:
        bad = {k: v for k, v in meta.items() if k != drop}
        with pytest.raises(ConfigError, match=message) as e:
            hf_config(bad, names, source="m.gguf")
        assert "\n" not in str(e.value) and "m.gguf" in str(e.value)


def test_a_model_too_big_for_memory_is_refused_naming_the_formats_that_fit(tmp_path):
    """Qwen3-30B-A3B packed in fp32 is ~122 GB: with 24 GiB available, the loader refuses it in
    one line before reading a weight, naming int4-g32 (its packed bytes, computed from the
    payload's layouts with every expert stored once) as the format that fits."""
    from sandwich.payload import resident_bytes
    from sandwich.runtime.loader import check_memory

    cfg = load_model_config("qwen3-30b-a3b")
    gb = {w: resident_bytes(cfg, weights=w) / 1e9 for w in ("fp32", "int8-g32", "int4-g32")}
    assert 115 < gb["fp32"] < 125 and 15 < gb["int4-g32"] < 20  # ~30.5B parameters
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {25_000_000} kB\nMemAvailable: {24 * 2**20} kB\n")
    with pytest.raises(ConfigError, match=r"needs 12\d\.\d GB, and 25\.8 GB of memory is "
                       r"available; choose --weights int4-g32 \(18\.\d GB\)$") as e:
        check_memory(cfg, weights="fp32", meminfo=meminfo)
    assert "\n" not in str(e.value)
    check_memory(cfg, weights="int4-g32", meminfo=meminfo)  # fits: no error
    check_memory(cfg, weights="int8-g32", tp=2, meminfo=meminfo)  # a rank's share fits
    check_memory(cfg, weights="fp32", meminfo=tmp_path / "absent")  # not Linux: no check
