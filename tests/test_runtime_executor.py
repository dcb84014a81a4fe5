"""The executor on tuned GEMMs against HF transformers' LlamaForCausalLM on the same random
weights, the no-allocation decode path, batching and capacity errors (issue 6), with the
non-GEMM ops from the DSL kernels ('dsl') and from the numpy fallback ('numpy').

Kernels are tuned into a temporary cache with the `tiny` budget at seq_max=2 (every M still
runs: larger M reuse the M=2 schedule). SANDWICHC_TEST_CACHE_DIR keeps them across runs.
The GQA model has Llama-3.2-1B's layer shapes but a 2048-token vocabulary: tuning its
128256 x 2048 lm_head alone took 255 s (SANDWICHC_TEST_FULL_VOCAB=1 runs it anyway).
"""

import json
import os
import shutil
import tracemalloc

import numpy as np
import pytest
from conftest import tuned_checkpoint

from sandwich.errors import CacheError, ConfigError, ShapeError
from sandwich.runtime import KernelCache
from sandwich.runtime.executor import Executor
from sandwich.runtime.kv_cache import CapacityError
from sandwich.runtime.loader import load_model
from sandwich.runtime.safetensors_io import CheckpointError

pytestmark = pytest.mark.tvm
try:  # the reference; only the tests comparing against it need it
    import torch
    import transformers
except ImportError:
    torch = transformers = None

PROMPT = [1, 5, 9, 200, 1000, 7, 11, 13]
DECODE_STEPS = 32


def _checkpoint(tmp_path_factory, cache, name: str, **over):
    """A 2-layer random checkpoint of `name` (config fields overridden), tuned and loaded."""
    d = tuned_checkpoint(tmp_path_factory, cache, name, **over)
    hf = None
    if transformers is not None:
        hf = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return d, load_model(d, cache), hf


@pytest.fixture(scope="module")
def llama160m(tmp_path_factory, cache):
    return _checkpoint(tmp_path_factory, cache, "llama-160m")


@pytest.fixture(scope="module")
def gqa1b(tmp_path_factory, cache):
    over = {} if os.environ.get("SANDWICHC_TEST_FULL_VOCAB") else {"vocab_size": 2048, "bos_token_id": 1,
                                                                    "eos_token_id": 2}
    return _checkpoint(tmp_path_factory, cache, "llama-3.2-1b", **over)


def _rel(a, ref) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def _compare_with_hf(model, hf, ops):
    if hf is None:
        pytest.skip("transformers is not installed (pip install -e .[dev])")
    ex = Executor(model, max_batch=2, max_seq=64, max_tokens=16, ops=ops, threads=2)
    with torch.no_grad():
        r = hf(torch.tensor([PROMPT]), use_cache=True)
    slot, logits = ex.start(PROMPT)
    ref = r.logits[0, -1].numpy()
    errors = [_rel(logits, ref)]
    past, tok = r.past_key_values, int(ref.argmax())
    for _ in range(DECODE_STEPS):
        logits = ex.decode([slot], [tok])[0]
        with torch.no_grad():
            r = hf(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past, ref = r.past_key_values, r.logits[0, -1].numpy()
        errors.append(_rel(logits, ref))
        # greedy picks agree up to near-ties (random weights tie often within 1e-6)
        assert ref[int(logits.argmax())] >= ref.max() - 1e-3 * np.abs(ref).max()
        tok = int(ref.argmax())
    assert ex.kv.lens[slot] == len(PROMPT) + DECODE_STEPS
    return errors


@pytest.mark.parametrize("ops", ["numpy", "dsl"])
def test_llama160m_logits_equal_transformers(llama160m, ops):
    _, model, hf = llama160m
    assert model.config.hidden_size == 768 and model.config.intermediate_size == 3072
    errors = _compare_with_hf(model, hf, ops)
    assert len(errors) == 1 + DECODE_STEPS and max(errors) <= 1e-3, errors


@pytest.fixture(scope="module")
def odd_dims(tmp_path_factory, cache):
    return _checkpoint(tmp_path_factory, cache, "llama-160m", vocab_size=1001,
                       intermediate_size=100)


@pytest.mark.parametrize("ops", ["numpy", "dsl"])
def test_dimensions_that_are_not_whole_vectors_run(odd_dims, ops):
    """Issue 23: a vocabulary of 1001 and an FFN of 100 (gate_up N=200, down K=100) run on the
    kernels of the padded N, weights padded with zero columns, the extra outputs dropped."""
    d, model, hf = odd_dims
    cache = model.gemms.lm_head.cache
    assert (model.gemms.lm_head.n, model.gemms.lm_head.n_out) == (cache.kernel_n(1001), 1001)
    assert cache.kernel_n(1001) % cache.cpu.lanes_f32 == 0 and cache.kernel_n(1001) > 1001
    errors = _compare_with_hf(model, hf, ops)
    assert max(errors) <= 1e-3, errors


def test_gqa_llama32_1b_shape_logits_equal_transformers(gqa1b):
    _, model, hf = gqa1b
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim) == (2048, 8192, 32, 8, 64)
    assert cfg.tie_word_embeddings and model.rope.kind == "llama3" and model.rope.theta == 500000.0
    errors = _compare_with_hf(model, hf, "dsl")
    assert max(errors) <= 1e-3, errors


