"""Mixtral-style MoE (issue 28, item 2): logits equal HF transformers' MixtralForCausalLM on the
same random checkpoint, routing equals a numpy reference, the expert-bytes counter equals a
hand count, TP=2 (experts split by intermediate columns) equals TP=1, and malformed MoE
configs fail in one line.

The model is mixtral-small's layout shrunk (hidden 128, 4 experts, top-2, 2 layers) so its
GEMMs share four tuned shapes: expert gate_up is qkv's (256 x 128), expert down is o's.
"""

import json

import numpy as np
import pytest
from conftest import tune_model, tuned_checkpoint

from sandwich.errors import ConfigError, ShapeError
from sandwich.models import load_model_config, parse_model_config, read_raw_config
from sandwich.payload import make_payload
from sandwich.runtime.checkpoint import random_weights, write_checkpoint
from sandwich.runtime.executor import Executor
from sandwich.runtime.loader import load_model
from sandwich.runtime.moe import route
from sandwich.runtime.safetensors_io import SINGLE_NAME, Checkpoint, save_file
from sandwich.runtime.tp import TPExecutor

pytestmark = pytest.mark.tvm
try:
    import torch
    import transformers
except ImportError:
    torch = transformers = None

TINY = dict(hidden_size=128, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=4, num_experts_per_tok=2, vocab_size=512)
PROMPT = [1, 5, 9, 200, 100, 7, 11, 13]


@pytest.fixture(scope="module")
def moe(tmp_path_factory, cache):
    d = tuned_checkpoint(tmp_path_factory, cache, "mixtral-small", **TINY)
    return d, load_model(d, cache, threads=2)


def _rel(a, ref) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def test_payload_has_router_and_expert_gemms_and_dense_is_unchanged():
    cfg = load_model_config("mixtral-small")
    assert (cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size) == (8, 2, 1024)
    ops = {op.name: (op.n, op.k, op.count) for op in make_payload(cfg, tp=2).ops}
    assert ops["router"] == (8, 768, 12)
    assert ops["expert_gate_up"] == (1024, 768, 24) and ops["expert_down"] == (768, 512, 24)
    assert "gate_up" not in ops
    dense = [op.name for op in make_payload(load_model_config("llama-160m")).ops]
    assert dense == ["qkv", "o", "gate_up", "down", "lm_head"]
    assert not load_model_config("llama-160m").is_moe


@pytest.mark.parametrize("ops", ["numpy", "dsl"])
def test_logits_equal_transformers_mixtral(moe, ops):
    if transformers is None:
        pytest.skip("transformers is not installed (pip install -e .[dev])")
    d, model = moe
    names = set(Checkpoint(d).keys())  # the hub layout that MixtralForCausalLM reads and fuses
    assert {"model.layers.1.block_sparse_moe.gate.weight",
            "model.layers.1.block_sparse_moe.experts.3.w2.weight"} <= names
    hf = transformers.MixtralForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ex = Executor(model, max_batch=2, max_seq=64, max_tokens=16, ops=ops, threads=2)
    with torch.no_grad():
        r = hf(torch.tensor([PROMPT]), use_cache=True)
    slot, logits = ex.start(PROMPT)
    ref = r.logits[0, -1].numpy()
    errors, past = [_rel(logits, ref)], r.past_key_values
    for _ in range(6):
        tok = int(ref.argmax())
        assert int(logits.argmax()) == tok  # the same greedy token
        logits = ex.decode([slot], [tok])[0]
        with torch.no_grad():
            r = hf(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past, ref = r.past_key_values, r.logits[0, -1].numpy()
        errors.append(_rel(logits, ref))
    assert max(errors) <= 1e-3, errors


def test_a_mixtral_gguf_file_gives_the_same_logits(moe, tmp_path, cache):
    """llama.cpp stores a Mixtral as a llama GGUF with experts (`expert_count`, the router
    `ffn_gate_inp`, `ffn_*_exps` stacked, q/k rows permuted): read back as a Mixtral, it
    gives the safetensors model's logits."""
    import gguf

    from sandwich.bench.gguf_export import write_gguf

    d, model = moe
    path = write_gguf(d, tmp_path / "m.gguf")
    fields = gguf.GGUFReader(path).fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.expert_count"].contents() == 4
    g = load_model(path, cache, threads=2)
    assert (g.config.model_type, g.config.num_local_experts, g.config.norm_topk_prob) == (
        "mixtral", 4, True)
    want = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="numpy", threads=2)
    got = Executor(g, max_batch=1, max_seq=32, max_tokens=16, ops="numpy", threads=2)
    (s, a), (t, b) = want.start(PROMPT), got.start(PROMPT)
    assert _rel(b, a) <= 1e-5
    tok = int(a.argmax())
    assert _rel(got.decode([t], [tok])[0], want.decode([s], [tok])[0]) <= 1e-5


