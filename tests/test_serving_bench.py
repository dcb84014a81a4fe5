"""The serving benchmark's pieces that need no peer library: GGUF export (RoPE row order,
placeholder vocabulary, tensor names), timing arithmetic and the report; and every peer on
one tiny GGUF model (the peers present)."""

import importlib.util
import json

import numpy as np
import pytest

from sandwich.bench import serving as bench_serving
from sandwich.bench.serving_peers import GenTiming, _timing
from sandwich.errors import ConfigError
from sandwich.runtime.gguf_file import rope_permute

HAS_GGUF = importlib.util.find_spec("gguf") is not None


def _rope_hf(x, pos, theta=10000.0):
    """HF: rotate the two halves of the head."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = np.concatenate([pos * inv, pos * inv])
    rot = np.concatenate([-x[d // 2:], x[: d // 2]])
    return x * np.cos(ang) + rot * np.sin(ang)


def _rope_ggml(x, pos, theta=10000.0):
    """llama.cpp's normal mode: rotate adjacent pairs (2i, 2i+1)."""
    d = x.shape[-1]
    out = x.copy()
    for i in range(d // 2):
        a = pos * theta ** (-2 * i / d)
        x0, x1 = x[2 * i], x[2 * i + 1]
        out[2 * i] = x0 * np.cos(a) - x1 * np.sin(a)
        out[2 * i + 1] = x0 * np.sin(a) + x1 * np.cos(a)
    return out


def test_rope_permute_turns_hf_rope_into_ggml_rope():
    rng = np.random.default_rng(0)
    heads, d, hidden = 3, 8, 5
    w = rng.standard_normal((heads * d, hidden))
    x = rng.standard_normal(hidden)
    wp = rope_permute(w, heads)
    q_hf, q_gg = (w @ x).reshape(heads, d), (wp @ x).reshape(heads, d)
    for h in range(heads):
        # llama.cpp's RoPE on the permuted rows = the permuted rows of HF's RoPE
        want = rope_permute(_rope_hf(q_hf[h], 5).reshape(d, 1), 1).ravel()
        np.testing.assert_allclose(_rope_ggml(q_gg[h], 5), want, rtol=1e-12)
    assert sorted(wp.ravel()) == sorted(w.ravel())  # a permutation of rows, nothing else


def test_timing_ttft_and_tpot():
    t = _timing([5, 6, 7], [1.5, 1.7, 2.1], 1.0)
    assert t == GenTiming([5, 6, 7], pytest.approx(500.0), pytest.approx(300.0))
    assert _timing([5], [1.25], 1.0).tpot_ms == 0.0


def test_unknown_peer_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown serving peer"):
        bench_serving.run_serving_bench(models=["llama-160m"], prompt_lens=[4], new_tokens=2,
                                        repeats=1, threads=1, cache=None, work=tmp_path,
                                        command="x", peers=["vllm"])


def test_model_dir_for_rejects_unknown_names(tmp_path):
    with pytest.raises(ConfigError, match="not a model directory"):
        bench_serving.model_dir_for("no-such-model", tmp_path)


class _FakePeer:
    def __init__(self, name, events):
        self.name, self.events, self.calls = name, events, 0

    def generate(self, prompt, n):
        self.calls += 1
        self.events.append((self.name, len(prompt), n))
        return GenTiming(list(range(n)), 10.0 * self.calls, 1.0)

    def close(self):
        self.events.append((self.name, "close"))


def _makers(events, names=("a", "b")):
    def make(name):
        events.append((name, "load"))
        return _FakePeer(name, events)
    return {name: (lambda name=name: make(name)) for name in names}


def _time(events, resident, anchor=None, **kw):
    probes = iter(range(1, 100))

    def probe():
        events.append("probe")
        return float(next(probes))

    return bench_serving.time_peers(_makers(events, **kw), {4: [1] * 4, 16: [1] * 16}, 3,
                                    repeats=3, anchor=anchor, resident=resident,
                                    settle=lambda: None, read_probe=probe, log=lambda *_: None)


def test_time_peers_resident_loads_once_and_goes_round_robin():
    events = []
    t = _time(events, resident=True)
    first_round = [("a", "load"), ("a", 4, 2), ("a", 4, 3), ("a", 16, 2), ("a", 16, 3), "probe",
                   ("b", "load"), ("b", 4, 2), ("b", 4, 3), ("b", 16, 2), ("b", 16, 3), "probe"]
    later = [("a", 4, 3), ("a", 16, 3), "probe", ("b", 4, 3), ("b", 16, 3), "probe"]
    assert events == first_round + later * 2 + [("a", "close"), ("b", "close")]
    assert t.skipped == [] and t.paired == {}
    assert t.reads == {"a": 3.0, "b": 4.0}  # medians of (1, 3, 5), (2, 4, 6)
    # a's timed runs are its calls 2, 4, 5, 6, 7, 8 (10 ms each): medians of (20, 50, 70), (40, 60, 80)
    assert t.timed["a"][4][1] == 50.0 and t.timed["a"][16][1] == 60.0


def test_time_peers_per_round_holds_one_system_at_a_time():
    events = []
    _time(events, resident=False)
    def one(n):
        return [(n, "load"), (n, 4, 2), (n, 4, 3), (n, 16, 2), (n, 16, 3), "probe", (n, "close")]

    assert events == (one("a") + one("b")) * 3  # loaded, warmed up, timed, closed each round


def test_time_peers_pairs_every_run_with_the_anchor_alternating_order():
    events = []
    t = _time(events, resident=False, anchor="a", names=("a", "b", "c"))
    warm = [("a", "load"), ("a", 4, 2), ("a", 16, 2)]
    def paired(peer, first_anchor):
        def pair(n):
            return [("a", n, 3), (peer, n, 3)][:: 1 if first_anchor else -1]

        return [(peer, "load"), ("a", 4, 2), (peer, 4, 2), *pair(4), (peer, 16, 2), *pair(16),
                "probe", (peer, "close")]

    rounds = [paired("b", r % 2 == 0) + paired("c", r % 2 == 0) for r in range(3)]
    assert events == warm + sum(rounds, []) + [("a", "close")]  # a stays loaded throughout
    assert t.reads["a"] == 3.5 and t.reads["b"] == 3.0  # a: every probe; b: (1, 3, 5)
    # TTFT is 10 ms x the peer's call count: b is reloaded every round (its timed M=4 run is
    # its call 2), a is not (calls 4, 10, 16); TPOT is 1 ms everywhere
    assert set(t.paired) == {"b", "c"} and t.paired["b"][4] == (20 / 100, 1.0)


def test_time_peers_skips_a_system_that_cannot_load():
    events = []
    makers = _makers(events)

    def broken():
        raise ConfigError("not installed")

    makers["b"] = broken
    t = bench_serving.time_peers(makers, {4: [1] * 4}, 3, repeats=2, resident=False,
                                 settle=lambda: None, log=lambda *_: None)
    assert list(t.timed) == ["a"] and t.skipped == ["b: not installed"] and t.reads == {}


def test_weights_fit_counts_every_copy(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"0" * 1000)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:        5 kB\n")  # 5120 bytes
    assert bench_serving.weights_fit(tmp_path, 3, meminfo=meminfo)  # 4000 <= 4096
    assert not bench_serving.weights_fit(tmp_path, 4, meminfo=meminfo)  # 5000 > 4096


def test_report_lists_every_row(tmp_path):
    res = bench_serving.ServingResult("cmd", "2026-11-22", "cpu", 2, 3)
    res.rows.append(bench_serving.ServingRow("m", "sandwichc", 128, 32, 12.5, 3.25))
    res.rows.append(bench_serving.ServingRow("m", "llama.cpp", 128, 32, 20.0, 4.0, True, 27.25,
                                             1.6, 1.23))
    bench_serving.write_report(res, tmp_path / "s.md", tmp_path / "s.json")
    md = (tmp_path / "s.md").read_text()
    assert "| m | 128 | 32 | sandwichc | 12.5 | 3.25 |  |  |  |  |" in md
    assert "| m | 128 | 32 | llama.cpp | 20.0 | 4.00 | 27.2 | 1.60 | 1.23 | yes |" in md
    assert json.loads((tmp_path / "s.json").read_text())["rows"][1]["peer"] == "llama.cpp"


@pytest.mark.skipif(not HAS_GGUF, reason="gguf is not installed (pip install -e .[dev])")
def test_gguf_export_names_shapes_and_vocab(tmp_path):
    import gguf

    from sandwich.bench.gguf_export import write_gguf
    from sandwich.models import read_raw_config
    from sandwich.runtime.checkpoint import write_checkpoint

    raw, _ = read_raw_config("llama-3.2-1b")  # its vocabulary and llama3 RoPE, a narrow layer
    small = tmp_path / "config.json"  # (the whole 1B's embedding alone is a 1 GB file)
    small.write_text(json.dumps(raw | {"hidden_size": 64, "num_attention_heads": 4,
                                       "num_key_value_heads": 2, "head_dim": 16,
                                       "intermediate_size": 128}))
    cfg = json.loads((write_checkpoint(small, tmp_path / "ck", seed=1, layers=1)
                      / "config.json").read_text())
    out = write_gguf(tmp_path / "ck", tmp_path / "m.gguf")
    r = gguf.GGUFReader(str(out))
    names = {t.name: t for t in r.tensors}
    assert "blk.0.attn_q.weight" in names and "output_norm.weight" in names
    assert ("output.weight" in names) == (not cfg.get("tie_word_embeddings", False))
    d = cfg["hidden_size"] // cfg["num_attention_heads"]
    k = names["blk.0.attn_k.weight"]
    assert list(k.shape) == [cfg["hidden_size"], cfg["num_key_value_heads"] * d]  # GGUF: (in, out)
    divisors = names["rope_freqs.weight"].data  # llama3 scaling: 1 for short wavelengths, 32 for long
    assert divisors[0] == pytest.approx(1.0) and divisors[-1] == pytest.approx(cfg["rope_scaling"]["factor"])
    toks = r.fields["tokenizer.ggml.tokens"]
    assert len(toks.data) == cfg["vocab_size"]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.skipif(not HAS_GGUF, reason="gguf is not installed (pip install -e .[dev])")
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_gguf_export_reads_back_every_tensor(kind, tmp_path):
    """The F32 GGUF llama.cpp runs holds the checkpoint's tensors under the architecture's
    names (Qwen2's biases, Qwen3's head norms), llama's q/k rows permuted and only those: read
    back through the GGUF loader, every tensor equals the safetensors one."""
    import gguf

    from sandwich.bench.gguf_export import write_gguf
    from sandwich.runtime.checkpoint import tensor_shapes, write_checkpoint
    from sandwich.runtime.loader import open_checkpoint

    small = tmp_path / "config.json"
    small.write_text(json.dumps({"model_type": kind, "hidden_size": 64, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
                                 "num_hidden_layers": 2, "vocab_size": 300}))
    ck = write_checkpoint(small, tmp_path / "ck", seed=3, norm_std=0.1)
    out = write_gguf(ck, tmp_path / "m.gguf")
    assert gguf.GGUFReader(str(out)).fields["general.architecture"].contents() == kind
    cfg, _, src = open_checkpoint(ck)
    cfg2, _, back = open_checkpoint(out)
    assert (cfg2.qkv_bias, cfg2.qk_norm) == (kind == "qwen2", kind == "qwen3")
    names = tensor_shapes(cfg)
    assert any(n.endswith(".bias") for n in names) == (kind == "qwen2")
    assert any("q_norm" in n for n in names) == (kind == "qwen3")
    for name in names:
        np.testing.assert_array_equal(back.get(name).to_f32(), src.get(name).to_f32(), err_msg=name)


@pytest.mark.skipif(not HAS_GGUF, reason="gguf is not installed (pip install -e .[dev])")
def test_gguf_export_of_a_gguf_file_keeps_its_tokenizer(tmp_path):
    """`bench gguf` from a GGUF file (a Q8_0/Q4_0 mix here): the F32 file keeps every
    `tokenizer.` key of its source as stored (a gpt2 BPE vocabulary, merges, special ids),
    so the file made from it still encodes text the same way."""
    from gguf_tiny import write_tiny_gguf

    from sandwich.bench.gguf_export import write_gguf
    from sandwich.gguf_config import open_reader
    from sandwich.runtime.tokenizer import load_tokenizer

    src, _ = write_tiny_gguf(tmp_path / "tiny.gguf", vocab="gpt2")
    out = write_gguf(src, tmp_path / "f32.gguf")
    a, b = open_reader(src).fields, open_reader(out).fields
    keys = sorted(k for k in a if k.startswith("tokenizer."))
    assert "tokenizer.ggml.merges" in keys and keys == sorted(k for k in b if k.startswith("tokenizer."))
    for key in keys:
        assert a[key].contents() == b[key].contents(), key
    text = "Hello, world: 12 tokens!"
    ids = load_tokenizer(src).encode(text)
    assert load_tokenizer(out).encode(text) == ids and len(ids) > 3


@pytest.mark.tvm
@pytest.mark.parametrize("arch,kv", [("llama", "f32"), ("qwen2", "f32"), ("qwen3", "bf16")])
def test_every_peer_runs_a_gguf_model_and_emits_the_same_greedy_tokens(arch, kv, tmp_path, cache):
    """`bench serving --model X.gguf`: sandwichc, HF (gguf_file=), OpenVINO (dequantized by
    our loader) and llama.cpp (an F32 GGUF written from the same tensors) on one tiny GGUF
    with mixed quant types, of each architecture; llama.cpp only where llama-cpp-python is
    installed. With a bf16 KV cache every system keeps one (HF refuses: f32 only)."""
    from conftest import tune_model
    from gguf_tiny import write_tiny_gguf

    from sandwich.bench.serving import _make_peer, model_dir_for, weights_fit

    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", arch=arch)
    assert model_dir_for(str(path), tmp_path) == path
    assert weights_fit(path, 1) and not weights_fit(path, 10**7)
    meminfo = tmp_path / "meminfo"  # 3 fp32 copies (378 KB each) exceed 80% of 1000 kB; 3 of
    meminfo.write_text("MemTotal: 2000 kB\nMemAvailable:       1000 kB\n")  # the file (219 KB) do not
    assert not weights_fit(path, 2, meminfo=meminfo)
    assert weights_fit(path, 2, meminfo=meminfo, weights="int8-g32")
    tune_model(path, cache)
    names = ["sandwichc", "openvino"] + (["hf-transformers"] if kv == "f32" else [])
    if importlib.util.find_spec("llama_cpp") is not None:
        names.append("llama.cpp")
    prompt = [5, 9, 200, 17, 33, 100, 250, 7]
    ids = {}
    if kv != "f32":
        with pytest.raises(ConfigError, match="an f32 KV cache only"):
            _make_peer("hf-transformers", path, threads=2, max_seq=32, cache=cache, work=tmp_path,
                       kv_dtype=kv)
    for name in names:
        peer = _make_peer(name, path, threads=2, max_seq=32, cache=cache, work=tmp_path, kv_dtype=kv)
        ids[name] = peer.generate(prompt, 8).ids
        peer.close()
    assert all(v == ids["sandwichc"] for v in ids.values()), ids


def test_int_weights_skip_hf_and_formats_llama_cpp_lacks(tmp_path):
    """--weights int8-g32: HF runs fp32 only, so it is skipped with a reason; llama.cpp gets
    no type for a format it lacks (int4-g64)."""
    from sandwich.bench.serving import _make_peer

    with pytest.raises(ConfigError, match="fp32 weights only"):
        _make_peer("hf-transformers", tmp_path, threads=2, max_seq=8, cache=None, work=tmp_path,
                   weights="int8-g32")
    with pytest.raises(ConfigError, match="llama.cpp has no type for int4-g64"):
        _make_peer("llama.cpp", tmp_path / "m", threads=2, max_seq=8, cache=None,
                   work=tmp_path / "work", weights="int4-g64")
    assert not (tmp_path / "work").exists()  # refused before the F32 file is written


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                    reason="openvino is not installed (pip install -e .[bench])")
@pytest.mark.parametrize("weights", ["int8-g32", "int4-g32"])
def test_openvino_runs_int_weights(tmp_path, weights):
    """The issue's "OpenVINO with int8/int4 weight compression in the table": --weights
    int8-g32 / int4-g32 make an OpenVINO peer on those weights (no longer refused)."""
    from sandwich.bench.serving import _make_peer
    from sandwich.runtime.checkpoint import write_checkpoint

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "vocab_size": 256, "max_position_embeddings": 64}))
    path = write_checkpoint(tmp_path / "config.json", tmp_path / "ckpt", seed=3)
    peer = _make_peer("openvino", path, threads=2, max_seq=16, cache=None, work=tmp_path,
                      weights=weights)
    try:
        assert len(peer.generate([5, 9, 200, 17], 4).ids) == 4
        assert "FullyConnected" in peer.exec_layer_types()
    finally:
        peer.close()


