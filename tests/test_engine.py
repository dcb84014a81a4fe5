"""The serving engine (issue 6): continuous batching against single runs, sampling seeds, stop
tokens, bad requests, the phase switcher, traces, serve-bench statistics and the CLI.

Kernels are tuned into a temporary cache with the `tiny` budget at seq_max=2, as in
test_runtime_executor.py; SANDWICHC_TEST_CACHE_DIR keeps them across runs. The tests marked
`tvm` use the tuned model; the others use a fake executor, fake clocks or hand-made inputs.
"""

import json
import math
import os

import numpy as np
import pytest
from conftest import tuned_checkpoint
from engine_fakes import FakeExecutor

from sandwich.cli import main
from sandwich.errors import ConfigError
from sandwich.runtime.engine import Engine, Request, Result
from sandwich.runtime.executor import Executor
from sandwich.runtime.loader import load_model
from sandwich.runtime.phases import PhasePlan, PhaseSwitcher, load_service_config
from sandwich.runtime.sampling import Sampler, SamplingParams
from sandwich.runtime.serve_bench import (
    TABLE_VI,
    Baseline,
    alone_baselines,
    find_goodput,
    percentiles,
    records,
    replay,
    slowdowns,
    summarize,
)
from sandwich.runtime.traces import TraceError, read_trace, synthetic_trace
from sandwich.types import ProcessPlan, ServiceConfig

PROMPTS = [[1, 5, 9, 200, 1000, 7], [42, 17, 99], [300, 301, 302, 303, 304, 305, 306, 307, 8], [11]]
TIE = 1e-4  # greedy picks may differ only where the top two logits are this close (relative)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, cache):
    """(model dir, cache dir, loaded model): a 2-layer llama-160m with tiny-budget kernels."""
    d = tuned_checkpoint(tmp_path_factory, cache, "llama-160m")
    return d, cache.dir, load_model(d, cache)


@pytest.fixture(scope="module")
def ex(tuned):
    return Executor(tuned[2], max_batch=3, max_seq=32, max_tokens=16, ops="dsl", threads=2)


def _alone(ex, prompt, n):
    """Greedy ids of one request run alone, and each step's top-1/top-2 logit gap (relative)."""
    slot, row = ex.start(prompt)
    ids, gaps = [], []
    for _ in range(n):
        top2 = np.sort(row)[-2:]
        ids.append(int(row.argmax()))
        gaps.append(float((top2[1] - top2[0]) / np.abs(row).max()))
        if len(ids) < n:
            row = ex.decode([slot], [ids[-1]])[0]
    ex.release(slot)
    return ids, gaps


def _assert_same_greedy(got, ref, gaps):
    """Equal ids, except that a near-tie in the single run may break either way."""
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        if g != r:
            assert gaps[i] < TIE, (i, got, ref)
            return


@pytest.mark.tvm
def test_continuous_batching_equals_single_runs(ex):
    engine = Engine(ex)
    news = [7, 4, 6, 5]
    tickets = [engine.submit(Request(prompt=tuple(PROMPTS[0]), max_new_tokens=news[0]))]
    done = engine.step() + engine.step()  # A runs alone for two steps
    tickets.append(engine.submit(Request(prompt=tuple(PROMPTS[1]), max_new_tokens=news[1])))
    done += engine.step()
    assert engine.running == 2
    for p, n in zip(PROMPTS[2:], news[2:], strict=True):  # D waits for a slot (max_batch=3)
        tickets.append(engine.submit(Request(prompt=tuple(p), max_new_tokens=n)))
    while engine.busy:
        done += engine.step()
    by_ticket = {r.ticket: r for r in done}
    assert engine.stats.max_running == 3 and engine.stats.prefills == 4 and ex.kv.in_use() == []
    for t, p, n in zip(tickets, PROMPTS, news, strict=True):
        res = by_ticket[t]
        assert res.finish == "length" and len(res.ids) == n and res.error is None
        assert res.ttft_ms > 0 and res.tpot_ms > 0 and res.finish_s > res.arrival_s
        _assert_same_greedy(list(res.ids), *_alone(ex, p, n))
    assert engine.stats.phase_switches >= 7  # prefill/decode alternate on every admission step