def _route_reference(logits, k):
    """Row by row: softmax, the k largest probabilities, renormalized."""
    ids, weights = [], []
    for row in logits.astype(np.float64):
        p = np.exp(row - row.max())
        p /= p.sum()
        top = sorted(range(len(p)), key=lambda e: -p[e])[:k]
        ids.append(top)
        weights.append(p[top] / p[top].sum())
    return np.array(ids), np.array(weights)


@pytest.mark.parametrize("experts,k", [(4, 1), (4, 2), (8, 2), (8, 8)])
def test_routing_matches_numpy_reference(experts, k):
    logits = np.random.default_rng(experts * 10 + k).standard_normal((33, experts), np.float32)
    ids, weights = route(logits, k)
    ref_ids, ref_w = _route_reference(logits, k)
    np.testing.assert_array_equal(np.sort(ids, axis=1), np.sort(ref_ids, axis=1))
    order = np.argsort(ids, axis=1)
    np.testing.assert_allclose(np.take_along_axis(weights, order, axis=1),
                               np.take_along_axis(ref_w, np.argsort(ref_ids, axis=1), axis=1),
                               rtol=1e-6)


def test_expert_bytes_equal_a_hand_count(moe, tmp_path, cache):
    _, model = moe
    experts = model.layers[0].moe.experts
    one = experts[0].gate_up.nbytes + experts[0].down.nbytes
    assert one == 4 * (128 * 256 + 128 * 128)  # both N are whole vectors: no padding
    layers = model.config.num_hidden_layers
    ex = Executor(model, max_batch=2, max_seq=64, max_tokens=64, ops="numpy", threads=2)
    assert ex.expert_bytes == 0
    slot, logits = ex.start(list(range(1, 41)))  # 40 tokens x top-2 reach all 4 experts
    assert ex.last_expert_bytes == ex.expert_bytes == layers * 4 * one
    before = ex.expert_bytes
    ex.decode([slot], [int(logits.argmax())])  # one token, top-2: two experts a layer
    assert ex.last_expert_bytes == ex.expert_bytes - before == layers * 2 * one
    dense_dir = write_checkpoint(_config(tmp_path, model_type="llama"), tmp_path / "dense")
    dense = Executor(load_model(dense_dir, cache, threads=2), max_batch=1, max_seq=8,
                     ops="numpy", threads=2)  # the dense twin shares every tuned shape
    s, _ = dense.start([1, 2, 3])
    dense.decode([s], [4])
    assert dense.moe is None and dense.expert_bytes == dense.last_expert_bytes == 0


def test_one_sequences_decode_equals_the_grouped_path_and_bind_each_swaps_experts(moe):
    """A decode step of one sequence runs its k experts at rows 0..k-1 of bound calls that
    each take whichever expert is chosen (GemmKernel.bind_each); two sequences go the grouped
    path (each expert once on its tokens, through calls bound once per row count that take
    any expert's weights: GemmKernel.bind_any). Both give the same logits for the same token."""
    _, model = moe
    single = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="dsl", threads=2)
    pair = Executor(model, max_batch=2, max_seq=32, max_tokens=16, ops="dsl", threads=2)
    s, logits = single.start(PROMPT)
    (a, _), (b, _) = pair.start(PROMPT), pair.start(PROMPT)
    for _ in range(3):
        tok = int(logits.argmax())
        logits = single.decode([s], [tok])[0].copy()
        both = pair.decode([a, b], [tok, tok])
        assert _rel(logits, both[0]) <= 1e-5 and _rel(logits, both[1]) <= 1e-5
    gemm, moe_w = model.gemms.gate_up, model.layers[0].moe
    h = np.random.default_rng(0).standard_normal((1, 128)).astype(np.float32)
    out = np.zeros((1, 256), np.float32)
    run = gemm.bind_each(h, moe_w.gate_ups, out)
    for e in (3, 0, 2, 3, 1):
        np.testing.assert_allclose(run(e), gemm(h, moe_w.experts[e].gate_up), rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError, match="not packed by this GEMM"):
        gemm.bind_each(h, [moe_w.gate_ups[0], moe_w.downs[0]], out)
    run = gemm.bind_any(h, out, moe_w.gate_ups[0])
    for w in (model.layers[1].moe.experts[2].gate_up, moe_w.experts[1].gate_up):
        np.testing.assert_allclose(run(w), gemm(h, w), rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError, match="not packed by this GEMM"):
        run(moe_w.downs[0])
    assert pair.moe._expert_calls  # the grouped path's calls, kept for the next step