def test_report_says_how_each_system_holds_int_weights(tmp_path):
    res = bench_serving.ServingResult("cmd", "2026-11-22", "cpu", 2, 3, weights="int4-g32")
    for peer in ("sandwichc", "openvino"):
        res.rows.append(bench_serving.ServingRow("m", peer, 128, 32, 12.5, 3.25))
    bench_serving.write_report(res, tmp_path / "s.md", tmp_path / "s.json")
    line = next(x for x in (tmp_path / "s.md").read_text().splitlines() if x.startswith("- machine"))
    assert "int4-g32 weights (sandwichc; OpenVINO: sandwichc's int values and scales" in line
    assert "llama.cpp: " not in line  # no llama.cpp row, no words on its Q4_0
    res.rows.append(bench_serving.ServingRow("m", "llama.cpp", 128, 32, 12.5, 3.25))
    bench_serving.write_report(res, tmp_path / "s.md", tmp_path / "s.json")
    text = (tmp_path / "s.md").read_text()
    assert "llama.cpp: Q4_0 made by llama.cpp's own quantizer" in text
    assert "already in int4-g32's blocks run as stored" in text  # not "dequantized to fp32"
    assert "dequantized to fp32 by each" not in text
    res.peer_builds["llama.cpp"] = "llama-cpp-python 0.3.36, built for AVX512 AVX512_VNNI"
    bench_serving.write_report(res, tmp_path / "s.md", tmp_path / "s.json")
    assert "- llama.cpp: llama-cpp-python 0.3.36, built for AVX512 AVX512_VNNI" in \
        (tmp_path / "s.md").read_text().splitlines()


