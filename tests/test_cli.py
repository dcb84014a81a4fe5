"""The `sandwichc` command line: one-line errors (tests/test_cli_resume.py: shared caches and
SIGKILL; tests/test_cli_bench.py: bench gemm)."""

import json

import pytest
from cli_run import TINY, one_line_error, run


def test_bad_input_one_line_errors(tmp_path, tiny_config):
    one_line_error(run("tune", "--model", "nope", cache=tmp_path / "c"), "unknown model")
    bad = tmp_path / "bad.json"
    bad.write_text("{ nope")
    one_line_error(run("tune", "--model", str(bad), cache=tmp_path / "c"), "not valid JSON")
    one_line_error(run("tune", "--model", str(tiny_config), "--seq-max", "0",
                        cache=tmp_path / "c"), "--seq-max must be >= 1")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "tuning.sqlite").write_bytes(b"garbage" * 200)
    one_line_error(run("cache", "ls", cache=corrupt), "unreadable")


def test_info_prints_target():
    p = run("info", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["target"]["kind"] == "llvm" and len(d["fingerprint"]) == 16


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


@pytest.mark.parametrize("argv, match", [
    (["serve", "--model", "llama-160m", "--port", "99999"], "a TCP port is 0-65535, got 99999"),
    (["serve", "--model", "llama-160m", "--port", "-1"], "a TCP port is 0-65535, got -1"),
    (["rpc-server", "--tracker", "127.0.0.1:9190", "--port", "x"], "expected a TCP port number"),
])
def test_a_port_out_of_range_is_argparses_one_line(capsys, argv, match):
    """`serve --port 99999` ended in socket's OverflowError and a 16-line traceback."""
    from sandwich.cli import main
    from sandwich.errors import SandwichError
    from sandwich.runtime.http_server import bind

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and match in err and "Traceback" not in err
    with pytest.raises(SandwichError, match="cannot listen on 127.0.0.1:70000"):
        bind("127.0.0.1", 70000)


def test_cache_ls_says_why_its_records_do_not_count(tmp_path, capsys):
    """Records of an older kernel source (or another CPU) are searched afresh; `cache ls`
    said only "no tuned kernels", as if the cache were empty."""
    from sandwich.cli import main
    from sandwich.tuner.kernel_cache import KernelCache
    from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization, TuneRecord

    cache = KernelCache(tmp_path)
    s = KernelSchedule(MicroKernel(2, 32), ComputeSlice(4, 32, 64), Polymerization(1, 2, 1), 32)
    cache.db.put_record(TuneRecord("an-older-key", "o", 64, 64, "float32", 1, 8, s, 10.0, 3, 0.1),
                        threads=2)
    assert main(["cache", "ls", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no tuned kernels for this target" in out and "its 1 other records" in out


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