def test_tp2_equals_tp1(moe, cache):
    """Each rank holds every expert's half of the intermediate columns and routes alike; the
    all-reduce after down sums the expert outputs with the rest."""
    d, model = moe
    tune_model(d, cache, tp=2, threads=1)  # one CPU per rank
    ref = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="numpy", threads=2)
    errors, _ = _tp2_errors(ref, d, cache)
    assert max(errors) <= 1e-4, errors


def _tp2_errors(ref: Executor, d, cache, weights: str = "fp32") -> tuple[list[float], np.ndarray]:
    """TP=2's logits (one CPU per rank) against `ref`'s over PROMPT and 4 greedy tokens; also
    ref's logits after the prompt."""
    tp = TPExecutor(d, cache, tp=2, max_batch=1, max_seq=32, max_tokens=16, ops="numpy",
                    cpu_sets=[[0], [1]], weights=weights)
    try:
        (s, want), (t, got) = ref.start(PROMPT), tp.start(PROMPT)
        first, errors = want.copy(), [_rel(got, want)]  # the executor reuses its logits buffer
        for _ in range(4):
            tok = int(want.argmax())
            want, got = ref.decode([s], [tok])[0], tp.decode([t], [tok])[0]
            errors.append(_rel(got, want))
    finally:
        tp.close()
    return errors, first


def test_int8_experts_pack_in_the_format_and_tp2_equals_tp1(moe, cache):
    """--weights int8 on an MoE model: every expert is packed from the checkpoint quantized
    in the format (what one process holds), in int8's bytes, the router in fp32, the logits
    stay near fp32's, and each TP rank's share of the experts' K is cut from the whole K
    quantized: int8's one scale per column is the whole column's (re-quantizing a rank's
    share gives it another scale), so TP=2 equals TP=1."""
    from sandwich.weight_formats import quantize

    d, fp32 = moe
    fmt = "int8"
    tune_model(d, cache, tp=1, threads=2, weights=fmt, seq_max=1)
    tune_model(d, cache, tp=2, threads=1, weights=fmt, seq_max=1)
    model = load_model(d, cache, threads=2, weights=fmt)
    assert model.gemms.gate_up.dtype == fmt and model.gemms.router.dtype == "float32"
    ckpt = Checkpoint(d)

    def stored(name):  # W (K, N) in the format, from the checkpoint's (N, K) float tensor
        return quantize(ckpt.get(f"model.layers.1.block_sparse_moe.{name}.weight").to_f32().T, fmt)

    w13 = np.concatenate([ckpt.get(f"model.layers.1.block_sparse_moe.experts.3.{w}.weight").to_f32()
                          for w in ("w1", "w3")])
    layer = model.layers[1].moe
    packs = [(layer.experts[3].gate_up, model.gemms.gate_up.pack(quantize(w13.T, fmt))),
             (layer.experts[3].down, model.gemms.down.pack(stored("experts.3.w2"))),
             (layer.router, model.gemms.router.pack(  # fp32, as llama.cpp keeps it
                 ckpt.get("model.layers.1.block_sparse_moe.gate.weight").to_f32().T))]
    for got, want in packs:
        for a, b in zip(got.data, want.data, strict=True):
            np.testing.assert_array_equal(a, b)
    one = model.layers[0].moe.experts[0]
    assert one.gate_up.nbytes + one.down.nbytes < 0.3 * (4 * (128 * 256 + 128 * 128))

    ex = Executor(model, max_batch=1, max_seq=32, max_tokens=16, ops="numpy", threads=2)
    errors, want = _tp2_errors(ex, d, cache, weights=fmt)
    assert max(errors) <= 1e-3, errors  # fp32 sums in another order, 8-bit activations alike
    ref = Executor(fp32, max_batch=1, max_seq=32, max_tokens=16, ops="numpy", threads=2)
    _, want32 = ref.start(PROMPT)
    assert _rel(want, want32) <= 5e-2  # 8-bit weights and activations