@pytest.mark.parametrize("ops", ["numpy", "dsl"])
def test_decode_allocates_nothing_over_100_steps(llama160m, ops):
    _, model, _ = llama160m
    ex = Executor(model, max_batch=2, max_seq=128, max_tokens=16, ops=ops, threads=2)
    slot, _ = ex.start(PROMPT)
    other, _ = ex.start(PROMPT[:3])
    before = ex.addresses()
    logits = ex.decode([slot, other], [3, 4])
    tokens = [5, 6]
    tracemalloc.start()
    for _ in range(100):
        out = ex.decode([slot, other], tokens)
        assert out.ctypes.data == logits.ctypes.data
        tokens = [int(x) for x in out.argmax(axis=1)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ex.addresses() == before
    # only the numpy fallback's small temporaries: far below one activation buffer
    assert peak < ex.buffers["logits"].nbytes // 2, peak
    assert ex.kv.lens[slot] == len(PROMPT) + 101


@pytest.mark.parametrize("ops", ["numpy", "dsl"])
def test_batched_decode_and_chunked_prefill_equal_single_runs(llama160m, ops):
    """A ragged batch (lengths 9 and 4) in one decode step; with 'dsl' that is one call of the
    DSL decode-attention kernel per layer."""
    _, model, _ = llama160m
    a, b = PROMPT, [42, 17, 99]
    one = Executor(model, max_batch=1, max_seq=32, max_tokens=3, ops=ops, threads=2)  # chunks of 3
    s, la = one.start(a)
    first_a = la.copy()
    single_a = one.decode([s], [8])[0].copy()
    both = Executor(model, max_batch=2, max_seq=32, max_tokens=16, ops=ops, threads=2)
    sa, la2 = both.start(a)
    np.testing.assert_allclose(la2, first_a, rtol=1e-4, atol=1e-5)
    sb, _ = both.start(b)
    out = both.decode([sa, sb], [8, 9])
    np.testing.assert_allclose(out[0], single_a, rtol=1e-4, atol=1e-5)
    alone = Executor(model, max_batch=1, max_seq=32)
    t, _ = alone.start(b)
    np.testing.assert_allclose(out[1], alone.decode([t], [9])[0], rtol=1e-4, atol=1e-5)


def test_decode_steps_replay_their_bound_attention(llama160m, monkeypatch):
    """A decode step's attention is bound to its buffers once per layer and batch size and
    replayed (DecodeAttention.bind): no step looks its wrapped arguments up again (three
    pointer reads, about 9 us a call), and the logits are the numpy fallback's."""
    from sandwich.runtime.dsl_attention import DecodeAttention

    _, model, _ = llama160m
    runs = {o: Executor(model, max_batch=2, max_seq=32, max_tokens=16, ops=o, threads=2)
            for o in ("dsl", "numpy")}
    slots = {o: (ex.start(PROMPT)[0], ex.start(PROMPT[:3])[0]) for o, ex in runs.items()}

    def looked_up(*args, **kwargs):
        raise AssertionError("a decode step looked its attention up again")

    for step, tokens in enumerate(([3, 4], [5, 6], [7, 8])):
        out = {o: ex.decode(list(slots[o]), tokens).copy() for o, ex in runs.items()}
        np.testing.assert_allclose(out["dsl"], out["numpy"], rtol=1e-4, atol=1e-4)
        if step == 0:  # bound on the first step; the others replay
            monkeypatch.setattr(DecodeAttention, "__call__", looked_up)


def test_decode_steps_replay_each_layers_recorded_calls(llama160m, monkeypatch):
    """A plain layer's decode step (no KV hook, all-reduce, MoE or bias between its calls)
    records its bound calls on the first step at a batch size and replays them after: no
    later step binds or looks a call up for a layer (only the head's own), and the logits
    are bit for bit those of an executor that never replays, at either batch size."""
    _, model, _ = llama160m
    runs = {r: Executor(model, max_batch=2, max_seq=32, max_tokens=16, ops="dsl", threads=2)
            for r in ("replay", "bind")}
    monkeypatch.setattr(runs["bind"], "_plain", lambda layer: False)
    slots = {r: [ex.start(PROMPT)[0], ex.start(PROMPT[:3])[0]] for r, ex in runs.items()}
    call = Executor._call

    def head_only(self, layer, site, n_tok, bind):
        if self is runs["replay"] and layer >= 0:
            raise AssertionError(f"layer {layer}'s {site} was looked up in a replayed step")
        return call(self, layer, site, n_tok, bind)

    for step, tokens in enumerate(([3, 4], [5, 6], [7, 8], [9], [10])):
        n = len(tokens)
        if step in (1, 4):  # the first step at each batch size records; the others replay
            monkeypatch.setattr(Executor, "_call", head_only)
        elif step == 3:
            monkeypatch.setattr(Executor, "_call", call)
        out = {r: ex.decode(slots[r][:n], tokens).copy() for r, ex in runs.items()}
        np.testing.assert_array_equal(out["replay"], out["bind"])
    assert len(runs["replay"]._programs) == 2 * model.config.num_hidden_layers
    assert not runs["bind"]._programs


def test_capacity_errors_leave_other_sequences_running(llama160m):
    _, model, _ = llama160m
    ex = Executor(model, max_batch=2, max_seq=12, max_tokens=8)
    with pytest.raises(CapacityError, match="prompt of 13 tokens is longer than max_seq=12"):
        ex.start(list(range(13)))
    s0, _ = ex.start(PROMPT)
    s1, _ = ex.start([4, 5])
    with pytest.raises(CapacityError, match="all 2 batch slots are in use"):
        ex.start([1, 2])
    with pytest.raises(ShapeError, match="token ids must be in"):
        ex.decode([s0], [model.config.vocab_size])
    for _ in range(4):
        ex.decode([s0, s1], [1, 2])
    with pytest.raises(CapacityError, match="beyond max_seq=12"):
        ex.decode([s0, s1], [1, 2])
    assert ex.kv.lens[s0] == 12 and ex.kv.lens[s1] == 6  # nothing written by the refused step
    ex.release(s0)
    out = ex.decode([s1], [3])
    assert out.shape == (1, model.config.vocab_size) and np.isfinite(out).all()
    s2, _ = ex.start([7])  # the freed slot serves a new request
    assert s2 == s0


def test_missing_kernels_name_the_fix(llama160m, tmp_path):
    d, model, _ = llama160m
    with pytest.raises(CacheError, match="run `sandwichc tune`"):
        load_model(d, KernelCache(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="unknown ops kind 'gpu'"):
        Executor(model, max_batch=1, max_seq=8, ops="gpu")


def test_loader_errors_come_before_any_kernel_lookup(llama160m, tmp_path):
    d, _, _ = llama160m
    empty = KernelCache(tmp_path / "empty")
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(bad, empty)
    weights.unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_model(bad, empty)
    raw = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(raw | {"model_type": "gpt_neox"}))
    with pytest.raises(ConfigError, match="not Llama-family"):
        load_model(bad, empty)


def test_dsl_ops_refuse_misaligned_buffers_and_keep_their_kernels_in_the_cache(llama160m):
    _, model, _ = llama160m
    ex = Executor(model, max_batch=1, max_seq=8, ops="dsl", threads=2)
    # norms, SiLU-mul, RoPE and both attentions are kept for the next process (ops/)
    assert len(list(model.gemms.lm_head.cache.ops_dir.glob("*.so"))) >= 5
    x = np.zeros(769, np.float32)[1:].reshape(1, 768)  # 4 bytes off any 64-byte boundary
    with pytest.raises(ShapeError, match="64-byte aligned"):
        ex.ops.rmsnorm(x, model.norm, 1e-5, out=ex.buffers["h"][:1])


@pytest.fixture(scope="module")
def small_two_thread_counts(tmp_path_factory, cache):
    """A small llama tuned for 2 threads and for 1 (prefill's and decode's counts); the
    shapes of test_plan.py's model, so the shared cache tunes them once."""
    return tuned_checkpoint(tmp_path_factory, cache, "llama-160m", tp_threads=((1, 2), (1, 1)),
                            hidden_size=128, intermediate_size=256, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=512)


def test_decode_runs_the_kernels_tuned_for_its_own_thread_count(small_two_thread_counts, cache,
                                                                monkeypatch):
    """Issue 25: with a decode thread count other than prefill's, decode steps run the kernel
    collection tuned for decode's count, prefill its own, on one copy of the packed weights."""
    d = small_two_thread_counts
    model = load_model(d, cache, threads=2, decode_threads=1)
    assert model.gemms.qkv.threads == 2 and model.decode_gemms.qkv.threads == 1
    calls = []
    for which, gemms in (("prefill", model.gemms), ("decode", model.decode_gemms)):
        for name in ("qkv", "o", "gate_up", "down", "lm_head"):
            kernel = getattr(gemms, name)
            monkeypatch.setattr(kernel, "bind", lambda *a, _b=kernel.bind, _w=which:
                                calls.append(_w) or _b(*a))
    ex = Executor(model, max_batch=2, max_seq=32, ops="numpy", threads=2)
    ref = Executor(load_model(d, cache, threads=2), max_batch=2, max_seq=32, ops="numpy", threads=2)
    prompt = [1, 5, 9, 200, 17]
    slot, first = ex.start(prompt)
    first = first.copy()  # a view of the permanent logits buffer, which decode rewrites
    assert set(calls) == {"prefill"}
    calls.clear()
    out = ex.decode([slot], [7])[0]
    layers = model.config.num_hidden_layers
    assert calls == ["decode"] * (4 * layers + 1)  # qkv, o, gate_up, down per layer; lm_head
    rslot, rfirst = ref.start(prompt)
    np.testing.assert_array_equal(first, rfirst)  # the same prefill kernels
    assert _rel(out, ref.decode([rslot], [7])[0]) < 1e-4  # other kernels, same numbers


def _phase_configs(tmp_path) -> tuple[str, str]:
    """ServiceConfig files: prefill on two CPUs with 2 threads, decode on one with 1 (the
    test is skipped on a machine with fewer CPUs)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    pre, dec = tmp_path / "pre.json", tmp_path / "dec.json"
    pre.write_text(json.dumps({"phase": "prefill", "processes": [{"cpus": cpus[:2]}],
                               "threads_per_process": 2}))
    dec.write_text(json.dumps({"phase": "decode", "processes": [{"cpus": cpus[:1]}],
                               "threads_per_process": 1}))
    return str(pre), str(dec)


def _greedy_ids(model, cache, *extra) -> list[int]:
    """`generate`'s greedy ids for a fixed prompt, in a process of its own: the phases pin
    every thread of it."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "sandwich.cli", "generate", "--model", str(model),
           "--prompt-ids", "1,5,9,200", "--max-new-tokens", "6", "--cache-dir", str(cache.dir),
           "--no-tune", "--json", "--ops", "numpy", "--threads", "2", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


def test_generate_with_per_phase_thread_counts_emits_the_same_tokens(small_two_thread_counts,
                                                                      cache, tmp_path):
    """Issue 25: `generate --prefill-config (2 threads) --decode-config (1 thread)` runs each
    phase on its own kernels and emits the greedy tokens of the one-set run."""
    pre, dec = _phase_configs(tmp_path)
    d = small_two_thread_counts
    assert _greedy_ids(d, cache, "--prefill-config", pre, "--decode-config", dec) == \
        _greedy_ids(d, cache)


def test_int_weights_run_with_per_phase_thread_counts(small_two_thread_counts, cache, tmp_path):
    """Issue 26: `--weights int8-g32` with --prefill-config (2 threads) and --decode-config
    (1 thread) loads int8 kernels for each phase's own count (tuned on first use) over one
    copy of the packed weights, and emits the greedy tokens of the one-set int8 run."""
    import argparse

    from sandwich.cli.engines import make_engine

    pre, dec = _phase_configs(tmp_path)
    d = small_two_thread_counts
    args = argparse.Namespace(model=str(d), tp=1, prefill_config=pre, decode_config=dec,
                              threads=2, ops="numpy", no_tune=False, tune_budget="tiny",
                              no_progress=True, no_warmup=True, weights="int8-g32",
                              cache_dir=str(cache.dir), env={}, env_cache_dir=None)
    model = make_engine(args, max_batch=1, max_seq=16).ex.model  # loads; pins nothing yet
    assert (model.gemms.qkv.dtype, model.gemms.qkv.threads) == ("int8-g32", 2)
    assert (model.decode_gemms.qkv.dtype, model.decode_gemms.qkv.threads) == ("int8-g32", 1)
    int8 = ("--weights", "int8-g32")
    assert _greedy_ids(d, cache, *int8, "--prefill-config", pre, "--decode-config", dec) == \
        _greedy_ids(d, cache, *int8)


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def qwen(request, tmp_path_factory, cache):
    """llama-160m's shapes (its kernels) as Qwen2 (q/k/v biases) and Qwen3 (q/k head norms)."""
    kind = request.param
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]
    d = tuned_checkpoint(tmp_path_factory, cache, "llama-160m", model_type=kind, head_dim=64,
                         architectures=[arch])
    hf = None
    if transformers is not None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        assert type(hf).__name__ == arch
    return kind, load_model(d, cache), hf