@pytest.mark.tvm
def test_sampling_is_reproducible_from_the_seed(ex):
    def sample(seed, companion=None, **kw):
        reqs = [Request(prompt=(1, 2, 3), max_new_tokens=6, temperature=0.9, seed=seed, **kw)]
        if companion:
            reqs.append(Request(prompt=tuple(companion), max_new_tokens=3))
        return Engine(ex).run(reqs)[0].ids

    a = sample(5)
    assert sample(5, companion=PROMPTS[0]) == a  # batching does not change a seeded stream
    assert sample(6) != a
    assert sample(5, top_k=20, top_p=0.9) == sample(5, top_k=20, top_p=0.9, companion=[4])
    greedy = Engine(ex).run([Request(prompt=(1, 2, 3), max_new_tokens=6)])[0].ids
    assert greedy != a


def test_any_integer_seed_is_reproducible():
    """OpenAI clients send int64 seeds, negative ones too; numpy takes only seeds >= 0, so a
    negative seed draws as its 64-bit two's complement (before, -1 raised on the engine's
    thread and stopped the server for everyone)."""
    row = np.linspace(0.0, 1.0, 50).astype(np.float32)

    def draws(seed):
        sampler = Sampler(SamplingParams(3.0, seed=seed))
        return [sampler(row) for _ in range(30)]

    assert draws(-1) == draws(-1) == draws((1 << 64) - 1) != draws(1)
    assert draws(-(10 ** 30)) == draws(-(10 ** 30)) and draws(1 << 70) == draws(1 << 70)


def test_sampler_cuts_on_a_known_row():
    row = np.array([0.0, 3.0, 1.0, 2.9, -5.0], np.float32)
    assert Sampler(SamplingParams())(row) == 1
    assert {Sampler(SamplingParams(1.0, top_k=1, seed=s))(row) for s in range(20)} == {1}
    assert {Sampler(SamplingParams(1.0, top_p=0.05, seed=s))(row) for s in range(20)} == {1}
    picks = {Sampler(SamplingParams(1.0, top_k=2, seed=s))(row) for s in range(40)}
    assert picks == {1, 3}
    assert {Sampler(SamplingParams(5.0, seed=s))(row) for s in range(200)} == {0, 1, 2, 3, 4}
    with pytest.raises(ConfigError, match="top_p must be in"):
        Sampler(SamplingParams(1.0, top_p=0.0))


@pytest.mark.tvm
def test_stop_tokens_stop(ex):
    ids, _ = _alone(ex, PROMPTS[0], 6)
    stop = ids[3]
    res = Engine(ex).run([Request(prompt=tuple(PROMPTS[0]), max_new_tokens=6, stop=(stop,))])[0]
    assert res.finish == "stop" and res.ids == tuple(ids[: ids.index(stop) + 1])


