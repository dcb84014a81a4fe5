"""The GEMM benchmark's summary, report writers and its run on a tiny tuned cache."""

import json

import pytest

from sandwich.bench.gemm import BenchResult, _best_rotated_pass, summarize, summarize_rotated
from sandwich.bench.gemm_report import write_markdown, write_png
from sandwich.cli.tune import numeric_ms


def _row(m, ours, best, ours_best=None):
    return {"model": "x", "op": "qkv", "m": m, "n": 64, "k": 64, "sandwich_gflops": ours,
            "sandwich_best_gflops": ours_best or ours,
            "numpy_gflops": best, "best_peer_gflops": best, "speedup_vs_best_peer": ours / best,
            "sandwich_schedule": "s"}


def test_summary_geomeans_and_peak_fraction():
    rows = [_row(1, 20.0, 10.0), _row(64, 50.0, 100.0), _row(512, 180.0, 150.0, 190.0),
            _row(1024, 160.0, 150.0, 196.0)]
    s = summarize(rows, ["numpy"], peak=200.0)
    assert s["geomean_speedup_m_le_64"] == pytest.approx((2.0 * 0.5) ** 0.5)
    assert s["geomean_speedup_all"] == pytest.approx((2.0 * 0.5 * 1.2 * 160 / 150) ** (1 / 4))
    assert s["min_fraction_of_peak_m_ge_512"] == pytest.approx(0.8)
    assert s["geomean_fraction_of_peak_m_ge_512"] == pytest.approx((0.9 * 0.8) ** 0.5)
    # the best repeats, the peak's own statistic, beside the medians
    assert s["min_best_fraction_of_peak_m_ge_512"] == pytest.approx(0.95)
    assert s["geomean_best_fraction_of_peak_m_ge_512"] == pytest.approx((0.95 * 0.98) ** 0.5)
    # and of the L1-fed register tile, where the run measured it
    t = summarize(rows, ["numpy"], peak=200.0, tile=170.0)
    assert t["geomean_fraction_of_tile_m_ge_512"] == pytest.approx((180 / 170 * 160 / 170) ** 0.5)
    assert t["min_fraction_of_tile_m_ge_512"] == pytest.approx(160 / 170)
    assert s["geomean_fraction_of_tile_m_ge_512"] == 0.0  # not measured: no figure


def test_a_run_without_small_or_large_m_rows_says_so(tmp_path):
    res = BenchResult("sandwichc bench gemm --m 512", "2026-01-01", "test cpu", 2, 200.0, 25.0,
                      ["numpy"], [], rows=[_row(512, 180.0, 150.0)])
    write_markdown(res, tmp_path / "g.md")
    text = (tmp_path / "g.md").read_text()
    assert "1.20 overall, none (no such rows) for M <= 64" in text and "0.00" not in text
    decode = BenchResult("sandwichc bench gemm --m 1", "2026-01-01", "test cpu", 2, 200.0, 25.0,
                         ["numpy"], [], rows=[_row(1, 20.0, 10.0)])
    write_markdown(decode, tmp_path / "d.md")
    text = (tmp_path / "d.md").read_text()
    assert "No rows with M >= 512" in text and "reach 0%" not in text


def test_reports_are_written(tmp_path):
    res = BenchResult("sandwichc bench gemm", "2026-01-01", "test cpu", 2, 200.0, 25.0,
                      ["numpy"], [], rows=[_row(1, 20.0, 10.0), _row(512, 180.0, 150.0)])
    res.rotated_rows.append({"model": "x", "op": "qkv", "m": 1, "n": 64, "k": 64, "copies": 4,
                             "sandwich_gbs": 20.0, "sandwich_pct_read": 80.0,
                             "numpy_gbs": 18.0, "numpy_pct_read": 72.0})
    write_markdown(res, tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "sandwichc bench gemm" in text and "| 512 |" in text and "80%" in text
    assert "| 90% | 90% |" in text and "by their best repeat" in text
    assert "register tile" not in text  # a run without the tile's figure says nothing of it
    write_png(res, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    res.tile_gflops = 170.0
    write_markdown(res, tmp_path / "t.md")
    assert "runs at 170.0 GFLOPS, 85% of that peak; the M >= 512 rows reach 106% of it" \
        in (tmp_path / "t.md").read_text()
    assert json.loads(json.dumps(res.to_json()))["threads"] == 2


def test_rotated_rows_keep_each_runners_best_share_of_its_own_read():
    """The pass with the highest share of the read measured right after it wins, not the
    pass with the most GB/s (that may just be a moment of faster DRAM)."""
    rot = {"m": 1, "sandwich_passes": [{"gbs": 30.0, "read_gbs": 40.0, "pct_read": 75.0},
                                       {"gbs": 25.0, "read_gbs": 26.0, "pct_read": 96.2}],
           "numpy_passes": [{"gbs": 20.0, "read_gbs": 30.0, "pct_read": 66.7}]}
    out = _best_rotated_pass(rot, ["sandwich", "numpy"])
    assert (out["sandwich_gbs"], out["sandwich_pct_read"]) == (25.0, 96.2)
    assert (out["numpy_gbs"], out["numpy_read_gbs"]) == (20.0, 30.0)


def test_rotated_summary_counts_rows_at_the_target_per_runner_and_m():
    def passes(*pcts):
        return [{"pct_read": p} for p in pcts]

    rows = [{"m": 1, "sandwich_pct_read": 95.0, "numpy_pct_read": 91.0,
             "sandwich_passes": passes(95.0, 80.0)},
            {"m": 8, "sandwich_pct_read": 89.9, "numpy_pct_read": 40.0,
             "sandwich_passes": passes(89.9, 70.0)},
            {"m": 8, "sandwich_pct_read": 90.0, "numpy_pct_read": 50.0,
             "sandwich_passes": passes(85.0, 90.0)}]
    rs = summarize_rotated(rows, ["sandwich", "numpy"])
    ours, numpy = rs["runners"]["sandwich"], rs["runners"]["numpy"]
    assert (ours["at_target"], ours["rows"], ours["min_pct_read"]) == (2, 3, 89.9)
    assert ours["per_m"] == {"1": [1, 1], "8": [1, 2]}
    assert ours["at_target_each_pass"] == [1, 1]  # neither pass alone reaches the best-of 2
    assert (numpy["at_target"], numpy["per_m"]["8"]) == (1, [0, 2])
    assert numpy["at_target_each_pass"] == []


def test_numeric_ms_include_one_and_primes():
    ms = numeric_ms(20, 2048)
    assert len(ms) == 20 and ms[0] == 1 and all(1 <= m <= 2048 for m in ms)
    primes = [m for m in ms if m > 1 and all(m % d for d in range(2, int(m ** 0.5) + 1))]
    assert len(primes) >= 5


def test_unnamed_report_outputs_go_beside_the_named_one_not_into_results():
    from sandwich.cli.bench import report_paths

    base = "results/cpus/x/gemm_vs_vendor"
    assert report_paths(None, None, None, base) == (f"{base}.json", f"{base}.md", f"{base}.png")
    assert report_paths("/tmp/a/g.json", None, None, base) == ("/tmp/a/g.json", "/tmp/a/g.md", "/tmp/a/g.png")
    assert report_paths(None, "/tmp/b.md", None, base) == ("/tmp/b.json", "/tmp/b.md", "/tmp/b.png")
    assert report_paths("/tmp/a/g.json", "/tmp/m.md", "/tmp/p.png", base) == \
        ("/tmp/a/g.json", "/tmp/m.md", "/tmp/p.png")
