"""Issue 25: the plan pipeline (topology search -> per-payload kernels -> measured choice ->
stored plan), its use by the serving commands, stale plans, and a TP change between phases
with the KV cache handed over through shared memory (greedy tokens identical)."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import tuned_checkpoint

from sandwich.models import load_model_config
from sandwich.runtime.engine import Request
from sandwich.runtime.kv_cache import KVCache
from sandwich.runtime.kv_handoff import KVHandoff
from sandwich.runtime.phase_split import PhaseSplitExecutor
from sandwich.runtime.plan import find_plan, staleness
from sandwich.runtime.plan_measure import RunnerFactory
from sandwich.runtime.planner import machine_tree
from sandwich.topology.tree import tree_hash
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.types import ProcessPlan, ServiceConfig

pytestmark = pytest.mark.tvm
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
needs_two = pytest.mark.skipif(not TWO_CPUS, reason="a TP=2 layout needs two CPUs")


def _config(phase: str, *sets) -> ServiceConfig:
    return ServiceConfig(phase=phase, processes=tuple(ProcessPlan(cpus=s, numa_node=0) for s in sets),
                         threads_per_process=len(sets[0]))


TP1 = _config("prefill", (0, 1))
TP2 = _config("prefill", (0,), (1,))
TP1_ONE = _config("decode", (0,))  # the report test's third placement


@pytest.fixture(scope="module")
def gqa(tmp_path_factory, cache):
    """A small GQA llama (2 KV heads: TP=2 gives each rank one) tuned for every payload a
    2-CPU machine's plan can pick: TP=1 x 2 threads, TP=2 x 1, TP=1 x 1."""
    return tuned_checkpoint(tmp_path_factory, cache, "llama-160m",
                            tp_threads=((1, 2), (2, 1), (1, 1)), hidden_size=128,
                            intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                            vocab_size=512)


REQS = [Request(prompt=tuple(range(5, 17)), max_new_tokens=8),
        Request(prompt=(3, 1, 4, 1, 5, 9, 2), max_new_tokens=10)]


def _ids(runner) -> list[tuple[int, ...]]:
    try:
        res = runner.engine.run(REQS)
        assert [r.error for r in res] == [None, None]
        return [r.ids for r in res]
    finally:
        runner.close()


@pytest.fixture(scope="module")
def factory(gqa, cache):
    return RunnerFactory(gqa, cache, max_seq=40, max_batch=2)


@pytest.fixture(scope="module")
def reference_ids(factory):
    """The greedy tokens of one TP=1 engine (2 threads) on REQS."""
    return _ids(factory.build(TP1, TP1))


@needs_two
@pytest.mark.parametrize("pre,dec", [(TP2, TP1), (TP1, TP2)], ids=["tp2->tp1", "tp1->tp2"])
def test_tp_change_between_phases_keeps_the_greedy_tokens(factory, reference_ids, pre, dec):
    """Prefill on one process layout, decode on another: the KV cache crosses through shared
    memory, and two concurrent requests produce the tokens of one TP=1 engine."""
    split = factory.build(pre, dec)
    assert isinstance(split.engine.ex, PhaseSplitExecutor)
    assert _ids(split) == reference_ids


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_handoff_moves_each_ranks_heads_to_the_other_layout(dtype):
    """Two prefill ranks (one KV head each) write as each layer is produced; one decode rank
    holding both heads reads the sequence back exactly, and the reverse split works too. The
    segment holds the caches' own type (bf16: half the bytes)."""
    rng = np.random.default_rng(0)
    layers, seq, heads, d = 3, 16, 2, 8
    h = KVHandoff.create(layers=layers, max_seq=seq, kv_heads=heads, head_dim=d, dtype=dtype)
    assert h.spec.nbytes == 2 * layers * seq * heads * d * (2 if dtype == "bf16" else 4)
    try:
        ranks = [KVCache(layers=layers, max_batch=1, max_seq=seq, kv_heads=1, head_dim=d, dtype=dtype)
                 for _ in range(2)]
        for r, kv in enumerate(ranks):
            slot = kv.alloc()
            write = h.writer(r, 2)
            for layer in range(layers):
                kv.kv[layer][:] = rng.standard_normal(kv.kv[layer].shape)
                write(layer, kv, [(slot, 0, 5)])  # a 5-token prompt, then a 4-token chunk
                write(layer, kv, [(slot, 5, 4)])
        whole = KVCache(layers=layers, max_batch=2, max_seq=seq, kv_heads=heads, head_dim=d, dtype=dtype)
        slot = whole.alloc()
        slot = whole.alloc()  # slot 1: the decode layout's slot need not be the prefill's
        h.read_into(whole, slot, 9, rank=0, tp=1)
        assert whole.lens[slot] == 9
        for layer in range(layers):
            want = np.concatenate([kv.kv[layer][:, :9, 0] for kv in ranks], axis=2)
            np.testing.assert_array_equal(whole.kv[layer][:, :9, slot], want)
            assert not whole.kv[layer][:, 9:, slot].any()  # nothing beyond the prompt
        back = KVCache(layers=layers, max_batch=1, max_seq=seq, kv_heads=1, head_dim=d, dtype=dtype)
        h.read_into(back, back.alloc(), 9, rank=1, tp=2)
        np.testing.assert_array_equal(back.kv[0][:, :9], ranks[1].kv[0][:, :9])
    finally:
        h.close()
    assert not os.path.exists(h.spec.path)  # the owner unlinks the segment


