"""Trace formats for serve-bench (issue 28): the Azure LLM inference CSV, ShareGPT
conversations, JSON Lines, synthetic Poisson/Gamma arrivals with the papers' length
statistics, scaling, and every bad trace named by FILE:LINE. No model, no wall clock."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from sandwich.errors import ConfigError
from sandwich.runtime.trace_azure import read_azure_csv
from sandwich.runtime.trace_load import TraceOptions, load_trace
from sandwich.runtime.trace_sharegpt import WORDS_PER_TOKEN, estimate_tokens, read_sharegpt
from sandwich.runtime.trace_synth import PROFILES, Arrivals, profile_trace
from sandwich.runtime.traces import (
    TraceEntry,
    TraceError,
    clip,
    detect_format,
    mean_rate,
    read_trace,
    scale,
    synthetic_trace,
)

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,396,109\n"
         "2023-11-16 18:15:51.2224670,879,0\n")


def test_azure_csv_arrivals_are_seconds_since_the_first_row(tmp_path):
    f = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    f.write_text(AZURE)
    got = read_trace(f)
    assert [(e.prompt_len, e.output_len, e.prompt_ids) for e in got] == [
        (374, 44, None), (396, 109, None), (879, 1, None)]  # 0 generated -> the first token
    assert [round(e.arrival_s, 6) for e in got] == [0.0, 4.314579, 4.541877]
    tz = tmp_path / "t2024.csv"  # the 2024 files carry a UTC offset; columns in any order
    tz.write_text("ContextTokens,TIMESTAMP,GeneratedTokens\n"
                  "10,2024-05-10 00:00:00.009930+00:00,5\n10,2024-05-10 00:00:01.509930+00:00,5\n")
    assert [e.arrival_s for e in read_azure_csv(tz)] == [0.0, pytest.approx(1.5)]
    num = tmp_path / "num.trace"  # no suffix: the header says it is Azure
    num.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n\n10.5,3,2\n12,4,2\n")
    assert detect_format(num) == "azure"
    assert [(e.arrival_s, e.prompt_len) for e in read_trace(num)] == [(0.0, 3), (1.5, 4)]


HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BAD_AZURE = [  # (file text, line, message)
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", 1, "missing column 'GeneratedTokens'"),
    (HEAD + "2023-11-16 18:15:46,3,2\nyesterday,3,2\n", 3, "TIMESTAMP 'yesterday' is neither"),
    (HEAD + "-5,3,2\n", 2, "TIMESTAMP must be a time >= 0"),
    (HEAD + "2023-11-16 18:15:46,3,2\n2023-11-16 18:15:47,3,2\n2023-11-16 18:15:45,3,2\n", 4,
     "arrival -1 s is before line 3's 1 s; sort the trace"),
    ("", 1, "empty file; expected the header"),
    (HEAD, 1, "the trace has no requests"),
    (HEAD + "2023-11-16 18:15:46,3.5,2\n", 2, "ContextTokens must be an integer"),
    (HEAD + "2023-11-16 18:15:46,3,-2\n", 2, "GeneratedTokens must be >= 0"),
    (HEAD + "2023-11-16 18:15:46,3\n", 2, "2 fields, the header has 3"),
]


def _stops_at(f, text: str, line: int, msg: str) -> None:
    """A bad trace is one line of error: `FILE:LINE: reason`."""
    f.write_text(text)
    with pytest.raises(TraceError, match=msg) as e:
        read_trace(f)
    assert str(e.value).startswith(f"{f}:{line}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("text,line,msg", BAD_AZURE)
def test_bad_azure_csv_stops_at_file_and_line(tmp_path, text, line, msg):
    _stops_at(tmp_path / "t.csv", text, line, msg)


BAD_JSONL = [
    ("", 1, "the trace has no requests"),
    ('{"arrival_s": 1, "prompt_len": 2, "output_len": 1}\n'
     '{"arrival_s": 0.5, "prompt_len": 2, "output_len": 1}\n', 2, "before line 1's"),
    ('{"arrival_s": "soon", "prompt_len": 2, "output_len": 1}\n', 1, "'arrival_s' must be a number"),
    ('{"arrival_s": -0.1, "prompt_len": 2, "output_len": 1}\n', 1, "'arrival_s' must be a number"),
    ('{"arrival_s": 0, "output_len": 1}\n', 1, "needs 'prompt_len'"),
]


@pytest.mark.parametrize("text,line,msg", BAD_JSONL)
def test_bad_jsonl_stops_at_file_and_line(tmp_path, text, line, msg):
    _stops_at(tmp_path / "t.jsonl", text, line, msg)


def _conv(*turns):
    return {"conversations": [{"from": w, "value": v} for w, v in turns]}


SHAREGPT = [_conv(("human", "write a haiku about the sea"), ("gpt", "waves fold into foam")),
            _conv(("gpt", "hello"), ("human", "ok")),  # no reply after the human turn: skipped
            _conv(("system", "be brief"), ("human", "hi there"), ("gpt", "hi"),
                  ("human", "more"), ("gpt", "no"))]


class _CharTokenizer:
    """One token per character (a bos of 0 in front of prompts): enough to see the ids."""

    def encode(self, text, *, add_bos=None):
        return ([0] if add_bos is not False else []) + [ord(c) % 50 + 1 for c in text]


def test_sharegpt_first_human_turn_and_first_reply(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(SHAREGPT, indent=1))
    got = read_sharegpt(f, rate=2.0, seed=7)
    times = Arrivals().times(np.random.default_rng(7), 2.0, n=2)  # seeded, in file order
    assert [e.arrival_s for e in got] == times
    # word estimate: 6 words / 0.75 -> 8 tokens; 4 words -> 6 (ceil); 2 -> 3; 1 -> 2
    assert [(e.prompt_len, e.output_len, e.prompt_ids) for e in got] == [(8, 6, None), (3, 2, None)]
    assert estimate_tokens("") == 1 and WORDS_PER_TOKEN == 0.75
    tok = read_sharegpt(f, rate=2.0, seed=7, tokenizer=_CharTokenizer())
    assert tok[1].prompt_ids == tuple(_CharTokenizer().encode("hi there")) and tok[1].output_len == 2
    gamma = read_sharegpt(f, rate=2.0, seed=7, arrivals=Arrivals("gamma", 2.0), until_s=times[0])
    assert len(gamma) <= 1  # stops at the first conversation arriving after until_s
    assert detect_format(f) == "sharegpt"


BAD_SHAREGPT = [
    ('{"conversations": []}', 1, "expected a JSON array"),
    ('[\n {"conversations": []},\n 7\n]', 3, "expected an object with a 'conversations' list"),
    ('[\n {"conversations": [\n  {"from": "human"}]}]', 2, "needs 'from' and 'value' strings"),
    ('[\n {"conversations": []},\n {"conversations": [}\n]', 3, "not valid JSON"),
    ('[\n {"conversations": []}\n {"conversations": []}]', 3, "expected ',' or ']'"),
    ("[]", 1, "the trace has no requests"),
    (json.dumps([SHAREGPT[1]]), 1, "none of 1 conversations has a human turn"),
]


@pytest.mark.parametrize("text,line,msg", BAD_SHAREGPT)
def test_bad_sharegpt_stops_at_file_and_line(tmp_path, text, line, msg):
    f = tmp_path / "t.json"
    f.write_text(text)
    with pytest.raises(TraceError, match=msg) as e:
        read_trace(f, rate=1.0)
    assert str(e.value).startswith(f"{f}:{line}: ")


def _gaps(arrivals, n=20000, rate=4.0, seed=1):
    t = arrivals.times(np.random.default_rng(seed), rate, n=n)
    return np.diff([0.0, *t])


@pytest.mark.parametrize("arrivals", [Arrivals(), Arrivals("gamma", 1.0), Arrivals("gamma", 2.0),
                                      Arrivals("gamma", 0.5)])
def test_arrival_gaps_have_the_asked_mean_and_cv(arrivals):
    g = _gaps(arrivals)
    assert g.mean() == pytest.approx(0.25, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(arrivals.cv, rel=0.06)
    assert list(_gaps(arrivals, n=50)) == list(_gaps(arrivals, n=50))  # seeded


def test_arrivals_parse():
    assert Arrivals.parse("poisson") == Arrivals() and Arrivals.parse("gamma:1.83") == Arrivals("gamma", 1.83)
    for bad in ("gamma", "gamma:0", "gamma:x", "poisson:2", "uniform", "gamma:inf"):
        with pytest.raises(ConfigError, match="'poisson' or 'gamma:CV'"):
            Arrivals.parse(bad)


@pytest.mark.parametrize("name,prompt,output", [("coding", 1500, 13), ("conversation", 1020, 129)])
def test_profiles_match_splitwise_medians(name, prompt, output):
    entries, cut = profile_trace(name, rate=2000, duration_s=3, seed=0, max_seq=10**9)
    n = np.array([e.prompt_len for e in entries])
    m = np.array([e.output_len for e in entries])
    assert cut == 0 and 5000 < len(entries) < 7000
    assert np.median(n) == pytest.approx(prompt, rel=0.05)
    assert np.median(m) == pytest.approx(output, rel=0.08)


@pytest.mark.parametrize("name,prompt,output", [("sharegpt", 2340, 438), ("arxiv", 9194, 231)])
def test_profiles_match_layered_prefill_means(name, prompt, output):
    entries, _ = profile_trace(name, rate=2000, duration_s=3, seed=0, max_seq=10**9)
    assert np.mean([e.prompt_len for e in entries]) == pytest.approx(prompt, rel=0.06)
    assert np.mean([e.output_len for e in entries]) == pytest.approx(output, rel=0.06)


def test_length_scale_and_clipping_fit_a_small_machine():
    small, cut = profile_trace("coding", rate=500, duration_s=2, seed=0, max_seq=10**9,
                               length_scale=0.1)
    assert np.median([e.prompt_len for e in small]) == pytest.approx(150, rel=0.08) and cut == 0
    fit, cut = profile_trace("conversation", rate=500, duration_s=2, seed=0, max_seq=128,
                             length_scale=0.1, arrivals=Arrivals("gamma", 2.0))
    assert all(e.prompt_len + e.output_len - 1 <= 128 and e.output_len >= 1 for e in fit)
    assert 0 < cut < len(fit)
    with pytest.raises(ConfigError, match="unknown synthetic profile 'chat'"):
        profile_trace("chat", rate=1, duration_s=1, seed=0, max_seq=8)
    assert set(PROFILES) == {"coding", "conversation", "sharegpt", "arxiv"}


def test_scale_clip_and_rate():
    es = [TraceEntry(0.0, 10, 4), TraceEntry(2.0, 3, 9, (1, 2, 3)), TraceEntry(4.0, 1, 1)]
    assert mean_rate(es) == 0.5
    got = scale(es, rate_scale=2.0, length_scale=0.5)
    assert got == [TraceEntry(0.0, 5, 2), TraceEntry(1.0, 2, 4, (1, 2)), TraceEntry(2.0, 1, 1)]
    assert mean_rate(got) == 1.0
    cut, n = clip(es, 8)
    assert n == 2 and cut[0] == TraceEntry(0.0, 8, 1) and cut[1] == TraceEntry(2.0, 3, 6, (1, 2, 3))
    with pytest.raises(ConfigError):
        scale(es, rate_scale=0)


def test_load_trace_specs(tmp_path):
    opts = TraceOptions(rate=20, duration_s=1, seed=3, max_seq=16, prompt_mean=8, output_mean=4)
    old = synthetic_trace(rate=20, duration_s=1, seed=3, prompt_mean=8, output_mean=4, max_seq=16)
    assert load_trace("synthetic", opts).entries == old  # today's synthetic trace is unchanged
    bursty = load_trace("synthetic", replace(opts, arrivals=Arrivals("gamma", 3.0)))
    assert bursty.entries != old and all(e.prompt_len + e.output_len - 1 <= 16 for e in bursty.entries)
    coding = load_trace("synthetic:coding", TraceOptions(rate=20, duration_s=1, max_seq=64))
    assert coding.entries and coding.clipped == len(coding.entries)  # 1500 tokens do not fit 64
    f = tmp_path / "a.csv"
    f.write_text(AZURE)
    fast = load_trace(str(f), TraceOptions(duration_s=2.2, rate_scale=2.0, length_scale=0.5))
    assert [(round(e.arrival_s, 3), e.prompt_len) for e in fast.entries] == [(0.0, 187), (2.157, 198)]
    clipped = load_trace(str(f), TraceOptions(max_seq=256, clip_files=True, length_scale=0.5))
    assert clipped.clipped == 1 and max(e.prompt_len for e in clipped.entries) == 256
    sg = tmp_path / "conv.data"
    sg.write_text(json.dumps(SHAREGPT))
    got = load_trace(str(sg), TraceOptions(fmt="sharegpt", rate=1.0, duration_s=math.inf))
    assert len(got.entries) == 2