@pytest.mark.tvm
def test_bad_requests_get_errors_and_the_others_finish(ex):
    engine = Engine(ex)
    vocab = ex.cfg.vocab_size
    reqs = [Request(prompt=tuple(PROMPTS[0]), max_new_tokens=4),
            Request(prompt=tuple(range(33)), max_new_tokens=2),
            Request(prompt=(), max_new_tokens=2),
            Request(prompt=(1, vocab), max_new_tokens=2),
            Request(prompt=(1, 2), max_new_tokens=0),
            Request(prompt=(1,) * 30, max_new_tokens=4),
            Request(prompt=(1, 2), max_new_tokens=2, temperature=-1.0),
            Request(prompt=(1, 2), max_new_tokens=2, stop=(3, vocab + 5)),
            Request(prompt=tuple(PROMPTS[1]), max_new_tokens=5)]
    res = engine.run(reqs)
    assert [r.finish for r in res] == ["length"] + ["error"] * 7 + ["length"]
    assert "prompt of 33 tokens is longer than max_seq=32" in res[1].error
    assert "empty prompt" in res[2].error
    assert f"token id {vocab} is outside the vocabulary" in res[3].error
    assert "max_new_tokens must be >= 1" in res[4].error
    assert "needs 33 cache positions, beyond max_seq=32" in res[5].error
    assert "temperature must be >= 0" in res[6].error
    assert f"stop token id {vocab + 5} is outside the vocabulary" in res[7].error
    assert all("\n" not in r.error for r in res[1:8])
    assert len(res[0].ids) == 4 and len(res[8].ids) == 5 and engine.stats.errors == 7
    assert ex.kv.in_use() == []


@pytest.mark.tvm
def test_more_requests_than_max_batch_all_finish(ex):
    engine = Engine(ex)
    res = engine.run([Request(prompt=(i + 1, 7), max_new_tokens=3 + i % 3) for i in range(7)])
    assert [len(r.ids) for r in res] == [3 + i % 3 for i in range(7)]
    assert all(r.finish == "length" for r in res) and engine.stats.max_running == 3
    # queued requests wait: the last one's first token comes after the first ones finished
    assert res[-1].ttft_ms > res[0].ttft_ms


def test_replay_admits_no_request_before_its_arrival():
    now = [100.0]
    fake = FakeExecutor()
    fake.clock = lambda: now[0]

    def tick():  # every clock read advances 1 ms: a step takes a few ms
        now[0] += 1e-3
        return now[0]

    engine = Engine(fake, clock=tick)
    arrivals = [0.0, 0.5, 0.5]
    reqs = [Request(prompt=(i * 10,), max_new_tokens=3, stop=(i * 10 + 2,)) for i in range(3)]
    results, wall = replay(engine, arrivals, reqs, clock=tick,
                           sleep=lambda s: now.__setitem__(0, now[0] + s))
    t0 = results[0].arrival_s
    assert [r.ids for r in results] == [(1, 2), (11, 12), (21, 22)]
    assert [r.finish for r in results] == ["stop"] * 3
    assert [round(r.arrival_s - t0, 6) for r in results] == arrivals
    for (started, prompt), a in zip(fake.starts, arrivals, strict=True):
        assert started >= t0 + a, (prompt, started - t0)
    assert 0.5 < wall < 0.6 and all(r.ttft_ms < 50 for r in results)


def test_percentiles_and_slo_on_hand_computed_inputs():
    p = percentiles([40.0, 10.0, 30.0, 20.0])
    assert (p.p50, p.p90) == (25.0, 37.0) and p.p99 == pytest.approx(39.7)

    def res(ttft, tpot, n=3, finish="length"):
        return Result(rid=None, ids=(1,) * n, finish=finish, ttft_ms=ttft, tpot_ms=tpot,
                      arrival_s=0.0, finish_s=1.0, prompt_len=1)

    rs = [res(100, 10), res(300, 10), res(100, 60), res(50, 0.0, n=1), res(0, 0, 0, "error")]
    s = summarize(rs, duration_s=2.0, slo_ttft_ms=200, slo_tpot_ms=50)
    assert (s.requests, s.completed, s.errors, s.generated_tokens) == (5, 4, 1, 10)
    assert s.slo_attainment == pytest.approx(2 / 5)  # 1st and the one-token request
    assert s.tokens_per_s == 5.0 and s.requests_per_s == 2.0
    assert s.ttft_ms.p50 == 100.0 and s.tpot_ms.p50 == 10.0  # TPOT over >= 2-token requests