def _cli(*args, cache, timeout=600):
    cmd = [sys.executable, "-m", "sandwich.cli", *args, "--cache-dir", str(cache)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def planned(gqa, cache, tmp_path_factory):
    """`sandwichc tune` (plan on) of the small model into a copy of the tuned cache."""
    d = tmp_path_factory.mktemp("plancache")
    # another worker may be writing the shared cache: a kernel it is exporting (.tmp-*, renamed
    # when whole) or the database's rollback journal can vanish between listing and copying
    shutil.copytree(cache.dir, d, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".tmp-*", "*-journal"))
    p = _cli("tune", "--model", str(gqa), "--seq-max", "8", "--budget", "tiny", "--prompt-len",
             "6", "--new-tokens", "3", "--rounds", "1", "--no-calibrate", "--no-progress", cache=d)
    assert p.returncode == 0, p.stderr[-3000:]
    return d, p.stdout


@needs_two
def test_tune_stores_a_measured_plan(gqa, planned):
    d, out = planned
    cache = KernelCache(d)
    cfg = load_model_config(gqa)
    plan, path = find_plan(cache, cfg)
    assert plan is not None and path.parent == d / "plans"
    assert staleness(plan, cache, cfg, tree_hash(machine_tree())) is None
    measured = [c for c in plan.candidates if not c.runnable]
    assert len(measured) >= 2 and all(c.ttft_ms > 0 and c.tpot_ms > 0 for c in measured)
    # each candidate keeps its rounds (--rounds 1: the one round is the median)
    assert all(c.ttft_all == (round(c.ttft_ms, 3),) and len(c.tpot_all) == 1 for c in measured)
    best_pre = min(measured, key=lambda c: c.ttft_ms)
    best_dec = min(measured, key=lambda c: c.tpot_ms)
    assert plan.prefill.processes == best_pre.config.processes
    assert plan.decode.processes == best_dec.config.processes
    assert plan.measured["greedy_ids_agree"] is True
    assert "prefill:" in out and "decode:" in out
    show = subprocess.run([sys.executable, "-m", "sandwich.cli", "plan", "show", "--model", str(gqa),
                           "--cache-dir", str(d), "--json"], capture_output=True, text=True)
    assert show.returncode == 0, show.stderr
    shown = json.loads(show.stdout)
    assert shown["stale"] is None and len(shown["candidates"]) == len(plan.candidates)


