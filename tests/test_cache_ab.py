"""Two tunes of one machine side by side: another cache as a `bench gemm` peer, and `bench
caches`, which times two caches' GEMMs in interleaved rounds (issue 29's with/without figure)."""

import json
import shutil

import numpy as np
import pytest

from sandwich.bench.baselines.vendor import make_peers
from sandwich.bench.cache_ab import run_ab, write_markdown
from sandwich.errors import ConfigError

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
