"""`sandwichc compare` (issue 5): M sampling, the resumable store, the JSON format and the reports."""

import json

import pytest

from sandwich.bench import compare as cmp
from sandwich.errors import ConfigError
from sandwich.types import GemmOp

OP = GemmOp("gate_up", n=256, k=64)


def _cfg(tmp_path, baselines=("metaschedule", "dietcode", "roller", "mikpoly", "vendor")):
    return cmp.CompareConfig(model="tiny.json", shapes=2, baselines=baselines, trials=8, threads=2,
                             seq_max=64, ops=("gate_up",), budget="tiny", cache_dir=tmp_path,
                             out_dir=tmp_path / "results", peers=("numpy",))


def test_sample_ms_spreads_over_the_range():
    assert cmp.sample_ms(8, 2048) == [1, 3, 9, 26, 78, 232, 689, 2048]
    assert cmp.sample_ms(2, 64) == [1, 64]
    assert cmp.sample_ms(5, 4) == [1, 2, 3, 4]  # no more shapes than M values
    with pytest.raises(ConfigError):
        cmp.sample_ms(0, 64)


def test_parse_baselines_rejects_unknown_names():
    assert cmp.parse_baselines("roller, vendor,roller") == ("roller", "vendor")
    with pytest.raises(ConfigError):
        cmp.parse_baselines("ansor")


def test_store_keeps_results_across_runs(tmp_path):
    path = tmp_path / "compare" / "x.jsonl"
    s = cmp.Store(path)
    s.put("roller", OP, 4, gflops=10.0, tune_s=1.5)
    s.put("roller", OP, 4, gflops=11.0, tune_s=2.0)  # a later line wins
    again = cmp.Store(path)
    assert again.get("roller", OP, 4)["gflops"] == 11.0
    assert again.get("roller", OP, 8) is None and again.get("dietcode", OP, 4) is None


def _filled_store(tmp_path, ms):
    s = cmp.Store(tmp_path / "s.jsonl")
    s.put("sandwich_tune", OP, total_s=64.0, covers_m=64, searched_ms=3, trials=40, wall_s_this_run=1.0)
    for m in ms:
        s.put("sandwich", OP, m, gflops=20.0 * m, tune_s=1.0)
        s.put("metaschedule", OP, m, gflops=10.0 * m, tune_s=300.0, trials=8)
        for i, name in enumerate(("dietcode", "roller", "mikpoly")):
            s.put(name, OP, m, gflops=(5.0 + i) * m, tune_s=0.01, trials=0)
        s.put("vendor", OP, m, numpy_gflops=15.0 * m, numpy_tune_s=0.0)
    return s


def test_result_json_has_the_issue_format_and_the_reports_render(tmp_path):
    cfg, ms = _cfg(tmp_path), [1, 64]
    res = cmp.result_json(cfg, [(["gate_up"], OP)], ms, _filled_store(tmp_path, ms), peer_names=["numpy"])
    assert (res["model"], res["threads"], res["trials_per_shape"]) == ("tiny", 2, 8)
    row = res["rows"][1]
    assert (row["m"], row["n"], row["k"]) == (64, 256, 64)
    for meth in ("sandwich", "metaschedule", "dietcode", "roller", "mikpoly", "numpy"):
        assert isinstance(row[f"{meth}_gflops"], float) and isinstance(row[f"{meth}_tune_s"], float)
    res["summary"] = cmp.summary(res)
    assert res["summary"]["sandwich_vs_metaschedule"] == pytest.approx(2.0)
    assert res["summary"]["roller_vs_metaschedule"] == pytest.approx(0.6)
    json.dumps(res)
    md, png = tmp_path / "c.md", tmp_path / "c.png"
    cmp.write_markdown(res, md, command="sandwichc compare ...", machine="test", date="today")
    text = md.read_text()
    assert "| gate_up | 64 | 256 x 64 | 1280.0 (2.00) | 640.0 (1.00)" in text
    assert "64.0 s in total" in text and "1.000 s per M covered" in text
    cmp.write_png(res, png)
    assert png.stat().st_size > 1000


def test_steps_match_the_work(tmp_path):
    # sandwich: tune + each M; dynamic baselines: offline + each M; the others: each M
    assert cmp.steps_per_op(_cfg(tmp_path), 2) == 3 + 2 + 3 * 3 + 2


def test_reports_without_metaschedule_normalize_to_sandwich(tmp_path):
    cfg, ms = _cfg(tmp_path, baselines=("roller",)), [1, 64]
    res = cmp.result_json(cfg, [(["gate_up"], OP)], ms, _filled_store(tmp_path, ms), peer_names=[])
    assert res["methods"] == ["sandwich", "roller"] and "metaschedule_gflops" not in res["rows"][0]
    res["summary"] = cmp.summary(res)
    assert res["summary"]["sandwich_vs_roller"] == pytest.approx(20 / 6)
    cmp.write_markdown(res, tmp_path / "c.md", command="c", machine="m", date="d")
    assert "normalized to sandwich" in (tmp_path / "c.md").read_text()
    cmp.write_png(res, tmp_path / "c.png")