@needs_two
def test_stale_plans_are_caught(gqa, planned, tmp_path):
    """A plan made for other shapes, another machine or another kernel cache is stale."""
    d, _ = planned
    cache = KernelCache(d)
    cfg = load_model_config(gqa)
    plan, _ = find_plan(cache, cfg)
    here = tree_hash(machine_tree())
    assert "machine changed" in staleness(plan, cache, cfg, "another-topology")
    other = dataclasses.replace(cfg, num_hidden_layers=3)  # same name, other shapes
    found, _ = find_plan(cache, other)
    assert found is not None and staleness(found, cache, other, here) == "the model's shapes changed"
    copy = tmp_path / "c"
    shutil.copytree(d, copy)
    c2 = KernelCache(copy)
    rec = c2.records(cfg.hidden_size, cfg.hidden_size, threads=plan.decode.threads_per_process)[0]
    c2.db.delete_records(c2.fingerprint, rec.record.n, rec.record.k, rec.record.dtype, rec.threads)
    assert "kernel cache changed" in staleness(plan, c2, cfg, here)


@needs_two
def test_generate_runs_the_plan_and_replans_a_stale_one(gqa, planned, factory, tmp_path):
    d, _ = planned
    ref = factory.build(TP1, TP1)
    try:
        (want,) = ref.engine.run([Request(prompt=(5, 6, 7, 8, 9), max_new_tokens=6)])
    finally:
        ref.close()
    args = ["generate", "--model", str(gqa), "--prompt-ids", "5,6,7,8,9", "--max-new-tokens", "6",
            "--json", "--tune-budget", "tiny"]
    on = _cli(*args, cache=d)
    assert on.returncode == 0, on.stderr
    assert tuple(json.loads(on.stdout)["ids"]) == want.ids
    copy = tmp_path / "c"
    shutil.copytree(d, copy)
    plan_file = next((copy / "plans").glob("*.json"))
    data = json.loads(plan_file.read_text())
    data["stamp"]["machine"] += "-elsewhere"
    plan_file.write_text(json.dumps(data))
    kept = _cli(*args, "--no-tune", cache=copy)
    assert kept.returncode == 0 and "stale plan (the machine changed" in kept.stderr
    assert json.loads(plan_file.read_text())["stamp"]["machine"].endswith("-elsewhere")  # unused
    again = _cli(*args, cache=copy)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "re-planning" in again.stderr
    assert tuple(json.loads(again.stdout)["ids"]) == want.ids
    assert not json.loads(plan_file.read_text())["stamp"]["machine"].endswith("-elsewhere")


@needs_two
def test_int_weights_get_a_plan_of_their_own(gqa, planned, tmp_path):
    """Issue 26: `tune --weights int8-g32` plans with int8 kernels (tuned for every payload,
    TP=2 included: each rank's share of K keeps the whole K's groups) and stores the plan
    beside the fp32 one, not over it; `generate --weights int8-g32` runs it and emits the
    greedy tokens of one TP=1 int8 engine."""
    d = tmp_path / "c"
    shutil.copytree(planned[0], d)
    cache, cfg = KernelCache(d), load_model_config(gqa)
    fp32_before = find_plan(cache, cfg)[1].read_text()
    p = _cli("tune", "--model", str(gqa), "--weights", "int8-g32", "--seq-max", "8", "--budget",
             "tiny", "--prompt-len", "6", "--new-tokens", "3", "--rounds", "1", "--no-calibrate",
             "--no-progress", cache=d)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "with int8-g32 weights" in p.stdout
    plan, path = find_plan(cache, cfg, "int8-g32")
    assert plan is not None and "-int8-g32-" in path.name and plan.setup["weights"] == "int8-g32"
    assert staleness(plan, cache, cfg, tree_hash(machine_tree())) is None
    measured = [c for c in plan.candidates if not c.runnable]
    assert any(len(c.config.processes) == 2 for c in measured)  # int8 under TP=2
    assert plan.measured["greedy_ids_agree"] is True
    assert find_plan(cache, cfg)[1].read_text() == fp32_before  # fp32's plan is its own
    int8 = RunnerFactory(gqa, cache, max_seq=40, max_batch=1, weights="int8-g32").build(TP1, TP1)
    try:
        (want,) = int8.engine.run([Request(prompt=(5, 6, 7, 8, 9), max_new_tokens=6)])
    finally:
        int8.close()
    gen = _cli("generate", "--model", str(gqa), "--weights", "int8-g32", "--prompt-ids",
               "5,6,7,8,9", "--max-new-tokens", "6", "--json", "--no-tune", cache=d)
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert tuple(json.loads(gen.stdout)["ids"]) == want.ids
    none = _cli("plan", "show", "--model", str(gqa), "--weights", "int4", cache=d)
    assert none.returncode == 1 and "no plan" in none.stderr and "with int4-g32 weights" in none.stderr


