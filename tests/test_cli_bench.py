"""`sandwichc bench gemm` end to end on a tiny tuned cache (subprocesses, as a user runs them)."""

import json

import pytest
from cli_run import one_line_error, run

from sandwich.compiler.target import detect_cpu


@pytest.mark.tvm
def test_bench_gemm_end_to_end(tmp_path, tiny_config):
    cache = tmp_path / "bench"
    missing = run("bench", "gemm", "--model", str(tiny_config), "--m", "1", "--peers", "numpy",
                  "--json", str(tmp_path / "x.json"), cache=cache)
    one_line_error(missing, "run `sandwichc tune`")  # nothing was tuned yet
    t = run("tune", "--model", str(tiny_config), "--seq-max", "2", "--budget", "tiny",
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
            # and by its best repeat, which is never slower than its median
            assert len(r[f"{name}_best_gflops_passes"]) == 2
            assert r[f"{name}_best_gflops"] == max(r[f"{name}_best_gflops_passes"])
            assert all(b >= g for b, g in zip(r[f"{name}_best_gflops_passes"],
                                               r[f"{name}_gflops_passes"], strict=True))


def test_bench_streaming_bad_arguments_are_one_line():
    """`bench streaming` refuses a row that is not decode, and a bad key, before any build."""
    key = "gemm_int8-g32_mk4x64_p1x2x1_n64_s8x64x256"
    one_line_error(run("bench", "streaming", "--schedule", key, "--n", "64", "--k", "128",
                       "--m", "16", "--threads", "2"), "decode rows only")
    one_line_error(run("bench", "streaming", "--schedule", "gemm_int8", "--n", "64", "--k", "128",
                       "--threads", "2"), "not a schedule key")