def test_trace_parser_names_the_bad_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"arrival_s": 0.1, "prompt_ids": [1, 2], "output_len": 3}\n\n'
                 '{"arrival_s": 0.5, "prompt_len": 4, "output_len": 2}\n')
    got = read_trace(f)
    assert [(e.arrival_s, e.prompt_len, e.prompt_ids) for e in got] == [(0.1, 2, (1, 2)), (0.5, 4, None)]
    # issue 28: arrivals going backwards are refused (a replay would reorder them silently)
    f.write_text('{"arrival_s": 0.5, "prompt_len": 4, "output_len": 2}\n\n'
                 '{"arrival_s": 0.1, "prompt_ids": [1, 2], "output_len": 3}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:3: arrival 0.1 s is before line 1's 0.5 s"):
        read_trace(f)
    bad = {'{"arrival_s": 0.5, "prompt_len": 4': "not valid JSON",
           '{"arrival_s": 0.5, "output_len": 2}': "needs 'prompt_len'",
           '{"arrival_s": 0.5, "prompt_len": 2}': "missing 'output_len'",
           '{"arrival_s": -1, "prompt_len": 4, "output_len": 2}': "'arrival_s' must be a number >= 0",
           '{"arrival_s": 0, "prompt_len": 4, "output_len": 2, "promt": 1}': "unknown key 'promt'"}
    for line, msg in bad.items():
        f.write_text('{"arrival_s": 0, "prompt_len": 1, "output_len": 1}\n' + line + "\n")
        with pytest.raises(TraceError, match=msg) as e:
            read_trace(f)
        assert str(e.value).startswith(f"{f}:2: ") and "\n" not in str(e.value)
    a = synthetic_trace(rate=50, duration_s=1, seed=3, prompt_mean=8, output_mean=4, max_seq=16)
    assert a == synthetic_trace(rate=50, duration_s=1, seed=3, prompt_mean=8, output_mean=4, max_seq=16)
    assert 25 < len(a) < 80 and all(e.prompt_len + e.output_len - 1 <= 16 for e in a)


def test_phase_switcher_applies_plans_and_counts(tmp_path):
    calls = []
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    pool = (lambda n, c: calls.append(("pool", n, tuple(c))), 2)
    decode = ServiceConfig(phase="decode", processes=(ProcessPlan(cpus=cpus[:1]),), threads_per_process=1)
    ps = PhaseSwitcher(None, decode, pin=lambda c: calls.append(("pin", c)), pool=pool)
    for phase in ["prefill", "prefill", "decode", "decode", "prefill", "decode"]:
        ps.enter(phase)
    assert ps.switches == 3 and ps.applied == 3  # the first prefill already runs as planned
    assert calls[:2] == [("pin", cpus[:1]), ("pool", 1, (str(cpus[0]),))]
    assert calls[2:4] == [("pin", cpus), ("pool", 2, tuple(map(str, cpus)))]
    same = PhaseSwitcher(pin=lambda c: calls.append(c), pool=pool)
    same.enter("prefill")
    same.enter("decode")
    assert same.switches == 1 and same.applied == 0 and len(calls) == 6
    with pytest.raises(ConfigError, match="may run only on"):
        PhaseSwitcher(PhasePlan((max(cpus) + 1,), 1), pool=pool)
    with pytest.raises(ConfigError, match="the thread pool has 2"):
        PhaseSwitcher(PhasePlan(cpus, 3), pool=pool)
    topo = tmp_path / "topology.json"  # the layout `sandwichc topo search` writes
    two = [{"cpus": [0], "numa_node": 0}, {"cpus": [1], "numa_node": 0}]
    topo.write_text(json.dumps({"command": "x", "prefill": [
        {"phase": "prefill", "processes": [{"cpus": list(cpus), "numa_node": 0}],
         "threads_per_process": len(cpus), "ttft_s": 1.0, "tpot_s": 0.1}],
        "decode": [{"phase": "decode", "processes": two, "threads_per_process": 1}]}))
    assert load_service_config(topo, "prefill").processes[0].cpus == cpus
    with pytest.raises(ConfigError, match="TP=2"):
        PhaseSwitcher(decode=load_service_config(topo, "decode"), pool=pool)


@pytest.mark.tvm
def test_generate_json_schema_and_errors(tuned, capsys):
    d, cache_dir, _ = tuned
    base = ["generate", "--model", str(d), "--cache-dir", str(cache_dir), "--ops", "numpy",
            "--threads", "2", "--prompt-ids", "1,5,9"]
    assert main(base + ["--max-new-tokens", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"ids", "ttft_ms", "tpot_ms"} and len(out["ids"]) == 4
    assert all(isinstance(i, int) for i in out["ids"])
    assert isinstance(out["ttft_ms"], float) and isinstance(out["tpot_ms"], float)
    assert main(base + ["--max-new-tokens", "4", "--json", "--logprobs", "2"]) == 0
    lps = json.loads(capsys.readouterr().out)["logprobs"]
    assert [e["id"] for e in lps] == out["ids"]  # greedy: each token is its step's likeliest
    assert all(e["top"][0] == [e["id"], e["logprob"]] and len(e["top"]) == 2
               and e["top"][1][1] <= e["logprob"] < 0 for e in lps)
    assert main(base + ["--logprobs", "2"]) == 1
    assert "add --json" in capsys.readouterr().err
    assert main(base + ["--max-new-tokens", "4", "--max-seq", "4"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sandwichc: error: prompt of 3 tokens + 4 new tokens") and err.count("\n") == 1


@pytest.mark.tvm
def test_serve_bench_on_a_tiny_synthetic_trace(tuned, tmp_path, capsys):
    d, cache_dir, _ = tuned
    out = tmp_path / "bench.json"
    assert main(["serve-bench", "--model", str(d), "--cache-dir", str(cache_dir), "--ops", "numpy",
                 "--threads", "2", "--trace", "synthetic", "--rate", "20", "--duration", "0.4",
                 "--prompt-mean", "4", "--output-mean", "3", "--max-batch", "2", "--max-seq", "16",
                 "--slo-ttft-ms", "1e6", "--slo-tpot-ms", "1e6", "--json", str(out)]) == 0
    assert "SLO attainment 100.0%" in capsys.readouterr().out
    s = json.loads(out.read_text())
    assert s["requests"] == s["completed"] >= 1 and s["errors"] == 0 and s["slo_attainment"] == 1.0
    assert s["generated_tokens"] >= s["requests"] and s["tokens_per_s"] > 0
    assert s["ttft_ms"]["p50"] <= s["ttft_ms"]["p90"] <= s["ttft_ms"]["p99"]
    assert s["duration_s"] > 0 and s["engine"]["prefills"] == s["requests"]
    recs = s["records"]  # issue 28: one record per request, every gap kept
    assert len(recs) == s["requests"] and all(len(r["tbt_ms"]) == len(r["ids"]) - 1 for r in recs)
    assert s["tbt_ms"]["p50"] <= s["tbt_ms"]["p99"] and s["e2e_ms"]["p50"] >= s["ttft_ms"]["p50"]


class _TimedExecutor(FakeExecutor):
    """A prefill costs 100 ms and a decode step 10 ms of a hand-moved clock (issue 28)."""

    def __init__(self, now, **kw):
        super().__init__(**kw)
        self.now = now
        self.clock = lambda: now[0]

    def start(self, prompt):
        self.now[0] += 0.1
        return super().start(prompt)

    def decode(self, slots, tokens):
        self.now[0] += 0.01
        return super().decode(slots, tokens)


def _timed_run():
    """A (4 tokens) alone for two steps, then B arrives: B's prefill stalls A's next token."""
    now = [0.0]
    ex = _TimedExecutor(now)
    engine = Engine(ex, clock=lambda: now[0])
    engine.submit(Request(prompt=(1,), max_new_tokens=4, rid="A"))
    done = engine.step() + engine.step()
    engine.submit(Request(prompt=(5, 6), max_new_tokens=3, rid="B"))
    while engine.busy:
        done += engine.step()
    return sorted(done, key=lambda r: r.rid)


def test_every_token_time_is_kept_and_a_prefill_stall_shows_in_tbt():
    a, b = _timed_run()
    assert a.token_times == pytest.approx((0.1, 0.11, 0.12, 0.23))
    assert a.tbt_ms == pytest.approx((10.0, 10.0, 110.0)) and a.ttft_ms == pytest.approx(100.0)
    assert a.e2e_ms == pytest.approx(230.0) and a.tpot_ms == pytest.approx(np.mean(a.tbt_ms))
    assert b.token_times == pytest.approx((0.22, 0.23, 0.24)) and b.e2e_ms == pytest.approx(120.0)
    s = summarize([a, b], duration_s=0.24, slo_ttft_ms=None, slo_tpot_ms=None, slo_tbt_ms=50.0)
    assert s.tbt_ms.p50 == pytest.approx(10.0) and s.tbt_ms.p90 == pytest.approx(70.0)
    assert s.tbt_ms.p99 == pytest.approx(106.0)  # gaps 10, 10, 10, 10, 110
    assert s.e2e_ms.p50 == pytest.approx(175.0) and s.slo_attainment == 0.5  # A's 110 ms gap
    assert summarize([a, b], duration_s=1, slo_ttft_ms=1e3, slo_tpot_ms=1e3,
                     slo_e2e_ms=200.0).slo_attainment == 0.5
    rec = records([a, b], [0.0, 0.12])
    assert rec[0] == {"rid": "A", "arrival_s": 0.0, "prompt_len": 1, "ids": [2, 3, 4, 5],
                      "finish": "length", "ttft_ms": a.ttft_ms, "tbt_ms": list(a.tbt_ms),
                      "e2e_ms": a.e2e_ms, "error": None}
    json.dumps(rec)


def _res(ttft, times, *, arrival=0.0, finish="length"):
    return Result(rid=None, ids=(1,) * len(times), finish=finish, ttft_ms=ttft,
                  tpot_ms=float(np.mean(np.diff(times))) * 1e3 if len(times) > 1 else 0.0,
                  arrival_s=arrival, finish_s=times[-1] if times else 0.0, prompt_len=1,
                  token_times=tuple(times))


def test_slowdown_against_each_requests_alone_figures():
    base = Baseline(ttft_ms=100.0, tbt_ms=10.0, e2e_ms=200.0)
    rs = [_res(150.0, [0.15, 0.16, 0.172]),  # TTFT 1.5x, gaps 1x and 1.2x, E2E 172/200
          _res(100.0, [0.1, 0.11, 0.12]),  # as alone
          _res(0.0, [], finish="error"),  # left out
          _res(500.0, [0.5, 0.6])]  # no baseline: left out
    s = slowdowns(rs, [base, base, base, None])
    assert s.compared == 2 and s.met  # 1.5x TTFT <= 2x, TBT <= 1.25x, E2E <= 1.25x
    assert s.ttft.p50 == pytest.approx(1.25) and s.e2e.p50 == pytest.approx((0.86 + 0.6) / 2)
    assert s.tbt.p90 == pytest.approx(1.14)  # gaps 1, 1.2, 1, 1: 1 + 0.7 * 0.2
    slow = slowdowns([_res(150.0, [0.15, 0.2])], [base])  # one 50 ms gap: 5x > Table VI's 1.25x
    assert not slow.met and slow.tbt.p50 == pytest.approx(5.0)
    assert set(TABLE_VI) == {"ttft", "tbt", "e2e"} and TABLE_VI["ttft"] == (2.0, 3.0, 6.0)


def test_alone_baselines_run_each_shape_once_on_an_idle_engine():
    now = [0.0]
    ex = _TimedExecutor(now, max_seq=8)
    engine = Engine(ex, clock=lambda: now[0])
    reqs = [Request(prompt=(1, 2), max_new_tokens=3), Request(prompt=(7, 8), max_new_tokens=3),
            Request(prompt=(1,), max_new_tokens=1), Request(prompt=(1,) * 9, max_new_tokens=1)]
    got = alone_baselines(engine, reqs)
    assert len(ex.starts) == 2  # (2, 3) once, (1, 1) once; the too-long prompt fails
    assert got[0] == got[1] == Baseline(pytest.approx(100.0), pytest.approx(10.0), pytest.approx(120.0))
    assert got[2].tbt_ms is None and got[3] is None


def test_goodput_bisects_the_rate_with_a_fake_attainment():
    calls = []

    def attain(rate):
        calls.append(rate)
        return 1.0 if rate <= 5.0 else 0.5

    g = find_goodput(attain, lo=1.0, hi=16.0, steps=4)
    assert calls == pytest.approx([1.0, 16.0, 4.0, 8.0, math.sqrt(32), math.sqrt(4 * math.sqrt(32))])
    assert g.rate == pytest.approx(math.sqrt(4 * math.sqrt(32))) and not g.capped
    assert [a for _, a in g.probes] == [1.0, 0.5, 1.0, 0.5, 0.5, 1.0]
    assert find_goodput(lambda r: 0.95, lo=1, hi=2).capped
    assert find_goodput(lambda r: 0.89, lo=1, hi=2, steps=9).rate == 0.0
    with pytest.raises(ConfigError, match="0 < LO < HI"):
        find_goodput(attain, lo=2, hi=1)


def test_serve_bench_cli_on_an_azure_trace_with_a_fake_engine(tmp_path, monkeypatch, capsys):
    """The command's wiring without kernels: an Azure CSV, a prompt beyond max_seq (that
    request fails, the others finish), --slowdown-slo, --goodput, and the JSON records."""
    from sandwich.cli import serve

    monkeypatch.setattr(serve, "_engine", lambda args, max_batch, max_seq, clock=None:
                        Engine(FakeExecutor(max_batch=max_batch, max_seq=max_seq)))
    trace = tmp_path / "AzureLLMInferenceTrace_code.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.00,3,2\n"
                     "2023-11-16 18:15:46.01,40,2\n2023-11-16 18:15:46.02,2,3\n")
    out = tmp_path / "bench.json"
    assert main(["serve-bench", "--model", "fake", "--trace", str(trace), "--max-seq", "16",
                 "--slowdown-slo", "--goodput", "10:1000", "--goodput-steps", "1",
                 "--slo-ttft-ms", "1e6", "--slo-tpot-ms", "1e6", "--json", str(out)]) == 0
    cap = capsys.readouterr()
    assert "1 requests failed; first: prompt of 40 tokens is longer than max_seq=16" in cap.err
    assert "Table VI SLOs" in cap.out and "goodput" in cap.out
    doc = json.loads(out.read_text())
    assert (doc["requests"], doc["completed"], doc["errors"]) == (3, 2, 1)
    assert [r["arrival_s"] for r in doc["records"]] == pytest.approx([0.0, 0.01, 0.02])
    assert [len(r["ids"]) for r in doc["records"]] == [2, 0, 3]  # random prompt ids: lengths
    assert [len(r["tbt_ms"]) for r in doc["records"]] == [1, 0, 2]
    assert doc["records"][1]["error"].startswith("prompt of 40 tokens")
    assert doc["slowdown"]["compared"] == 2 and len(doc["goodput"]["probes"]) <= 3
    assert doc["goodput"]["rate"] == 0.0 or doc["goodput"]["rate"] >= 10  # 1 of 3 always fails


# -- speculative decoding (runtime/speculate.py) ------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_latest_earlier_suffix():
    from sandwich.runtime.speculate import Speculation

    s = Speculation(draft=3, ngram=3)
    assert s.propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3) == [7, 8, 1]  # the latest match wins
    assert s.propose([5, 6, 1, 2, 3, 4, 2, 3], 3) == [4, 2, 3]  # the longest suffix that recurs
    assert s.propose([1, 2, 3, 4], 3) == []  # nothing recurs
    assert s.propose([4, 4], 3) == [4]  # a run: the next token is the last one again
    assert s.propose([1, 2, 1, 2], 0) == []
    with pytest.raises(ConfigError):
        Speculation(draft=-1)
    from sandwich.runtime.speculate import MAX_WAIT, Drafter

    d, ctx = Drafter(s), [7, 8, 7]
    guesses = []
    for took in [0, 0, 0, 1, 0] + [0] * 40:  # a step's outcome, whenever the drafter guessed
        while not d.propose(ctx, 2):
            guesses.append(".")
        guesses.append("g")
        d.taken(2, took)
    # after failures it waits 1, 2, 4 steps; a taken draft resets the wait; it never waits longer than MAX_WAIT
    assert "".join(guesses).startswith("g.g..g....gg.g..g....g........g")
    assert max(map(len, "".join(guesses).split("g"))) == MAX_WAIT


def test_speculation_takes_the_drafts_the_sampler_picks_and_keeps_the_tokens():
    """Fake model: next = last + 1. A prompt that holds its own continuation is taken several
    tokens a step; a prompt that misleads the drafts gets one step per token, as without
    speculation; greedy, sampled and with a length or stop id inside a step, the tokens and
    finish equal those without; rejected drafts leave the cache."""
    from engine_fakes import SpeculatingExecutor

    from sandwich.runtime.speculate import Speculation

    def run(reqs, draft):
        ex = SpeculatingExecutor(max_batch=3, max_seq=64, vocab=50)
        eng = Engine(ex, speculation=Speculation(draft=draft))
        res = eng.run(reqs)
        assert ex.kv.in_use() == []
        return [(r.ids, r.finish) for r in res], eng.stats

    reqs = [Request(prompt=(1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2), max_new_tokens=12),  # 3.. follows 1, 2
            Request(prompt=(3, 9, 3, 9, 3), max_new_tokens=6),  # drafts 9s, the model says 4, 5, ...
            Request(prompt=(10, 11, 12, 13, 10, 11), max_new_tokens=9, temperature=0.8, seed=3),
            Request(prompt=(20, 21, 22, 23, 24, 20), max_new_tokens=10, stop=(23,))]
    plain, base = run(reqs, 0)
    fast, stats = run(reqs, 4)
    assert fast == plain and base.drafted == 0
    assert plain[3] == ((21, 22, 23), "stop") and plain[0][0][:3] == (3, 4, 5)
    assert stats.accepted > 0 and stats.drafted > stats.accepted and stats.steps < base.steps
    assert stats.decode_tokens == base.decode_tokens


@pytest.mark.tvm
def test_speculation_on_the_tuned_model_keeps_the_greedy_tokens(ex):
    """The executor's verify pass (every drafted row through the prefill kernels, the head on
    all rows, then the rejected positions trimmed) against a token-a-step decode."""
    from sandwich.runtime.schedule import ChunkedSchedule
    from sandwich.runtime.speculate import Speculation

    prompts = [(5, 6, 7, 8, 5, 6, 7, 8, 5, 6), (9, 10, 9, 10, 9, 10), tuple(PROMPTS[0])]
    for schedule in (None, ChunkedSchedule(4)):  # chunked: decode steps with no chunk in flight speculate
        eng = Engine(ex, speculation=Speculation(draft=4), schedule=schedule)
        res = eng.run([Request(prompt=p, max_new_tokens=12) for p in prompts])
        assert eng.stats.drafted > eng.stats.accepted > 0 and ex.kv.in_use() == []
        for p, r in zip(prompts, res, strict=True):
            _assert_same_greedy(list(r.ids), *_alone(ex, p, 12))