def test_a_llama_cpp_that_does_not_load_is_skipped_and_names_no_build(tmp_path, monkeypatch):
    """A peer whose maker raises ConfigError (llama-cpp-python not installed, say) is skipped
    with its reason; the report names the builds of peers that ran only."""
    from sandwich.bench import serving_peers

    def absent(*a, **k):
        raise ConfigError("llama.cpp peer needs llama-cpp-python (pip install -e .[serving])")

    def sandwichc_only(makers, ids, *a, **k):
        with pytest.raises(ConfigError):
            makers["llama.cpp"]()
        return bench_serving.PeerTimings({}, {}, {}, ["llama.cpp: not installed"])

    monkeypatch.setattr(bench_serving, "_make_peer", absent)
    monkeypatch.setattr(bench_serving, "time_peers", sandwichc_only)
    monkeypatch.setattr(bench_serving, "model_dir_for", lambda m, w: tmp_path)
    monkeypatch.setattr(bench_serving, "weights_fit", lambda *a, **k: True)
    monkeypatch.setattr("sandwich.models.load_model_config",
                        lambda d: type("C", (), {"vocab_size": 100})())
    monkeypatch.setattr(serving_peers, "llama_cpp_build", absent)
    res = bench_serving.run_serving_bench(models=["m"], prompt_lens=[4], new_tokens=2, repeats=1,
                                          threads=2, cache=None, work=tmp_path, command="c",
                                          peers=("sandwichc", "llama.cpp"), log=lambda _: None)
    assert res.skipped == ["m/llama.cpp: not installed"] and res.peer_builds == {}


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python absent")
def test_the_llama_cpp_build_names_its_version_and_cpu_features():
    from sandwich.bench.serving_peers import llama_cpp_build

    line = llama_cpp_build()
    assert line.startswith("llama-cpp-python ") and ", built for " in line and "|" not in line