def _config(tmp_path, **over):
    raw, _ = read_raw_config("mixtral-small")
    path = tmp_path / f"config-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(raw | TINY | {"num_hidden_layers": 2} | over))
    return path


@pytest.mark.parametrize("over,message", [
    ({"num_experts_per_tok": 3, "num_local_experts": 2},
     "num_experts_per_tok 3 exceeds num_local_experts 2"),
    ({"num_local_experts": 0}, "'num_local_experts' must be a positive integer, got 0"),
    ({"num_experts_per_tok": "two"}, "'num_experts_per_tok' must be a positive integer"),
])
def test_malformed_moe_config_is_one_line(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_model_config(_config(tmp_path, **over))
    assert "\n" not in str(e.value)


def test_missing_expert_tensor_is_one_line(tmp_path, cache):
    d = write_checkpoint(_config(tmp_path), tmp_path / "ckpt")
    raw, source = read_raw_config(d)
    weights = random_weights(parse_model_config(raw, source=source, name="x"), seed=0)
    del weights["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(weights, d / SINGLE_NAME)
    with pytest.raises(ShapeError, match="lacks model.layers.1.block_sparse_moe.experts.2.w3"
                       ".weight; it does not match config.json") as e:
        load_model(d, cache)
    assert "\n" not in str(e.value)


def test_layered_prefill_reads_each_expert_once_per_prompt_chunked_once_per_chunk(moe):
    """Issue 28 (002 §3): a 48-token prompt touching all 4 experts, alone on the engine: chunked:8
    reads the experts again for each of its 6 chunks, layered:2 once; both give the same tokens.
    (Prefix reuse off: each schedule prefills the same prompt whole.)"""
    from sandwich.runtime.engine import Engine, Request
    from sandwich.runtime.schedule import make_schedule

    _, model = moe
    experts = model.layers[0].moe.experts
    one = experts[0].gate_up.nbytes + experts[0].down.nbytes
    layers = model.config.num_hidden_layers
    ex = Executor(model, max_batch=2, max_seq=64, max_tokens=64, ops="numpy", threads=2,
                  prefix_cache=False)
    req = Request(prompt=tuple(range(3, 51)), max_new_tokens=1)  # the first token only
    prefill_bytes, ids = {}, set()
    for text in ("sandwich", "chunked:8", "layered:2"):
        before = ex.expert_bytes
        (res,) = Engine(ex, schedule=make_schedule(text)).run([req])
        prefill_bytes[text], ids = ex.expert_bytes - before, ids | {res.ids}
    assert len(ids) == 1
    assert prefill_bytes["sandwich"] == prefill_bytes["layered:2"] == layers * 4 * one
    # six chunks: each layer's chunk of 8 tokens x top-2 reaches 3 or 4 of the 4 experts
    assert 6 * layers * 3 * one <= prefill_bytes["chunked:8"] <= 6 * layers * 4 * one
    assert prefill_bytes["chunked:8"] >= 4.5 * prefill_bytes["layered:2"]


def test_serve_bench_reports_expert_bytes_per_request(moe, cache, tmp_path, capsys):
    from sandwich.cli import main

    d, _ = moe
    out = tmp_path / "b.json"
    assert main(["serve-bench", "--model", str(d), "--cache-dir", str(cache.dir), "--ops", "numpy",
                 "--no-tune", "--plan", "off", "--schedule", "layered:2", "--trace", "synthetic",
                 "--rate", "20", "--duration", "0.2", "--prompt-mean", "12", "--output-mean", "3",
                 "--max-batch", "2", "--max-seq", "64", "--json", str(out)]) == 0
    assert "expert weights read:" in capsys.readouterr().out
    eng = json.loads(out.read_text())["engine"]
    assert eng["schedule"] == "layered:2" and eng["expert_bytes_per_request"] > 0
