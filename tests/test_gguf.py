"""GGUF checkpoints and their tokenizers (issue 23), on a tiny llama GGUF written as llama.cpp's
converter writes one (tests/gguf_tiny.py): config from the metadata, weights dequantized and
un-permuted, logits against HF transformers loading the same file, the tokenizer against the
`tokenizers` BPE it was built from, and bad files as one-line errors."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from conftest import tune_model
from gguf_tiny import CONFIG, CORPUS, write_tiny_gguf

from sandwich.errors import ConfigError
from sandwich.models import load_model_config
from sandwich.runtime.gguf_file import GGUFCheckpoint, rope_permute, rope_unpermute
from sandwich.runtime.tokenizer import load_tokenizer

STRINGS = CORPUS + [
    "", " ", "a", "  two  spaces  ", "tabs\tand\nnewlines\n\n", "trailing   ", "héllo wörld",
    "日本語のテキスト 🙂👍", "numbers 1234567 and 3.14159", "x**2 + y**2 # comment",
    "don't we'll I'm they've", "a" * 60, "<|im_start|>user\nhi<|im_end|>", "\r\n\r\n",
    "MiXeD CaSe ÀÉÎ", "emoji🙂in🙂words", "    def f(self):\n        pass",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_the_tokenizer_from_gguf_encodes_as_the_bpe_it_was_written_from(tiny):
    path, trained = tiny
    tok = load_tokenizer(path)
    for s in STRINGS:
        assert tok.encode(s) == trained.encode(s).ids, s
        plain = s.replace("<|im_start|>", "").replace("<|im_end|>", "")
        assert tok.decode(tok.encode(s)) == plain, s


def test_a_sentencepiece_vocabulary_encodes_as_llama_cpp(tmp_path):
    """A llama (SentencePiece) GGUF vocabulary: pieces and scores become BPE merges, bytes
    outside the pieces fall back to <0xXX> tokens, BOS first; against the pieces' own trained
    tokenizer, and against llama.cpp where llama-cpp-python is installed."""
    path, trained = write_tiny_gguf(tmp_path / "spm.gguf", vocab="spm")
    tok = load_tokenizer(path)
    assert tok.add_bos and tok.bos_id == 1 and 2 in tok.stop_ids
    for s in STRINGS:
        ids = tok.encode(s)
        assert ids[0] == 1 and tok.decode(ids) == s, s
        # single spaces (the trained tokenizer splits words first) and no byte fallback
        if s and " ".join(s.split()) == s and all(c in "".join(CORPUS) for c in s):
            assert [tok.backend.id_to_token(i) for i in ids[1:]] == trained.encode(s).tokens, s
    assert [tok.backend.id_to_token(i) for i in tok.encode("🙂")[1:]] == \
        ["▁", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    for s in STRINGS:
        assert tok.encode(s) == ref.tokenize(s.encode(), add_bos=True, special=False), s


def test_streamed_text_equals_the_decoded_text(tiny):
    tok = load_tokenizer(tiny[0])
    for s in ("héllo 日本語 🙂", "numbers 0123456789"):
        ids = tok.encode(s)
        step = tok.stream()
        assert "".join(step(i) for i in ids) == tok.decode(ids) == s


def test_chat_template_and_stop_tokens_come_from_the_file(tiny):
    path, trained = tiny
    tok = load_tokenizer(path)
    text = tok.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    end = trained.token_to_id("<|im_end|>")
    assert tok.eos_id == end and end in tok.stop_ids and not tok.add_bos
    assert tok.encode(text)[:1] == [trained.token_to_id("<|im_start|>")]  # special stays whole


def test_config_comes_from_the_metadata(tiny):
    cfg = load_model_config(tiny[0])
    c = CONFIG
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size,
            cfg.max_position_embeddings) == (c["hidden"], c["heads"], c["kv"], c["ffn"],
                                              c["layers"], c["vocab"], c["ctx"])
    assert cfg.tie_word_embeddings and cfg.head_dim == c["hidden"] // c["heads"]


def test_rope_unpermute_undoes_llama_cpp_permutation():
    w = np.random.default_rng(0).standard_normal((6 * 8, 5)).astype(np.float32)
    assert np.array_equal(rope_unpermute(rope_permute(w, 6), 6), w)
    assert not np.array_equal(rope_permute(w, 6), w)


def test_tensors_read_under_hf_names_and_shapes(tiny):
    ckpt = GGUFCheckpoint(tiny[0])
    q = ckpt.get("model.layers.0.self_attn.q_proj.weight")
    k = ckpt.get("model.layers.1.self_attn.k_proj.weight")
    assert (q.dtype, q.shape) == ("Q8_0", (CONFIG["hidden"], CONFIG["hidden"]))
    assert (k.dtype, k.to_f32().shape) == ("F16", (CONFIG["kv"] * 16, CONFIG["hidden"]))
    assert "lm_head.weight" not in ckpt  # tied: llama.cpp writes no output.weight


@pytest.mark.tvm
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_weights_give_transformers_logits(arch, tiny, cache, tmp_path_factory):
    """llama's q/k rows come back from GGML's RoPE order, qwen2's and qwen3's are stored as
    HF has them (llama.cpp permutes llama's only); qwen2's biases and qwen3's head norms
    load from their GGUF names. Against transformers reading the same file."""
    path = tiny[0] if arch == "llama" else write_tiny_gguf(
        tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch=arch)[0]
    hf, torch = _hf_model(path)  # (the bench's loader: it gives Qwen3's head_dim, see hf_model)
    assert type(hf).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                 "qwen3": "Qwen3ForCausalLM"}[arch]
    ex = _executor(path, cache, max_seq=64, ops="dsl")
    prompt = [5, 9, 200, 17, 33, 100, 250, 7]
    with torch.no_grad():
        r = hf(torch.tensor([prompt]), use_cache=True)
    slot, logits = ex.start(prompt)
    errors, past = [], r.past_key_values
    for _ in range(4):
        ref = r.logits[0, -1].numpy()
        errors.append(float(np.abs(logits - ref).max() / np.abs(ref).max()))
        tok = int(ref.argmax())
        logits = ex.decode([slot], [tok])[0]
        with torch.no_grad():
            r = hf(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = r.past_key_values
    assert max(errors) <= 1e-4, errors


def _broken_files(good, d):
    data = good.read_bytes()
    out = {"truncated": data[: len(data) // 2], "header only": data[:200], "empty": b"",
           "not gguf": b"GGML" + data[4:]}
    paths = {}
    for name, blob in out.items():
        p = d / (name.replace(" ", "_") + ".gguf")
        p.write_bytes(blob)
        paths[name] = p
    return paths


def test_a_broken_gguf_file_is_one_clear_error(tiny, tmp_path):
    for name, p in _broken_files(tiny[0], tmp_path).items():
        with pytest.raises(ConfigError) as e:
            GGUFCheckpoint(p).get("model.layers.0.self_attn.q_proj.weight").to_f32()
        msg = str(e.value)
        assert str(p) in msg and "\n" not in msg, (name, msg)


@pytest.mark.parametrize("merges", [["hello"], ["zzqqx yyzzw"]])  # not a pair; not in the vocabulary
def test_a_damaged_vocabulary_is_one_clear_error(tiny, merges):
    """A merge list `tokenizers` cannot take fails inside it (a TypeError, a bare Exception
    with the offending token); the user gets one line naming the file, as random byte flips
    in a GGUF's tokenizer metadata showed."""
    from sandwich.gguf_config import metadata, open_reader
    from sandwich.runtime.tokenizer import from_gguf_metadata

    meta = dict(metadata(open_reader(tiny[0])))
    meta["tokenizer.ggml.merges"] = merges
    with pytest.raises(ConfigError, match="makes no tokenizer") as e:
        from_gguf_metadata(meta, source=str(tiny[0]))
    assert "\n" not in str(e.value) and str(tiny[0]) in str(e.value)


def test_another_architecture_is_refused_by_name(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ConfigError, match="architecture 'gpt2' is not supported"):
        load_model_config(path)


def test_cli_tokenize_and_broken_file(tiny, tmp_path):
    cmd = [sys.executable, "-m", "sandwich.cli", "tokenize", "--model"]
    ok = subprocess.run(cmd + [str(tiny[0]), "--text", "hello world", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert f'"ids": {tiny[1].encode("hello world").ids}' in ok.stdout
    bad = _broken_files(tiny[0], tmp_path)["truncated"]
    r = subprocess.run(cmd + [str(bad), "--text", "x"], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("sandwichc: error:"), r.stderr


@pytest.mark.tvm
def test_cli_generate_streams_text_and_stops_at_end_of_turn(tiny, cache):
    path, trained = tiny
    tune_model(path, cache)
    cmd = [sys.executable, "-m", "sandwich.cli", "generate", "--model", str(path), "--prompt",
           "hello world", "--max-new-tokens", "12", "--cache-dir", str(cache.dir)]
    js = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=300)
    assert js.returncode == 0, js.stderr
    import json

    out = json.loads(js.stdout)
    tok = load_tokenizer(path)
    assert out["text"] == tok.decode(out["ids"]) and 1 <= len(out["ids"]) <= 12
    stops = [i for i in out["ids"] if i in tok.stop_ids]
    assert stops in ([], [out["ids"][-1]])  # an end-of-turn token ends the reply
    streamed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout.rstrip("\n") == out["text"].rstrip("\n")
    chat = subprocess.run(cmd + ["--chat", "--json", "--no-prefix-cache"], capture_output=True, text=True,
                          timeout=300)
    assert chat.returncode == 0, chat.stderr
    # in process from here (the command's own process is checked above): speculation and a
    # structured reply through the same flags
    assert _generate_json(cmd[4:] + ["--speculate", "4"])["ids"] == out["ids"]  # drafts keep the tokens
    half = _generate_json(cmd[4:] + ["--kv-cache-dtype", "bf16"])  # K/V rounded: the text may differ
    assert half["text"] == tok.decode(half["ids"]) and 1 <= len(half["ids"]) <= 12
    shaped = _generate_json(cmd[4:] + ["--temperature", "1", "--regex", "[a-z]{2,4}-[0-9]"])
    import re

    assert re.fullmatch("[a-z]{2,4}-[0-9]", shaped["text"]) and shaped["ids"][-1] not in tok.stop_ids


def _generate_json(argv: list[str]) -> dict:
    """`sandwichc generate ... --json` in this process; its CPU pinning (a plan's phases)
    is undone after, as later tests need both CPUs."""
    import contextlib
    import io
    import json
    import os

    from sandwich.cli import main
    from sandwich.runtime.phases import unpin_process

    cpus = tuple(sorted(os.sched_getaffinity(0)))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            assert main(["generate", *argv, "--json"]) == 0
    finally:
        unpin_process(cpus)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("flags, says", [
    (["--regex", "[a-"], "--regex: at 1(8): invalid regex"),
    (["--json-schema", '{"type": "objectx"}'], "--json-schema: Invalid type"),
    (["--json-schema", "{nope"], "--json-schema is not JSON"),
    (["--json-schema", "/no/such/schema.json"], "--json-schema /no/such/schema.json: cannot read"),
    (["--choice", "a", "--prompt-ids", "1,2"], "needs --prompt (text)"),
    (["--speculate", "-1"], "speculation needs draft >= 0"),
])
def test_bad_generate_flags_are_one_line_before_anything_loads(tiny, tmp_path, capsys, flags, says):
    from sandwich.cli import main

    prompt = [] if "--prompt-ids" in flags else ["--prompt", "hi"]
    code = main(["generate", "--model", str(tiny[0]), *prompt, *flags, "--cache-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and says in err[0], err
    assert not any(tmp_path.iterdir())  # nothing tuned or loaded


@pytest.mark.tvm
def test_bench_prefix_prefills_only_a_turns_new_tokens_and_keeps_the_replies(tiny, cache, tmp_path):
    import json

    from sandwich.cli import main

    path, _ = tiny
    tune_model(path, cache)
    out = tmp_path / "p.json"
    argv = ["bench", "prefix", "--model", str(path), "--turns", "3", "--rounds", "2",
            "--max-new-tokens", "4", "--choices", "3", "--cache-dir", str(cache.dir),
            "--threads", "2", "--json", str(out), "--md", str(tmp_path / "p.md")]
    peer = importlib.util.find_spec("llama_cpp") is not None  # the serving extra
    assert main(argv + (["--llama-cpp", "--work", str(tmp_path)] if peer else [])) == 0
    res = json.loads(out.read_text())
    rows, many = res["rows"], res["choices"]
    # the later two of three choices copy all but the last token of the first one's prompt
    assert many["copied"] == 2 * (many["prompt_tokens"] - 1) and many["total"] == 6
    assert many["agree"] >= 5  # a sampled draw may flip on rounding, rarely
    assert [r["turn"] for r in rows] == [1, 2, 3] and all(r["same_reply"] for r in rows)
    assert rows[0]["prefilled_reuse"] == rows[0]["prompt_tokens"]  # nothing kept yet
    # a later turn finds the last prompt and reply (but its last token) in the slot
    assert all(0 < r["prefilled_reuse"] < r["prompt_tokens"] - 4 for r in rows[1:])
    assert all(r["ttft_whole_ms"] > 0 and r["ttft_reuse_ms"] > 0 for r in rows)
    if peer:  # llama.cpp on the same prompts, reset and with its context kept
        assert all(r["llama_cpp_whole_ms"] > 0 and r["llama_cpp_reuse_ms"] > 0 for r in rows)
        assert "llama.cpp kept ms" in (tmp_path / "p.md").read_text()
    assert main(argv[:4] + ["--turns", "7"]) == 1  # one line: the built-in chat has 6 turns


@pytest.mark.tvm
def test_bench_speculate_times_each_task_off_and_on_with_the_same_ids(cache, tmp_path):
    import json

    from sandwich.cli import main

    path, _ = write_tiny_gguf(tmp_path / "long.gguf", ctx=1024)  # the tasks' prompts fit
    tune_model(path, cache)
    out = tmp_path / "s.json"
    peer = importlib.util.find_spec("llama_cpp") is not None  # the serving extra
    assert main(["bench", "speculate", "--model", str(path), "--draft", "3", "--rounds", "1",
                 "--max-new-tokens", "12", "--cache-dir", str(cache.dir), "--threads", "2",
                 "--json", str(out), "--md", str(tmp_path / "s.md")]
                + (["--llama-cpp", "--work", str(tmp_path)] if peer else [])) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["task"] for r in rows] == ["proofread", "edit code", "quote", "story"]
    assert all(r["same_ids"] and r["draft"] == 3 and r["tpot_off_ms"] > 0 and r["tpot_on_ms"] > 0
               and 0 <= r["taken"] <= 1 and 0 < r["passes_per_token"] <= 1 for r in rows)
    assert "| quote | 3 |" in (tmp_path / "s.md").read_text()
    if peer:  # llama.cpp on the same prompts, a token a step and with its own lookup
        assert all(r["llama_cpp_off_ms"] > 0 and r["llama_cpp_on_ms"] > 0 for r in rows)
        assert "llama.cpp TPOT off ms" in (tmp_path / "s.md").read_text()


@pytest.mark.parametrize("flags, says", [
    (["--draft", "0"], "--draft values must be >= 1"), (["--draft", "x"], "--draft must be comma-separated"),
    (["--rounds", "0"], "--rounds must be >= 1"),
])
def test_bad_bench_speculate_flags_are_one_line_before_anything_loads(tiny, tmp_path, capsys, flags, says):
    from sandwich.cli import main

    code = main(["bench", "speculate", "--model", str(tiny[0]), "--cache-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and says in err[0], err
    assert not any(tmp_path.iterdir())  # nothing tuned or loaded


def test_perplexity_windows_and_value():
    from sandwich.runtime.perplexity import perplexity, windows

    assert windows(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert windows(9, 4) == [(0, 4), (4, 8)]  # a one-token window has nothing to score
    with pytest.raises(ConfigError):
        windows(10, 1)
    seen = []

    def uniform(w):
        seen.append(list(w))
        return np.full(len(w) - 1, -np.log(50.0))

    res = perplexity(list(range(10)), 4, uniform)
    assert res.perplexity == pytest.approx(50.0) and (res.tokens, res.windows) == (7, 3)
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.tvm
def test_scores_equal_transformers_and_cli_perplexity(tiny, cache, tmp_path):
    import json

    path = tiny[0]
    hf, torch = _hf_model(path)
    ex = _executor(path, cache, max_seq=32, ops="dsl")
    ids = load_tokenizer(path).encode(" ".join(CORPUS))[:30]
    ours = ex.score(ids)  # two chunks of max_tokens: the second continues the first
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
    ref = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    assert ours.shape == ref.shape and np.abs(ours - ref).max() < 1e-4
    assert ex.kv.in_use() == []  # the scoring slot is given back
    # echo with logprobs: the prompt prefilled and scored at once, with the likeliest tokens;
    # its last row is what a plain prefill gives
    slot, row, lps = ex.start_scored(ids, 3)
    assert [lp.token for lp in lps] == ids[1:] and np.abs(np.array([lp.logprob for lp in lps]) - ref).max() < 1e-4
    assert all([t for t, _ in lp.top] == logp[i].topk(3).indices.tolist() for i, lp in enumerate(lps))
    assert int(ex.kv.lens[slot]) == len(ids)
    row = row.copy()  # a view of the executor's logits buffer, which the next call refills
    ex.release(slot)
    plain_slot, plain = ex.start(ids)
    np.testing.assert_allclose(row, plain, rtol=1e-5, atol=1e-5)
    ex.release(plain_slot)
    text = tmp_path / "t.txt"
    text.write_text(" ".join(CORPUS * 3))
    cmd = [sys.executable, "-m", "sandwich.cli", "perplexity", "--model", str(path), "--text",
           str(text), "--ctx", "16", "--cache-dir", str(cache.dir), "--json", "--no-tune"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"perplexity", "tokens", "windows"} and out["perplexity"] > 1
    bad = subprocess.run(cmd[:-4] + ["--text", str(tmp_path / "missing.txt")], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr


def _hf_model(path):
    """HF transformers' model from the same GGUF file, in fp32, as `bench serving` and `bench
    reference` load it (skips without transformers)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    from sandwich.bench.serving_peers import hf_model

    return hf_model(path), torch


def _executor(path, cache, *, max_seq: int, ops: str):
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model

    tune_model(path, cache)
    return Executor(load_model(path, cache), max_batch=1, max_seq=max_seq, max_tokens=16,
                    ops=ops, threads=2)


@pytest.mark.tvm
def test_first_use_tunes_missing_kernels_unless_told_not_to(tiny, tmp_path):
    cmd = [sys.executable, "-m", "sandwich.cli", "generate", "--model", str(tiny[0]), "--prompt",
           "hello", "--max-new-tokens", "2", "--cache-dir", str(tmp_path / "empty"), "--json"]
    refused = subprocess.run(cmd + ["--no-tune"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "run `sandwichc tune`" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1
    tuned = subprocess.run(cmd + ["--tune-budget", "tiny"], capture_output=True, text=True,
                           timeout=600)
    assert tuned.returncode == 0, tuned.stderr
    assert "on first use" in tuned.stderr and '"text"' in tuned.stdout


@pytest.mark.tvm
def test_dsl_ops_build_for_a_two_position_cache(tiny, cache):
    """A one-token prompt with two new tokens needs max_seq = 2; the DSL ops' self-check runs
    3 tokens and used to overflow their glue buffers (found through generate)."""
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model

    tune_model(tiny[0], cache)
    ex = Executor(load_model(tiny[0], cache), max_batch=1, max_seq=2, ops="dsl", threads=2)
    slot, logits = ex.start([5])
    assert np.isfinite(ex.decode([slot], [int(logits.argmax())])).all()


@pytest.mark.tvm
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (pip install -e .[serving])")
def test_cli_perplexity_compares_with_llama_cpp_on_the_same_tokens(tiny, cache, tmp_path):
    """--compare-llama-cpp: with --weights fp32, llama.cpp scores the same windows on an F32
    GGUF of the same tensors, and the two perplexities agree to 1e-3; with the default
    (`auto`: the file's own format), llama.cpp runs the file itself (its Q8_0/Q4_0/Q4_1
    tensors through its own int8 products: near ours, not equal)."""
    import json

    path = tiny[0]
    tune_model(path, cache)
    text = tmp_path / "t.txt"
    text.write_text(" ".join(CORPUS * 3))
    cmd = [sys.executable, "-m", "sandwich.cli", "perplexity", "--model", str(path), "--text",
           str(text), "--ctx", "16", "--cache-dir", str(cache.dir), "--no-tune",
           "--compare-llama-cpp"]
    r = subprocess.run(cmd + ["--json", "--weights", "fp32"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["llama_cpp"] == pytest.approx(out["perplexity"], rel=1e-3)
    same = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert same.returncode == 0, same.stderr
    ours, theirs = same.stdout.strip().splitlines()
    assert ours.startswith(f"perplexity {out['perplexity']:.4f}")  # fp32 here too
    assert theirs.startswith("llama.cpp ") and theirs.endswith("(the same file)")
    assert float(theirs.split()[1]) == pytest.approx(out["perplexity"], rel=0.05)


def test_cli_perplexity_refuses_a_format_llama_cpp_lacks_before_running(tiny, tmp_path):
    """--compare-llama-cpp with int4-g64 (llama.cpp has no such type): one line, exit 1,
    before any kernel is tuned or any file written."""
    text = tmp_path / "t.txt"
    text.write_text(" ".join(CORPUS))
    r = subprocess.run([sys.executable, "-m", "sandwich.cli", "perplexity", "--model", str(tiny[0]),
                        "--text", str(text), "--weights", "int4-g64", "--compare-llama-cpp",
                        "--cache-dir", str(tmp_path / "cache")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "llama.cpp has no type for int4-g64" in r.stderr
    assert not (tmp_path / "cache" / "models").exists()


def test_the_view_reader_parses_what_gguf_s_reader_does(tmp_path):
    """gguf_config's reader (gguf's GGUFReader slicing a plain view of its memmap, 4x faster
    on a 152k-token header) is the one in use with this gguf package, and gives every field
    and tensor exactly as GGUFReader does."""
    import gguf

    from sandwich.gguf_config import _reader_class

    path, _ = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2")
    view = _reader_class()
    assert view is not gguf.GGUFReader  # the fast path applies to the installed gguf
    ours, theirs = view(path, "r"), gguf.GGUFReader(path, "r")
    assert list(ours.fields) == list(theirs.fields)
    for key, f in theirs.fields.items():
        assert ours.fields[key].contents() == f.contents(), key
        assert ours.fields[key].types == f.types, key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.tensor_type, a.shape.tolist(), a.data_offset) == (b.tensor_type, b.shape.tolist(), b.data_offset)
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