@pytest.mark.tvm
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (pip install -e .[serving])")
def test_llama_cpp_peer_runs_its_own_q8_0_beside_our_int8(tmp_path, cache):
    """The int8-g32 comparison: sandwichc on its int8-g32 kernels, llama.cpp on a Q8_0 GGUF
    its own quantizer made from the F32 GGUF (every tensor Q8_0); both generate."""
    import gguf
    from conftest import tune_model
    from gguf_tiny import write_tiny_gguf

    from sandwich.bench.serving import _make_peer

    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    tune_model(path, cache, weights="int8-g32")
    prompt = [5, 9, 200, 17, 33, 100, 250, 7]
    for name in ("sandwichc", "llama.cpp"):
        peer = _make_peer(name, path, threads=2, max_seq=32, cache=cache, work=tmp_path,
                          weights="int8-g32")
        assert len(peer.generate(prompt, 6).ids) == 6
        peer.close()
    q8 = gguf.GGUFReader(str(tmp_path / "tiny.q8_0.gguf"))
    matrices = [t for t in q8.tensors if len(t.shape) == 2 and t.shape[0] % 32 == 0]
    assert matrices and {t.tensor_type.name for t in matrices} == {"Q8_0"}


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (pip install -e .[serving])")
def test_llama_cpp_runs_the_file_itself_or_its_own_quantization_of_a_spec(tmp_path):
    """`--weights auto` (same_file): llama.cpp on the GGUF file as it is, nothing written; a
    spec with its own lm_head format: llama.cpp's quantizer gives every tensor the layers'
    type but the output matrix (here the tied embedding) the lm_head's."""
    import gguf
    from gguf_tiny import write_tiny_gguf

    from sandwich.bench.serving import _make_peer
    from sandwich.bench.serving_peers import llama_cpp_gguf

    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    peer = _make_peer("llama.cpp", path, threads=2, max_seq=32, cache=None, work=tmp_path / "w",
                      weights="fp32", same_file=True)
    assert len(peer.generate([5, 9, 200, 17], 4).ids) == 4
    peer.close()
    assert not (tmp_path / "w").exists()
    out = llama_cpp_gguf(path, tmp_path / "w", "int4-g32,lm_head=int8-g32", threads=2)
    assert out.name == "tiny.q4_0-out-q8_0.gguf"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors if len(t.shape) == 2}
    assert types.pop("token_embd.weight") == "Q8_0" and set(types.values()) == {"Q4_0"}, types
    res = bench_serving.ServingResult("cmd", "2026-11-28", "cpu", 2, 3, weights="int4-g32-asym",
                                      same_file=True)
    res.rows.append(bench_serving.ServingRow("m", "llama.cpp", 128, 32, 12.5, 3.25))
    bench_serving.write_report(res, tmp_path / "s.md", tmp_path / "s.json")
    text = (tmp_path / "s.md").read_text()
    assert "llama.cpp on the same file" in text and "F32 GGUF" not in text