def _fake_plan(pair, singles, *, new_tokens=11):
    from sandwich.runtime.plan import Candidate, Plan, Stamp, describe

    def fig(ttft, tpot):  # three rounds; the machine is 10% slower in the second
        return {"ttft_ms": ttft, "tpot_ms": tpot, "ttft_spread": 0.1, "tpot_spread": 0.1,
                "ttft_all": [ttft, ttft * 1.1, ttft], "tpot_all": [tpot, tpot * 1.1, tpot]}

    cands = tuple(Candidate(config=c, ops=(), sim_ttft_ms=1.0 + i, sim_tpot_ms=0.1 * (3 - i),
                            ttft_ms=singles[i][0], tpot_ms=singles[i][1], ttft_spread=0.02,
                            tpot_spread=0.01) for i, c in enumerate((TP1, TP2, TP1_ONE)))
    return Plan(model="m", stamp=Stamp("a", "b", "c"), prefill=TP1, decode=TP1_ONE, candidates=cands,
                measured={"pair": fig(*pair), "greedy_ids_agree": True,
                          "singles": {describe(c): fig(*s) for c, s in zip((TP1, TP2, TP1_ONE), singles, strict=True)}},
                setup={"new_tokens": new_tokens, "top_k": 3, "calibrate": True, "budget": "tiny",
                       "seq_max": 8, "prompt_len": 6, "rounds": 2})


def test_report_checks_the_pair_against_every_single(tmp_path):
    """The report's verdict: TTFT against the best prefill single, TPOT against the best decode
    single, the gain over the best single in request latency, and whether it beats the spread."""
    from sandwich.bench.plan_report import verdict, write_report

    singles = [(10.0, 2.0), (12.0, 2.5), (15.0, 1.0)]  # TP1: fast prefill; TP1 x 1: fast decode
    plan = _fake_plan((10.1, 1.01), singles)
    v = verdict(plan)
    assert v["ttft_vs_best_prefill"] == pytest.approx(1.01) and v["ttft_within_3pct"]
    assert v["tpot_vs_best_decode"] == pytest.approx(1.01) and v["tpot_within_3pct"]
    assert v["best_single"].startswith("TP=1 x 1")  # 15 + 10 x 1.0 = 25 ms beats 10 + 10 x 2
    assert v["gain_over_best_single"] == pytest.approx(25 / 20.2 - 1)
    assert v["pair_at_least_as_good"] and v["gain_exceeds_spread"] and v["split"]
    lo, hi = v["gain_range"]
    assert lo == pytest.approx(hi)  # the slow round slowed every engine alike: paired, no spread
    slow = verdict(_fake_plan((10.5, 1.2), singles))
    assert not slow["ttft_within_3pct"] and not slow["tpot_within_3pct"]
    md, js = tmp_path / "p.md", tmp_path / "p.json"
    write_report([plan], command="sandwichc bench plan", machine="test", md=md, json_out=js)
    text = md.read_text()
    assert "| pair (the plan) | 10.10 |" in text and "within 3%" in text
    assert "faster in every round" in text
    assert json.loads(js.read_text())["plans"][0]["verdict"]["split"] is True


def test_a_candidate_stored_without_per_round_figures_loads():
    """Plans stored before candidates kept their rounds load with none; new ones round-trip."""
    from sandwich.runtime.plan import Candidate

    c = Candidate(config=ServiceConfig("prefill", (ProcessPlan((0,)),), 1), ops=("group",),
                  sim_ttft_ms=2.0, sim_tpot_ms=0.5, ttft_ms=1.0, tpot_ms=0.2, ttft_spread=0.2,
                  tpot_spread=0.5, ttft_all=(1.0, 1.2), tpot_all=(0.2, 0.3))
    d = json.loads(json.dumps(c.to_dict()))
    assert Candidate.from_dict(d) == c
    old = {k: v for k, v in d.items() if k not in ("ttft_all", "tpot_all")}
    assert Candidate.from_dict(old) == dataclasses.replace(c, ttft_all=(), tpot_all=())
