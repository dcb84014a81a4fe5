"""The `sandwichc` command line: one-line errors, concurrency, resume after SIGKILL."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from sandwich.compiler.target import detect_cpu

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
        "vocab_size": 256, "max_position_embeddings": 64}


def run(*args, cache=None, timeout=300, cwd=None):
    cmd = [sys.executable, "-m", "sandwich.cli", *args]
    if cache is not None:
        cmd += ["--cache-dir", str(cache)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "TVM_NUM_THREADS": "2"})


def _one_line_error(p, match):
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandwichc: error:"), p.stderr
    assert match in lines[0]


@pytest.fixture()
def tiny_config(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(TINY))
    return f


def test_bad_input_one_line_errors(tmp_path, tiny_config):
    _one_line_error(run("tune", "--model", "nope", cache=tmp_path / "c"), "unknown model")
    bad = tmp_path / "bad.json"
    bad.write_text("{ nope")
    _one_line_error(run("tune", "--model", str(bad), cache=tmp_path / "c"), "not valid JSON")
    _one_line_error(run("tune", "--model", str(tiny_config), "--seq-max", "0",
                        cache=tmp_path / "c"), "--seq-max must be >= 1")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "tuning.sqlite").write_bytes(b"garbage" * 200)
    _one_line_error(run("cache", "ls", cache=corrupt), "unreadable")


def test_info_prints_target():
    p = run("info", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["target"]["kind"] == "llvm" and len(d["fingerprint"]) == 16


@pytest.mark.tvm
def test_concurrent_tunes_share_a_cache(tmp_path, tiny_config):
    cache = tmp_path / "shared"
    args = [sys.executable, "-m", "sandwich.cli", "tune", "--model", str(tiny_config),
            "--seq-max", "8", "--budget", "tiny", "--no-progress", "--plan", "off", "--cache-dir", str(cache)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    v = run("cache", "verify", "--numerics", "6", "--seq-max", "8", cache=cache)
    assert v.returncode == 0 and "verified" in v.stdout, v.stdout + v.stderr


@pytest.mark.tvm
def test_sigkill_resumes_from_committed_records(tmp_path, tiny_config):
    cache = tmp_path / "killed"
    args = [sys.executable, "-m", "sandwich.cli", "tune", "--model", str(tiny_config),
            "--seq-max", "16", "--budget", "tiny", "--no-progress", "--plan", "off",
            "--cache-dir", str(cache)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = cache / "tuning.sqlite"
    committed = 0
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if db.exists():
            try:
                committed = sqlite3.connect(db, timeout=1).execute(
                    "SELECT COUNT(*) FROM records").fetchone()[0]
            except sqlite3.Error:
                continue
            if committed >= 2:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert committed >= 2
    kept = sqlite3.connect(db).execute("SELECT COUNT(*) FROM records").fetchone()[0]
    p = run("tune", "--model", str(tiny_config), "--seq-max", "16", "--budget", "tiny",
            "--no-progress", "--plan", "off", cache=cache)
    assert p.returncode == 0, p.stderr
    cached = sum(int(line.split()[4]) for line in p.stdout.splitlines()
                 if line.split() and line.split()[0] in ("qkv", "o", "gate_up+lm_head", "down"))
    assert cached >= kept
    again = run("tune", "--model", str(tiny_config), "--seq-max", "16", "--budget", "tiny",
                "--no-progress", "--plan", "off", cache=cache)
    assert again.returncode == 0
    rows = [line.split() for line in again.stdout.splitlines()
            if line.split() and line.split()[0] in ("qkv", "o", "gate_up+lm_head", "down")]
    assert len(rows) == 4 and all(r[3] == "0" for r in rows)  # nothing searched again


@pytest.mark.tvm
def test_bench_gemm_end_to_end(tmp_path, tiny_config):
    cache = tmp_path / "bench"
    t = run("tune", "--model", str(tiny_config), "--seq-max", "8", "--budget", "tiny",
            "--no-progress", "--ops", "qkv", cache=cache)
    assert t.returncode == 0, t.stderr
    missing = run("bench", "gemm", "--model", str(tiny_config), "--m", "1", "--peers", "numpy",
                  "--json", str(tmp_path / "x.json"), cache=cache)
    _one_line_error(missing, "run `sandwichc tune`")  # o, gate_up, down were never tuned
    t = run("tune", "--model", str(tiny_config), "--seq-max", "8", "--budget", "tiny",
            "--no-progress", "--plan", "off", cache=cache)
    assert t.returncode == 0, t.stderr
    b = run("bench", "gemm", "--model", str(tiny_config), "--m", "1,3,8", "--peers", "numpy",
            "--no-rotate", "--passes", "2", cache=cache, cwd=tmp_path)
    assert b.returncode == 0, b.stderr
    # issue 30, item 4: each CPU's figures under its own LLVM name, side by side
    out = tmp_path / "results" / "cpus" / detect_cpu().mcpu / "gemm_vs_vendor"
    assert all(out.with_suffix(ext).stat().st_size > 0 for ext in (".json", ".md", ".png"))
    d = json.loads(out.with_suffix(".json").read_text())
    # the bar: the machine probe, then every row x 2 runners x 2 passes, each named as it runs
    steps = 1 + len(d["rows"]) * 2 * 2
    assert f"{steps}/{steps}" in b.stderr and "pass 2/2 numpy" in b.stderr, b.stderr
    assert d["threads"] == 2 and d["peak_gflops"] > 0 and d["read_gbs"] > 0 and d["passes"] == 2
    assert {r["m"] for r in d["rows"]} == {1, 3, 8}
    assert all(r["sandwich_gflops"] > 0 and r["numpy_gflops"] > 0 for r in d["rows"])
    for r in d["rows"]:  # every runner timed once per pass, its best reported
        for name in ("sandwich", "numpy"):
            assert len(r[f"{name}_gflops_passes"]) == 2
            assert r[f"{name}_gflops"] == max(r[f"{name}_gflops_passes"])


def _main_error(capsys, argv, match):
    """In process: exit 1 and exactly one `sandwichc: error:` line naming `match`."""
    from sandwich.cli import main

    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("sandwichc: error:"), err
    assert match in err[0], err


@pytest.mark.parametrize("key, value", [("rms_norm_eps", "abc"), ("rope_theta", "x"),
                                        ("rms_norm_eps", -1e-5), ("rope_scaling", 3)])
def test_bad_config_values_are_one_line(tmp_path, capsys, key, value):
    """Issue 24, item 3: "rms_norm_eps": "abc" and "rope_theta": "x" were ValueError tracebacks."""
    f = tmp_path / "config.json"
    f.write_text(json.dumps(TINY | {key: value}))
    _main_error(capsys, ["tune", "--model", str(f), "--cache-dir", str(tmp_path / "c")], key)


def test_binary_config_and_trace_files_are_one_line(tmp_path, capsys):
    """Issue 24, item 3: a binary config.json and a non-UTF-8 trace were UnicodeDecodeErrors."""
    cfg = tmp_path / "config.json"
    cfg.write_bytes(b"\xff\xfe\x00{\x80")
    _main_error(capsys, ["tune", "--model", str(cfg), "--cache-dir", str(tmp_path / "c")],
                "not UTF-8")
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b'{"arrival_s": 0, "prompt_len": 4, "output_len": 2}\n\xff\xfe\n')
    _main_error(capsys, ["serve-bench", "--model", str(tmp_path), "--trace", str(trace)],
                "not UTF-8")


@pytest.mark.parametrize("argv, match", [
    (["tune", "--model", "llama-160m", "--threads", "-3"], "--threads must be >= 1, got -3"),
    (["tune", "--model", "llama-160m", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["generate", "--model", "llama-160m", "--prompt-ids", "1,2", "--max-seq", "0"],
     "--max-seq must be >= 1"),
    (["bench", "http", "--text", "x", "--clients", "0"], "--clients must be >= 1"),
])
def test_zero_and_negative_counts_are_refused_not_defaulted(capsys, argv, match):
    """Issue 24, item 4: --threads -3 ran "with -3 threads" and stored thr = -3; --threads 0
    and --max-seq 0 silently became defaults."""
    _main_error(capsys, argv, match)


def test_a_prompt_beyond_the_context_is_refused(tmp_path, capsys):
    """Issue 24, item 4: a prompt beyond max_position_embeddings ran without a word."""
    f = tmp_path / "config.json"
    f.write_text(json.dumps(TINY))
    _main_error(capsys, ["generate", "--model", str(tmp_path), "--prompt-ids",
                         ",".join(["1"] * 60), "--max-new-tokens", "10", "--no-tune",
                         "--cache-dir", str(tmp_path / "c")], "beyond the model's context of 64")


def test_a_seq_max_whose_buffers_do_not_fit_is_refused_before_allocating():
    """Issue 24, item 3: tune --seq-max 100000000 allocated 286 GiB."""
    from sandwich.errors import ConfigError
    from sandwich.tuner.tvm_measure import check_fits

    check_fits(768, 768, 2048, 2)
    with pytest.raises(ConfigError, match="lower --seq-max"):
        check_fits(2304, 768, 100_000_000, 2)


def test_a_mistyped_config_key_is_one_warning_line(tmp_path, capsys):
    """Issue 24, item 3: keys the parser would read, spelled almost right, are named."""
    from sandwich.cli import main

    raw = dict(TINY)
    raw["rms_norm_epsilon"] = 1e-5
    raw["architectures"] = ["LlamaForCausalLM"]  # a key HF writes and we do not read: silent
    f = tmp_path / "config.json"
    f.write_text(json.dumps(raw))
    assert main(["tune", "--model", str(f), "--ops", "nope", "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (f"sandwichc: warning: {f}: unknown key 'rms_norm_epsilon' is ignored; "
                      f"did you mean 'rms_norm_eps'?")
    assert len(err) == 2 and err[1].startswith("sandwichc: error: unknown --ops")
