"""Two tunes of one machine side by side: another cache as a `bench gemm` peer, and `bench
caches`, which times two caches' GEMMs in interleaved rounds (issue 29's with/without figure)."""

import json
import shutil

import numpy as np
import pytest

from sandwich.bench.baselines.vendor import make_peers
from sandwich.bench.cache_ab import run_ab, write_markdown
from sandwich.errors import ConfigError, SandwichError

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
        "vocab_size": 256, "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory):
    from conftest import tune_model

    from sandwich.tuner.kernel_cache import KernelCache

    root = tmp_path_factory.mktemp("ab")
    cfg = root / "config.json"
    cfg.write_text(json.dumps(TINY))
    tune_model(cfg, KernelCache(root / "a"))
    shutil.copytree(root / "a", root / "b")  # the pairing is under test, not a second tune
    return cfg, [root / "a", root / "b"]


def test_another_cache_is_a_gemm_peer(two_caches):
    cfg, (a_dir, _) = two_caches
    [peer] = make_peers([f"cache:{a_dir}"], threads=2).peers
    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 64), dtype=np.float32)  # down's K x N
    x = rng.standard_normal((3, 128), dtype=np.float32)
    h = peer.prepare(w)
    np.testing.assert_allclose(peer.run(x, h), x @ w, rtol=1e-4, atol=1e-4)
    with pytest.raises(ConfigError, match="no kernel cache directory"):
        make_peers([f"cache:{a_dir}/missing"], threads=2)


def test_bench_caches_pairs_every_row(two_caches, tmp_path):
    cfg, (a_dir, b_dir) = two_caches
    lines = []
    # a given 64 KiB LLC: 8 copies of the tiny weights rotate, not the thousands a real LLC takes
    res = run_ab(a_dir=str(a_dir), b_dir=str(b_dir), models=[str(cfg)], ms=[1, 2], threads=2,
                 rounds=2, log=lines.append, llc=1 << 16)
    assert {(r.op, r.m) for r in res.rows} == {(op, m) for op in ("qkv", "o", "gate_up+lm_head", "down")
                                               for m in (1, 2)}
    assert all(len(r.a_gflops) == len(r.b_gflops) == 2 and r.ratio > 0 and r.rotated for r in res.rows)
    assert 0.2 < res.geomean() < 5 and len(lines) == len(res.rows)
    write_markdown(res, tmp_path / "ab.md", "sandwichc bench caches")
    assert "Geomean B / A" in (tmp_path / "ab.md").read_text()
    for bad, match in (({"b_dir": str(a_dir)}, "same cache"), ({"rounds": 0}, "--rounds")):
        with pytest.raises(ConfigError, match=match):
            run_ab(**({"a_dir": str(a_dir), "b_dir": str(b_dir), "models": [str(cfg)], "ms": [1],
                       "threads": 2, "rounds": 1} | bad))


# -- bench kernels: two versions of the family's source ------------------------------------
INT8 = "gemm_int8-g32_mk2x32_p1x2x1_n32_s4x32x64"


@pytest.mark.tvm
def test_bench_kernels_pairs_two_sources_on_each_schedule(tmp_path):
    """An edited copy of the family against the shipped one: every schedule at every M is
    checked against numpy on what it multiplies, then timed in paired rounds."""
    from sandwich.bench.kernel_ab import run_kernel_ab
    from sandwich.dsl.load import builtin_kernels

    copy = tmp_path / "gemm_family.sw"  # the edit under test: a comment
    copy.write_text("// an edited copy\n" + builtin_kernels()["gemm_family"].read_text())
    lines = []
    res = run_kernel_ab(a_src=None, b_src=str(copy), n=64, k=128, ms=[2, 16], threads=2, rounds=2,
                        schedules=[INT8, "gemm_float32_mk2x32_p1x2x1_n32_s4x32x64"],
                        log=lines.append, llc=1 << 16)
    assert [(r.op, r.m, r.rotated) for r in res.rows] == [
        (INT8, 2, True), (INT8, 16, False), ("gemm_float32_mk2x32_p1x2x1_n32_s4x32x64", 2, True),
        ("gemm_float32_mk2x32_p1x2x1_n32_s4x32x64", 16, False)]
    assert all(len(r.a_gflops) == len(r.b_gflops) == 2 and r.ratio > 0 for r in res.rows)
    assert len(lines) == 4 and res.a == "shipped"
    write_markdown(res, tmp_path / "k.md", "sandwichc bench kernels", title="Two sources")
    text = (tmp_path / "k.md").read_text()
    assert text.startswith("# Two sources") and "M <= 8" in text and "M >= 512" not in text


