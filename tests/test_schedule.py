"""Issue 28: the scheduling policies (sandwich, chunked:C, layered:G, splitwise:P,D) change
timing, never results; the prefill stall each one puts between two decode tokens, measured
on a cost clock (tokens x layers run), not on wall time."""

import json
import os
import signal
import time

import numpy as np
import pytest
from conftest import tune_model, tuned_checkpoint
from engine_fakes import FakeExecutor

from sandwich.errors import ConfigError
from sandwich.runtime.engine import Engine, Request
from sandwich.runtime.schedule import (
    ChunkedSchedule,
    LayeredSchedule,
    make_schedule,
    parse_schedule,
)
from sandwich.runtime.schedule.layered import default_groups, layer_groups

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


@pytest.mark.parametrize("text, kind, values", [
    ("sandwich", "sandwich", ()), ("chunked:64", "chunked", (64,)), ("layered", "layered", ()),
    ("layered:3", "layered", (3,)), ("splitwise:1,1", "splitwise", (1, 1))])
def test_schedule_spellings(text, kind, values):
    spec = parse_schedule(text)
    assert (spec.kind, spec.values, spec.text) == (kind, values, text)


@pytest.mark.parametrize("text", ["chunked", "chunked:0", "chunked:x", "layered:1,2", "splitwise:1",
                                  "splitwise:0,1", "sarathi:4", "sandwich:2", ""])
def test_bad_schedule_spellings_name_the_choices(text):
    with pytest.raises(ConfigError, match="chunked:C"):
        parse_schedule(text)


def test_layer_groups_and_the_papers_default_g():
    assert layer_groups(12, 3) == [(0, 4), (4, 8), (8, 12)]
    assert layer_groups(5, 2) == [(0, 3), (3, 5)]
    assert layer_groups(2, 9) == [(0, 1), (1, 2)]  # G capped at the layers
    assert [default_groups(n) for n in (1, 512, 513, 2048)] == [1, 1, 2, 4]


# -- the stall between two decode tokens, on a cost clock ---------------------------------
class CostedExecutor(FakeExecutor):
    """Next token = last + 1; the clock advances by the tokens x layers each call runs."""

    LAYERS = 8

    def __init__(self, **kw):
        super().__init__(vocab=200, **kw)
        self.cfg.num_hidden_layers = self.LAYERS
        self.max_tokens = self.kv.max_seq
        self.t = 0.0
        self.clock = lambda: self.t

    def start(self, prompt):
        self.t += len(prompt) * self.LAYERS
        return super().start(prompt)

    def decode(self, slots, tokens):
        self.t += len(slots) * self.LAYERS
        return super().decode(slots, tokens)

    def reserve(self, prompt=()):
        return self.kv.alloc()

    def iterate(self, slots, tokens, work=None):
        rows = super().decode(slots, tokens) if slots else np.zeros((0, self.cfg.vocab_size))
        self.t += len(slots) * self.LAYERS
        if work is None:
            return rows
        lo, hi = work.layers or (0, self.LAYERS)
        self.t += len(work.tokens) * (hi - lo)
        if hi < self.LAYERS:
            return rows
        self.kv.lens[work.slot] = work.start + len(work.tokens)
        return np.vstack([rows, self._row(work.tokens[-1])[None]])


def _stall(schedule):
    """A decoding request, then a 96-token prompt arrives: the running request's largest
    inter-token gap, the newcomer's tokens and TTFT, in cost units."""
    ex = CostedExecutor(max_batch=2, max_seq=128)
    eng = Engine(ex, schedule=schedule, clock=ex.clock)
    eng.submit(Request(prompt=(1,), max_new_tokens=40, rid="A"))
    while not eng.running:  # A is decoding when B arrives
        eng.step()
    eng.submit(Request(prompt=tuple(range(96)), max_new_tokens=3, rid="B"))
    done = []
    while eng.busy:
        done += eng.step()
    a, b = sorted(done, key=lambda r: r.rid)
    assert a.ids == tuple(range(2, 42)) and b.ids == (96, 97, 98)  # scheduling kept the tokens
    return max(a.tbt_ms) / 1e3, b.ttft_ms / 1e3


def test_chunked_and_layered_bound_the_decode_stall_that_sandwich_has():
    stall, _ = _stall(None)
    assert stall == 96 * 8 + 2 * 8  # the whole prompt through 8 layers, then a step of A and B
    stall, ttft = _stall(ChunkedSchedule(16))
    assert stall == 16 * 8 + 8  # one 16-token chunk beside A's token
    assert ttft == 6 * (16 * 8 + 8)  # six chunks, each beside A's decode
    stall, ttft = _stall(LayeredSchedule(4))
    assert stall == 96 * 2 + 8  # the whole prompt through one group of 2 layers
    assert ttft == 4 * (96 * 2 + 8)
    assert _stall(LayeredSchedule())[0] == 96 * 8 + 8  # G = ceil(96 / 512) = 1: no gain