def test_bench_gguf_writes_the_f32_file_or_llama_cpps_quantization(tmp_path, capsys):
    """`bench gguf`: the F32 GGUF bench serving gives llama.cpp (it reads back as the same
    config); with a llama.cpp type, its quantizer's file; an unknown type or a name that is
    not .gguf is one line and writes nothing."""
    import gguf
    from cli_run import TINY

    from sandwich.cli import main
    from sandwich.models import load_model_config

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY | {"vocab_size": 320}))
    from sandwich.runtime.checkpoint import write_checkpoint

    model = write_checkpoint(tmp_path / "m" / "config.json", tmp_path / "ckpt", seed=1)
    base = ["bench", "gguf", "--model", str(model), "--cache-dir", str(tmp_path / "c")]
    assert main(base + ["--out", str(tmp_path / "m.gguf")]) == 0
    assert load_model_config(str(tmp_path / "m.gguf")).hidden_size == TINY["hidden_size"]
    for bad, what in ((["--out", str(tmp_path / "x.bin")], "ends in .gguf"),
                      (["--out", str(tmp_path / "y.gguf"), "--type", "Q4_K_X"], "no file type Q4_K_X")):
        if "--type" in bad and importlib.util.find_spec("llama_cpp") is None:
            continue
        capsys.readouterr()
        assert main(base + bad) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and what in err[0], err
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["m.gguf"]
    if importlib.util.find_spec("llama_cpp") is None:
        return
    assert main(base + ["--out", str(tmp_path / "q.gguf"), "--type", "q8_0", "--pure"]) == 0
    types = {t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "q.gguf")).tensors if len(t.shape) == 2}
    assert types == {"Q8_0"} and sorted(p.name for p in tmp_path.glob("*.gguf")) == ["m.gguf", "q.gguf"]