def test_qwen_logits_equal_transformers(qwen):
    """Qwen2's biases and Qwen3's head norms change every logit (the random biases are
    N(0, 0.5), the norm weights 1 + N(0, 0.1)): a model that skipped them would not match.
    DSL ops (the numpy fallback's head norm is what the DSL's is checked against at build)."""
    kind, model, hf = qwen
    layer = model.layers[0]
    if kind == "qwen2":
        assert layer.qkv_bias is not None and layer.qkv_bias.shape == (3 * 768,)
        assert layer.q_norm is None
    else:
        assert layer.qkv_bias is None and layer.q_norm.shape == layer.k_norm.shape == (64,)
    errors = _compare_with_hf(model, hf, "dsl")
    assert max(errors) <= 1e-3, errors


def test_a_bf16_kv_cache_halves_the_cache_and_keeps_the_logits(llama160m):
    """--kv-cache-dtype bf16: K/V rounded to bf16 as they are written, half the bytes. The DSL
    decode kernel (retyped to read bf16) and the numpy fallback give the same logits on the
    same rounded cache; against the f32 cache they differ by bf16's rounding only."""
    _, model, _ = llama160m
    runs = {}
    for ops, dtype in [("dsl", "f32"), ("dsl", "bf16"), ("numpy", "bf16")]:
        ex = Executor(model, max_batch=2, max_seq=64, max_tokens=16, ops=ops, threads=2, kv_dtype=dtype)
        slot, logits = ex.start(PROMPT)
        logits = logits.copy()  # (the executor's buffer: the next call writes over it)
        other, _ = ex.start(PROMPT[:3])  # a ragged batch: 2 slots of different lengths
        out = [ex.decode([slot, other], [tok, 5]).copy() for tok in (3, 7, 11, 200, 13, 1000, 17, 5)]
        runs[ops, dtype] = (np.array([logits, *(o[0] for o in out)]), ex.kv)
    f32, bf16, ref = runs["dsl", "f32"], runs["dsl", "bf16"], runs["numpy", "bf16"]
    assert bf16[1].nbytes * 2 == f32[1].nbytes and str(bf16[1].k(0).dtype) == "bfloat16"
    assert _rel(bf16[0], ref[0]) <= 1e-4  # one rounded cache, two implementations
    err = _rel(bf16[0], f32[0])
    assert 1e-6 < err <= 3e-2, err  # bf16's rounding shows, and no more than that
    with pytest.raises(ConfigError, match="KV cache type 'f16'"):
        Executor(model, max_batch=1, max_seq=8, kv_dtype="f16")