def test_a_cancelled_prompt_in_progress_frees_its_slot():
    ex = CostedExecutor(max_batch=2, max_seq=128)
    eng = Engine(ex, schedule=ChunkedSchedule(8), clock=ex.clock)
    t = eng.submit(Request(prompt=tuple(range(40)), max_new_tokens=2))
    eng.step()
    assert eng.busy and ex.kv.in_use() == [0]
    assert eng.cancel(t) and not eng.busy and ex.kv.in_use() == []
    assert eng.run([Request(prompt=(5, 6), max_new_tokens=2)])[0].ids == (7, 8)


# -- the real executor: same greedy tokens under every policy ------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory, cache):
    """A 4-layer GQA llama tuned for 2 threads (in-process), 1 (splitwise's pools) and TP=2."""
    return tuned_checkpoint(tmp_path_factory, cache, "llama-160m",
                            tp_threads=((1, 2), (1, 1), (2, 1)),
                            num_hidden_layers=4, hidden_size=128, intermediate_size=256,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


@pytest.fixture(scope="module")
def ex(model, cache):
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model

    return Executor(load_model(model, cache, threads=2), max_batch=3, max_seq=96, max_tokens=40)


PROMPTS = [tuple(range(5, 17)), (3, 1, 4, 1, 5, 9, 2), tuple(range(100, 150)), (7,) * 20]


def _staggered(engine):
    """Two requests, two iterations, then two more (one longer than a forward pass holds)."""
    tickets = [engine.submit(Request(prompt=p, max_new_tokens=9)) for p in PROMPTS[:2]]
    out = {}
    for _ in range(2):
        out.update((r.ticket, r) for r in engine.step())
    tickets += [engine.submit(Request(prompt=p, max_new_tokens=7)) for p in PROMPTS[2:]]
    while engine.busy:
        out.update((r.ticket, r) for r in engine.step())
    res = [out[t] for t in tickets]
    assert [r.error for r in res] == [None] * 4
    return [r.ids for r in res]


@pytest.fixture(scope="module")
def sandwich_ids(ex):
    return _staggered(Engine(ex))


@pytest.mark.tvm
@pytest.mark.parametrize("text", ["chunked:5", "chunked:64", "layered:2", "layered:4", "layered"])
def test_every_policy_gives_sandwichs_greedy_tokens(ex, sandwich_ids, text):
    engine = Engine(ex, schedule=make_schedule(text))
    assert _staggered(engine) == sandwich_ids
    assert ex.kv.in_use() == []


def _conversation(engine, turns=3):
    """A chat's turns: each prompt is the last prompt, its reply and a new message."""
    prompt, replies = (9, 8, 7, 6, 5, 4, 3, 2), []
    for i in range(turns):
        (r,) = engine.run([Request(prompt=prompt, max_new_tokens=6)])
        assert r.error is None
        replies.append(r.ids)
        prompt = prompt + r.ids + tuple(range(30 + 10 * i, 37 + 10 * i))
    return replies


@pytest.mark.tvm
@pytest.mark.parametrize("text", ["sandwich", "chunked:5", "layered:2"])
def test_a_chats_next_turn_prefills_only_what_is_new_and_keeps_the_tokens(model, cache, text):
    """Each turn resends the conversation: with prefix reuse (the default) a turn's prompt
    takes the slot its last turn left, holding the last prompt and the reply (all but the
    last sampled token, never written), and prefills only the rest; the replies equal an
    executor's without reuse, under every schedule."""
    from sandwich.runtime.executor import Executor, whole_prefills
    from sandwich.runtime.loader import load_model

    loaded = load_model(model, cache, threads=2)
    fresh = Executor(loaded, max_batch=3, max_seq=96, max_tokens=40, prefix_cache=False)
    want = _conversation(Engine(fresh, schedule=make_schedule(text)))
    assert fresh.kv.reused_tokens == 0
    reuse = Executor(loaded, max_batch=3, max_seq=96, max_tokens=40)
    assert _conversation(Engine(reuse, schedule=make_schedule(text))) == want
    # turns 2 and 3 found 8 + 5 and (8 + 6 + 7) + 5 positions of their prompts kept
    assert reuse.kv.reused_tokens == 13 + 26
    if text == "sandwich":  # a measurement turns reuse off, and forgets what was kept
        with whole_prefills(reuse):
            assert _conversation(Engine(reuse)) == want
        assert reuse.kv.reused_tokens == 39 and reuse.kv.reuse
        assert _conversation(Engine(reuse)) == want and reuse.kv.reused_tokens == 2 * 39


@pytest.mark.tvm
@pytest.mark.parametrize("text", ["sandwich", "chunked:5"])
def test_requests_admitted_together_copy_a_shared_prompt_and_keep_the_tokens(model, cache, text):
    """Two choices of one prompt and a third request sharing its first 20 tokens, submitted
    together: the second and third copy what the first's slot holds (29 and 20 positions)
    and prefill the rest; the tokens equal an executor's without reuse."""
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model

    loaded = load_model(model, cache, threads=2)
    prompt = tuple(range(40, 70))
    reqs = [Request(prompt=prompt, max_new_tokens=5, temperature=0.8, seed=s) for s in (1, 2)]
    reqs.append(Request(prompt=prompt[:20] + (3, 3, 3), max_new_tokens=5))
    fresh = Executor(loaded, max_batch=3, max_seq=96, max_tokens=40, prefix_cache=False)
    want = [r.ids for r in Engine(fresh, schedule=make_schedule(text)).run(reqs)]
    reuse = Executor(loaded, max_batch=3, max_seq=96, max_tokens=40)
    assert [r.ids for r in Engine(reuse, schedule=make_schedule(text)).run(reqs)] == want
    assert reuse.kv.copied_tokens == reuse.kv.reused_tokens == 29 + 20


@pytest.mark.tvm
@pytest.mark.parametrize("text", ["chunked:5", "layered:2"])
def test_hybrid_schedules_score_a_prompt_as_sandwich_does(ex, text):
    """Echo with logprobs under a hybrid schedule, beside a running decode: each prompt
    token after the first scored from its part's rows once they passed the last layer, as
    sandwich's whole prefill scores it (1e-4, the same likeliest tokens), and the reply the
    same; the prompt is prefilled whole even where a slot keeps part of it."""
    prompt = tuple(range(60, 83))
    scored = Request(prompt=prompt, max_new_tokens=4, prompt_logprobs=3)
    other = Request(prompt=(5, 6, 7), max_new_tokens=12)
    (want,) = Engine(ex).run([scored])
    engine = Engine(ex, schedule=make_schedule(text))
    told = []
    engine.on_prompt = lambda ticket, lps: told.append(lps)
    first, got = engine.run([other, scored])
    assert got.error is None and got.ids == want.ids and told == [got.prompt_logprobs]
    assert len(got.prompt_logprobs) == len(prompt) - 1
    for a, b in zip(got.prompt_logprobs, want.prompt_logprobs, strict=True):
        assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert ex.kv.in_use() == []


@pytest.mark.tvm
@pytest.mark.skipif(not TWO_CPUS, reason="TP=2 needs two cores")
def test_hybrid_schedules_under_tensor_parallelism_keep_the_tokens(model, cache, sandwich_ids):
    """Every rank runs the same iterate calls (a chunk, a layer group) as rank 0."""
    from sandwich.runtime.tp import TPExecutor

    with TPExecutor(model, cache, tp=2, max_batch=3, max_seq=96, max_tokens=40,
                    cpu_sets=[[0], [1]]) as tp:
        for text in ("chunked:5", "layered:3"):
            assert _staggered(Engine(tp, schedule=make_schedule(text))) == sandwich_ids
            assert tp.kv.in_use() == []


@pytest.mark.tvm
@pytest.mark.skipif(not TWO_CPUS, reason="splitwise:1,1 needs two cores")
def test_splitwise_gives_the_same_tokens_and_survives_its_pool_dying(model, cache, sandwich_ids):
    from sandwich.runtime.schedule.splitwise import splitwise_engine_parts

    cpus = sorted(os.sched_getaffinity(0))
    ex, sched, phases = splitwise_engine_parts(model, cache, cpus=cpus, prompt_cores=1,
                                               token_cores=1, max_batch=3, max_seq=96)
    try:
        engine = Engine(ex, schedule=sched, phases=phases)
        assert _staggered(engine) == sandwich_ids
        assert os.sched_getaffinity(0) == {cpus[-1]}  # the token pool's core
        os.kill(sched.pool._proc.pid, signal.SIGKILL)
        time.sleep(0.2)
        res = engine.run([Request(prompt=(1, 2, 3), max_new_tokens=2)] * 2)
        assert all(r.finish == "error" and "prompt pool" in r.error for r in res)
        assert not engine.busy and ex.kv.in_use() == []
    finally:
        sched.close()
        phases.restore()


@pytest.mark.tvm
@pytest.mark.skipif(not TWO_CPUS, reason="splitwise:1,1 needs two cores")
def test_splitwise_reads_the_weight_format_in_both_pools(model, cache, sandwich_ids):
    """--schedule splitwise --weights int8-g32: the prompt pool (its own process) and the token
    pool both read the int8 weights, so the tokens are one int8 engine's, not fp32's."""
    from sandwich.runtime.executor import Executor
    from sandwich.runtime.loader import load_model
    from sandwich.runtime.schedule.splitwise import splitwise_engine_parts

    fmt = "int8-g32"
    for threads in (2, 1):  # this process's engine, and each pool's one core
        tune_model(model, cache, threads=threads, weights=fmt, seq_max=1)
    one = Executor(load_model(model, cache, threads=2, weights=fmt), max_batch=3, max_seq=96,
                   max_tokens=40)
    want = _staggered(Engine(one))
    assert want != sandwich_ids  # the format changes the tokens, so a pool reading fp32 shows
    cpus = sorted(os.sched_getaffinity(0))
    ex, sched, phases = splitwise_engine_parts(model, cache, cpus=cpus, prompt_cores=1,
                                               token_cores=1, max_batch=3, max_seq=96,
                                               weights=fmt)
    try:
        assert _staggered(Engine(ex, schedule=sched, phases=phases)) == want
    finally:
        sched.close()
        phases.restore()


@pytest.mark.tvm
@pytest.mark.skipif(not TWO_CPUS, reason="splitwise:1,1 needs two cores")
def test_serve_bench_schedules_keep_every_requests_tokens(model, cache, tmp_path, capsys):
    from sandwich.cli import main
    from sandwich.runtime.phases import unpin_process

    def bench(schedule):
        out = tmp_path / f"{schedule.replace(':', '_')}.json"
        assert main(["serve-bench", "--model", str(model), "--cache-dir", str(cache.dir),
                     "--ops", "numpy", "--no-tune", "--plan", "off", "--schedule", schedule,
                     "--trace", "synthetic", "--rate", "30", "--duration", "0.3", "--seed", "3",
                     "--prompt-mean", "12", "--output-mean", "4", "--max-batch", "3",
                     "--max-seq", "64", "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["engine"]["schedule"] == schedule and doc["errors"] == 0
        return [r["ids"] for r in doc["records"]]

    cpus = tuple(sorted(os.sched_getaffinity(0)))
    try:
        want = bench("sandwich")
        assert len(want) >= 3
        assert bench("chunked:4") == want
        assert bench("layered:3") == want
        assert bench("splitwise:1,1") == want
    finally:
        unpin_process(cpus)
    capsys.readouterr()


@pytest.mark.tvm
@pytest.mark.skipif(not TWO_CPUS, reason="splitwise:1,1 needs two cores")
def test_bench_scheduling_reports_every_policy_on_the_same_requests(model, cache, tmp_path, capsys):
    from sandwich.cli import main

    out = tmp_path / "s"
    assert main(["bench", "scheduling", "--model", str(model), "--cache-dir", str(cache.dir),
                 "--ops", "numpy", "--no-tune", "--traces", "synthetic", "synthetic:conversation",
                 "--policies", "sandwich", "chunked:8", "layered:2", "splitwise:1,1",
                 "--sweep", "chunked:16", "layered:4", "--rate", "20", "--duration", "0.3",
                 "--length-scale", "0.02", "--max-batch", "3", "--max-seq", "64",
                 "--slo-tbt-ms", "1e4", "--goodput", "5:50", "--goodput-steps", "0",
                 "--goodput-duration", "0.2", "--md", f"{out}.md", "--json", f"{out}.json",
                 "--png", f"{out}.png"]) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    rows = doc["rows"]
    assert [(r["trace"], r["policy"], r["sweep"]) for r in rows] == [
        (t, p, s) for t in ("synthetic", "synthetic:conversation")
        for p, s in (("sandwich", False), ("chunked:8", False), ("layered:2", False),
                     ("splitwise:1,1", False), ("chunked:16", True), ("layered:4", True))]
    for t in ("synthetic", "synthetic:conversation"):
        digests = {r["ids_digest"] for r in rows if r["trace"] == t}
        assert len(digests) == 1  # every policy generated the same tokens
    assert all(r["errors"] == 0 and r["attainment"] == 1.0 for r in rows)
    assert all(r["goodput"]["probes"] for r in rows if not r["sweep"])
    md = (tmp_path / "s.md").read_text()
    assert md.count("| yes |") == len(rows) and (tmp_path / "s.png").stat().st_size > 0
    assert len(os.sched_getaffinity(0)) >= 2  # splitwise gave the cores back
    capsys.readouterr()