@pytest.mark.tvm
def test_bench_kernels_refuses_a_broken_source_and_a_wrong_schedule(tmp_path):
    """A source that does not parse, or that computes wrong products, never gets timed."""
    from sandwich.bench.kernel_ab import run_kernel_ab
    from sandwich.dsl.load import builtin_kernels

    def run(b_src, schedules=(INT8,), threads=2):
        return run_kernel_ab(a_src=None, b_src=str(b_src), n=64, k=128, ms=[2], threads=threads,
                             rounds=1, schedules=list(schedules), log=lambda _: None, llc=1 << 16)

    broken = tmp_path / "broken.sw"
    broken.write_text("kernel gemm_family( {")
    other = tmp_path / "other.sw"
    other.write_text("kernel scale(f32 x[4]) { x[0] = 1.0; }")
    source = builtin_kernels()["gemm_family"].read_text()
    wrong = tmp_path / "wrong.sw"  # the int8 products land twice
    wrong.write_text(source.replace("accg[i, j] += (bits == 6 ?", "accg[i, j] += 2.0 * (bits == 6 ?", 1))
    for path, schedules, threads, match in (
            (tmp_path / "missing.sw", (INT8,), 2, "no such kernel source"),
            (broken, (INT8,), 2, "broken.sw"), (other, (INT8,), 2, "no kernel named gemm_family"),
            (broken, ("gemm_int8",), 2, "not a schedule key"),
            (broken, (INT8,), 1, "runs on 2 threads")):
        with pytest.raises(ConfigError, match=match) as e:
            run(path, schedules, threads)
        assert "\n" not in str(e.value)
    with pytest.raises(SandwichError, match=r"B \(.*wrong\.sw\) is wrong"):
        run(wrong)
    with pytest.raises(ConfigError, match="--n and --k must be >= 1, got 0 and 128"):
        run_kernel_ab(a_src=None, b_src=str(wrong), n=0, k=128, ms=[2], threads=2, rounds=1,
                      schedules=[INT8])


# -- bench streaming: a decode GEMM against the read and its resident rate ------------------
@pytest.mark.tvm
def test_bench_streaming_times_each_round_against_the_read_and_the_resident_kernel(tmp_path):
    """Every round has a read, a streamed and (a copy fits half the LLC) a resident figure;
    the ratios are the round's own; a wrong source is refused before it is timed."""
    from sandwich.bench.kernel_stream import run_kernel_stream, write_markdown
    from sandwich.dsl.load import builtin_kernels

    def run(**kw):
        args = {"src": None, "schedules": [INT8], "n": 64, "k": 128, "ms": [1, 2], "threads": 2,
                "rounds": 2, "log": lines.append, "llc": 1 << 16, "read_bytes": 1 << 20}
        return run_kernel_stream(**(args | kw))

    lines = []
    res = run()
    assert [(r.m, len(r.read_gbs), len(r.streamed_gbs), len(r.resident_gbs)) for r in res.rows] == \
        [(1, 2, 2, 2), (2, 2, 2, 2)]
    row = res.rows[0]
    assert row.copies > 1 and row.of_read() == [s / r for s, r in zip(row.streamed_gbs, row.read_gbs, strict=True)]
    assert all(c >= f for c, f in zip(row.of_ceiling(), row.of_read(), strict=True))
    assert len(lines) == 2 and "streamed / read" in lines[0]
    write_markdown(res, tmp_path / "s.md", "sandwichc bench streaming")
    assert (tmp_path / "s.md").read_text().count("| 2 |") == 2
    assert json.dumps(res.to_json())
    # weights larger than half the LLC have no resident figure
    assert run(llc=1 << 12, ms=[1]).rows[0].resident_gbs == []
    for kw, match in (({"ms": [16]}, "decode rows only"), ({"rounds": 0}, "--rounds"),
                      ({"schedules": ["gemm_int8"]}, "not a schedule key")):
        with pytest.raises(ConfigError, match=match):
            run(**kw)
    wrong = tmp_path / "wrong.sw"
    wrong.write_text(builtin_kernels()["gemm_family"].read_text().replace(
        "accg[i, j] += (bits == 6 ?", "accg[i, j] += 2.0 * (bits == 6 ?", 1))
    with pytest.raises(SandwichError, match="is wrong"):
        run(src=str(wrong))


# -- bench schedules: several schedules of one GEMM, in any formats -------------------------
@pytest.mark.tvm
def test_bench_schedules_times_every_schedule_against_the_first_in_each_round(tmp_path):
    """fp32 and bf16 schedules of one GEMM, each checked against numpy, then timed in the same
    rounds; each ratio is its own round's; one schedule alone, or a bad key, is refused."""
    from sandwich.bench.schedule_ab import run_schedule_ab, write_markdown

    keys = ["gemm_float32_mk2x32_p1x2x1_n32_s4x32x64", "gemm_bf16_mk2x32_p1x2x1_n32_s4x32x64",
            "gemm_bf16_mk4x32_p2x1x1_n32_s4x32x128"]
    lines = []
    res = run_schedule_ab(schedules=keys, n=64, k=128, ms=[2, 16], threads=2, rounds=2,
                          log=lines.append, llc=1 << 16)
    assert [(r.m, r.rotated, len(r.gflops), [len(g) for g in r.gflops]) for r in res.rows] == \
        [(2, True, 3, [2, 2, 2]), (16, False, 3, [2, 2, 2])]
    row = res.rows[1]
    assert row.ratios(0) == [1.0, 1.0]
    assert row.ratios(2) == [b / a for a, b in zip(row.gflops[0], row.gflops[2], strict=True)]
    assert len(lines) == 2 and "x" in lines[0]
    write_markdown(res, tmp_path / "s.md", "sandwichc bench schedules")
    assert (tmp_path / "s.md").read_text().count("`gemm_bf16_mk4x32_p2x1x1_n32_s4x32x128`") == 2
    assert json.dumps(res.to_json())
    for schedules, match in (([keys[0]], "two or more --schedule"), ([keys[0], "gemm_bf16"], "not a schedule key")):
        with pytest.raises(ConfigError, match=match):
            run_schedule_ab(schedules=schedules, n=64, k=128, ms=[16], threads=2, rounds=1, llc=1 << 16)
