"""The OpenAI server (issue 23): the wire format, stop strings, bad requests, disconnects and
concurrency on a fake executor (next token = last + 1) with the tiny GGUF's tokenizer, so no
kernel is compiled; the real path (tiny GGUF, tuned kernels, `sandwichc serve` as a process,
the official `openai` client) in the `tvm` tests. Servers listen on 127.0.0.1 and stop when
their test ends."""

import asyncio
import contextlib
import json
import re
import threading
import time

import httpx
import numpy as np
import pytest
from engine_fakes import FakeExecutor, RandomExecutor
from gguf_tiny import CONFIG, write_tiny_gguf

from sandwich.runtime import openai_api as api
from sandwich.runtime.engine import Engine, Request
from sandwich.runtime.engine_loop import EngineLoop
from sandwich.runtime.http_server import OpenAIServer, ServerSettings, bind, make_uvicorn
from sandwich.runtime.openai_api import ApiError
from sandwich.runtime.text_stream import TextStream
from sandwich.runtime.tokenizer import load_tokenizer

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")[0]


@pytest.fixture(scope="module")
def tok(tiny):
    return load_tokenizer(tiny)


@contextlib.contextmanager
def serving(executor, tok, *, max_body=1 << 20, api_key=None, speculation=None):
    """An in-process server on a free 127.0.0.1 port over `executor`; stopped on exit."""
    loop = EngineLoop(Engine(executor, speculation=speculation)).start()
    server = OpenAIServer(loop, tok, ServerSettings("tiny", max_body, api_key))
    sock = bind("127.0.0.1", 0)
    uv = make_uvicorn(server.app())
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        uv.should_exit = True
        thread.join(20)
        loop.stop()


def _expected(tok, prompt_ids, n, vocab=CONFIG["vocab"]):
    """What the fake executor generates, cut at the tokenizer's first stop id, as text."""
    ids = []
    for i in range(1, n + 1):
        ids.append((prompt_ids[-1] + i) % vocab)
        if ids[-1] in tok.stop_ids:
            break
    return tok.decode(ids), len(ids), "stop" if ids[-1] in tok.stop_ids else "length"


# -- the wire format -------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": ["x"] * 8, "n": 17}, "n"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stop": 3}, "stop"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": "high"}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": True}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [5, 1]}, "logit_bias"),
    ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ({"prompt": "x", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "x", "stop_token_ids": [1, -2]}, "stop_token_ids"),
    ({"prompt": ["a", 5]}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "model": 7}, "model"),
    ({"prompt": "x", "structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"choice": "a"}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"json": "{not json"}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"grammar": "start: foo"}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": 5}, "structured_outputs"),
    ({"prompt": "x", "response_format": {"type": "json_object"},
      "structured_outputs": {"regex": "a"}}, "structured_outputs"),
])
def test_bad_completion_fields_are_named(body, param):
    with pytest.raises(ApiError) as e:
        api.parse_completion(body)
    assert e.value.param == param and e.value.status == 400


@pytest.mark.parametrize("body, param", [
    ({}, "messages"), ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    *[({"messages": [{"role": "user", "content": "x"}], **extra}, param) for extra, param in [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": "yes"},
         "parallel_tool_calls"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}},
         "response_format"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}]}, "messages[0]"),
    ]],
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": "json"}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objectx"}}}},
     "response_format"),
])
def test_bad_chat_fields_are_named(body, param):
    with pytest.raises(ApiError) as e:
        api.parse_chat(body)
    assert e.value.param == param


def test_good_bodies_and_defaults():
    assert api.parse_completion({"prompt": "x", "logprobs": False}).logprobs is None  # as null
    assert api.parse_completion({"prompt": "x", "logprobs": 0, "echo": True, "max_tokens": 0}).max_tokens == 0
    assert api.parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True}).logprobs == 0
    p = api.parse_completion({"prompt": [[1, 2, 3]], "stop": "\n", "seed": 4})
    assert (p.prompts, p.stop, p.seed, p.max_tokens, p.temperature) == (((1, 2, 3),), ("\n",), 4, 16, 1.0)
    b = api.parse_completion({"prompt": ["a", [5, 6]], "n": 3})
    assert (b.prompts, b.n, b.choices) == (("a", (5, 6)), 3, 6)
    c = api.parse_chat({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                        {"type": "text", "text": "b"}]}],
                        "max_completion_tokens": 5, "stream": True,
                        "stream_options": {"include_usage": True}})
    assert c.messages == ({"role": "system", "content": "ab"},)
    assert (c.max_tokens, c.stream, c.include_usage) == (5, True, True)
    assert api.parse_chat({"messages": [{"role": "user", "content": "x"}]}).max_tokens is None


def test_logit_adjustments_are_read_as_openai_and_vllm_send_them():
    p = api.parse_chat({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"7": -100, "12": 3.5},
                        "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.1})
    assert p.logit_bias == ((7, -100.0), (12, 3.5))
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -1.0, 1.1)
    q = api.parse_completion({"prompt": "x", "logit_bias": None, "presence_penalty": None})
    assert (q.logit_bias, q.presence_penalty, q.repetition_penalty) == ((), 0.0, 1.0)


def test_stop_strings_are_held_back_and_cut():
    pieces = iter(["Hel", "lo ", "wor", "ld", "!"])
    s = TextStream(lambda _: next(pieces), stop=("lo w", "xyz"))
    out = [s.push(0) for _ in range(3)]
    assert out == ["He", "l", ""] and s.stopped  # "l", then "lo ", might start "lo w": held
    assert s.push(0) == "" and s.flush() == ""
    pieces = iter(["ab", "x", "y!"])
    s = TextStream(lambda _: next(pieces), stop=("xyz",))
    assert [s.push(0) for _ in range(3)] == ["ab", "", "xy!"] and not s.stopped
    pieces = iter(["tail x"])
    s = TextStream(lambda _: next(pieces), stop=("xyz",))
    assert s.push(0) == "tail " and s.flush() == "x"  # the end releases what was held


def test_a_reply_that_ends_inside_a_character_ends_as_the_whole_reply_decodes():
    """The incremental decoder holds back an incomplete UTF-8 sequence for ever; the whole
    reply decodes it as U+FFFD, and `generate --json` shows that: so does the stream's end."""
    def stream(pieces, decoded, stop=()):
        it = iter(pieces)
        return TextStream(lambda _: next(it), stop, lambda ids: decoded[len(ids)])

    s = stream(["a", "b", ""], {3: "ab\ufffd"})
    assert [s.push(i) for i in range(3)] == ["a", "b", ""] and s.flush() == "\ufffd"
    s = stream(["a", "xy", ""], {3: "axy\ufffd"}, stop=("xy",))
    assert [s.push(i) for i in range(2)] == ["a", ""] and s.stopped and s.flush() == ""
    s = stream(["a ", "b"], {2: "a b c"}, stop=("b c",))  # the end completes a stop string
    assert [s.push(i) for i in range(2)] == ["a ", ""] and s.flush() == ""
    s = stream(["a ", "b"], {2: "a b!"}, stop=("b c",))  # held back "b", then released
    assert [s.push(i) for i in range(2)] == ["a ", ""] and s.flush() == "b!"
    s = stream(["a", "b"], {2: "A B"})  # a decoding that disagrees adds nothing
    assert [s.push(i) for i in range(2)] == ["a", "b"] and s.flush() == ""


def test_the_stream_of_the_tiny_tokenizer_ends_as_its_decode(tmp_path):
    """Random replies of the tiny GGUF's tokenizer: without a stop string, what is sent is
    exactly the reply's decoding, U+FFFD at a broken end included."""
    import random

    from gguf_tiny import write_tiny_gguf

    from sandwich.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer(write_tiny_gguf(tmp_path / "t.gguf")[0])
    rnd, broken = random.Random(0), 0
    for _ in range(300):
        ids = [rnd.randrange(tok.backend.get_vocab_size()) for _ in range(rnd.randrange(1, 20))]
        s = TextStream(tok.stream(), (), tok.decode)
        whole = tok.decode(ids)
        assert "".join(s.push(t) for t in ids) + s.flush() == whole
        broken += whole.endswith("\ufffd")
    assert broken > 10  # the case under test occurs


def test_cancel_frees_a_running_slot_and_a_queued_request():
    fake = FakeExecutor(max_batch=1, max_seq=64)
    engine = Engine(fake)
    a = engine.submit(Request(prompt=(3,), max_new_tokens=50))
    b = engine.submit(Request(prompt=(4,), max_new_tokens=50))
    engine.step()
    assert engine.running == 1 and fake.kv.in_use()
    assert engine.cancel(a) and not fake.kv.in_use() and engine.running == 0
    assert engine.cancel(b) and not engine.busy and not engine.cancel(b)


# -- the server on a fake executor -----------------------------------------------------------
def test_completions_and_chat_equal_the_engine_streamed_or_not(tok):
    prompt = tok.encode("hello world")
    want, n, finish = _expected(tok, prompt, 6)
    with serving(FakeExecutor(max_batch=4, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="tiny", prompt="hello world", max_tokens=6, temperature=0)
        assert r.choices[0].text == want and r.choices[0].finish_reason == finish
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), n)
        chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=6,
                                                temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == want
        assert chunks[-1].choices[0].finish_reason == finish
        msgs = [{"role": "user", "content": "hi"}]
        chat_prompt = tok.encode(tok.render_chat(msgs))
        want_chat = _expected(tok, chat_prompt, 5)[0]
        c = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
        assert c.choices[0].message.content == want_chat and c.choices[0].message.role == "assistant"
        stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        parts = list(stream)
        assert parts[0].choices[0].delta.role == "assistant"
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == want_chat
        assert parts[-1].choices == [] and parts[-1].usage.prompt_tokens == len(chat_prompt)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        assert client.models.retrieve("tiny").id == "tiny"
        with pytest.raises(openai.NotFoundError, match="not served here"):
            client.models.retrieve("gpt-4o")
        assert httpx.get(url + "/health").json()["status"] == "ok"


def test_logit_bias_and_penalties_reach_the_engine_through_the_openai_client(tok):
    """The fake model's logits are 1 on last + 1 and 0 elsewhere: a bias of 100 on one token
    makes the reply that token; with a bias of 2.5 a frequency penalty of 2 moves greedy
    decoding off it after one pick; vLLM's repetition_penalty travels in extra_body; a bias on a token beyond the
    vocabulary is a 400 naming logit_bias, and the server goes on."""
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        forced = tok.encode("hello")[0]

        def text(**kw):
            return client.completions.create(model="tiny", prompt=[1, 2], max_tokens=4, temperature=0,
                                             **kw).choices[0].text

        assert text(logit_bias={str(forced): 100}) == tok.decode([forced] * 4)
        assert text() == tok.decode([3, 4, 5, 6])
        # its logit 0 + 2.5 beats the model's 1.0 once; then 2.5 - 2 does not
        assert text(logit_bias={str(forced): 2.5}, frequency_penalty=2.0) == tok.decode([forced + i for i in range(4)])
        assert text(extra_body={"repetition_penalty": 1.5}) == text()
        with pytest.raises(openai.BadRequestError, match="outside the vocabulary") as e:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                           logit_bias={str(CONFIG["vocab"]): 1})
        assert e.value.body["param"] == "logit_bias"
        assert text() == tok.decode([3, 4, 5, 6])


def test_n_choices_of_a_batch_of_prompts_streamed_or_not(tok):
    """Completions with two prompts and n=2: four choices, prompt by prompt, each the
    engine's reply to its prompt, streamed (the chunks interleave, each naming its index)
    or not; usage counts each prompt once. Chat's n sampled choices differ, and choice j is
    what one request seeded seed + j gets; every slot is free afterwards."""
    fake = FakeExecutor(max_batch=3, max_seq=64, vocab=CONFIG["vocab"])
    prompts = [[10, 11], [40]]
    want = [_expected(tok, q, 5) for q in prompts for _ in range(2)]
    with serving(fake, tok) as (url, server):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=5, temperature=0,
                                      logprobs=1)
        assert [c.index for c in r.choices] == [0, 1, 2, 3]
        assert [(c.text, c.finish_reason) for c in r.choices] == [(t, f) for t, _, f in want]
        assert [len(c.logprobs.tokens) for c in r.choices] == [n for _, n, _ in want]
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, sum(n for _, n, _ in want))
        chunks = list(client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=5,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        texts, finishes = [""] * 4, [None] * 4
        for c in chunks[:-1]:
            (x,) = c.choices
            texts[x.index] += x.text
            finishes[x.index] = x.finish_reason or finishes[x.index]
        assert list(zip(texts, finishes, strict=True)) == [(t, f) for t, _, f in want]
        assert chunks[-1].usage.prompt_tokens == 3

        msgs = [{"role": "user", "content": "hi"}]

        def chat(n, seed):
            c = client.chat.completions.create(model="tiny", messages=msgs, n=n, max_tokens=6,
                                               temperature=1.5, seed=seed)
            return [x.message.content for x in c.choices]

        three = chat(3, 21)
        assert len(set(three)) == 3 and chat(3, 21) == three
        assert [chat(1, 21 + j)[0] for j in range(3)] == three
        _wait(lambda: server.loop.engine.running == 0 and not fake.kv.in_use())


def test_metrics_count_choices_tokens_errors_and_latencies(tok):
    """GET /metrics in Prometheus' text format: two completions choices and a streamed chat
    reply counted by API and outcome, their prompt and generated tokens, one latency sample
    each, a refused request by its status, and the engine idle."""
    from prometheus_client.parser import text_string_to_metric_families

    msgs = [{"role": "user", "content": "hi"}]
    chat_prompt = tok.encode(tok.render_chat(msgs))
    _, n_chat, chat_finish = _expected(tok, chat_prompt, 3)
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        client.completions.create(model="tiny", prompt=[1, 2], n=2, max_tokens=4, temperature=0)
        list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3,
                                            temperature=0, stream=True))
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "top_p": 0}).status_code == 400
        r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for f in text_string_to_metric_families(r.text) for s in f.samples}
    assert m[("sandwichc_requests_total", (("api", "completions"), ("outcome", "length")))] == 2
    assert m[("sandwichc_requests_total", (("api", "chat"), ("outcome", chat_finish)))] == 1
    assert m[("sandwichc_prompt_tokens_total", ())] == 2 * 2 + len(chat_prompt)
    assert m[("sandwichc_generation_tokens_total", ())] == 2 * 4 + n_chat
    assert m[("sandwichc_time_to_first_token_seconds_count", ())] == 3
    assert m[("sandwichc_e2e_request_latency_seconds_count", ())] == 3
    assert 0 < m[("sandwichc_time_to_first_token_seconds_sum", ())] <= m[
        ("sandwichc_e2e_request_latency_seconds_sum", ())]
    assert m[("sandwichc_error_responses_total", (("status", "400"),))] == 1
    assert m[("sandwichc_requests_running", ())] == m[("sandwichc_requests_waiting", ())] == 0
    assert ("sandwichc_prefix_reused_tokens_total", ()) in m
    assert m[("sandwichc_spec_decode_draft_tokens_total", ())] == 0  # speculation is off


def test_a_conversation_the_chat_template_refuses_is_a_400(tok):
    import dataclasses

    strict = dataclasses.replace(tok, chat_template=(
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('a system message must come first') }}{% endif %}{{ m['content'] }}{% endfor %}"))
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), strict) as (url, _):
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [
            {"role": "user", "content": "a"}, {"role": "system", "content": "b"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert "a system message must come first" in r.json()["error"]["message"]
        ok = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                            "max_tokens": 2})
        assert ok.status_code == 200


def test_a_speculating_server_replies_the_same_and_counts_its_drafts(tok):
    from engine_fakes import SpeculatingExecutor

    from sandwich.runtime.speculate import Speculation

    def reply(url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        return client.completions.create(model="tiny", prompt=[5, 6, 7, 8, 9, 5, 6], max_tokens=8,
                                         temperature=0).choices[0].text
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        plain = reply(url)
    with serving(SpeculatingExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok,
                 speculation=Speculation(draft=4)) as (url, server):
        assert reply(url) == plain
        m = server.metrics.registry.get_sample_value
        assert m("sandwichc_spec_decode_draft_tokens_total") > m("sandwichc_spec_decode_accepted_tokens_total") > 0


def test_structured_output_fields_are_read_as_openai_and_vllm_send_them():
    msgs = [{"role": "user", "content": "x"}]
    assert api.parse_chat({"messages": msgs, "response_format": {"type": "text"}}).structure is None
    js = api.parse_chat({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})
    assert js.structure.kind == "json" and json.loads(js.structure.spec)["properties"] == {"a": {"type": "integer"}}
    assert json.loads(api.parse_chat({"messages": msgs, "response_format": {"type": "json_object"}})
                      .structure.spec) == {"type": "object"}
    read = [api.parse_completion({"prompt": "x", "structured_outputs": so}).structure for so in (
        {"regex": "a+"}, {"choice": ["a", "b"]}, {"grammar": 'start: "a"'}, {"json": '{"type": "string"}'},
        {"json_object": True})]
    assert [(x.kind, x.spec) for x in read] == [
        ("regex", "a+"), ("choice", '["a", "b"]'), ("grammar", 'start: "a"'), ("json", '{"type": "string"}'),
        ("json", '{"type": "object"}')]


def test_structured_replies_through_the_openai_client(tok):
    """Random logits (every token possible): a chat reply under a JSON schema parses and fits
    it, streamed or not; n sampled choices each parse; vLLM's structured_outputs (a regex,
    streamed; choices) travel in extra_body; a bad regex is a 400 naming its field; every
    structured reply ends 'stop' by its grammar, well before max_tokens."""
    schema = {"type": "object", "additionalProperties": False, "required": ["n", "ok"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"}}}

    def fits(text):
        x = json.loads(text)
        return set(x) == {"n", "ok"} and type(x["n"]) is int and 0 <= x["n"] <= 999 and type(x["ok"]) is bool
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    with serving(RandomExecutor(max_batch=4, max_seq=256, vocab=CONFIG["vocab"]), tok) as (url, server):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "x"}]
        r = client.chat.completions.create(model="tiny", messages=msgs, response_format=fmt, n=3, seed=1,
                                           max_tokens=200)
        assert all(c.finish_reason == "stop" and fits(c.message.content) for c in r.choices)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="tiny", messages=msgs, response_format=fmt, seed=1, max_tokens=200, stream=True))
        assert streamed == r.choices[0].message.content
        obj = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=200, seed=2,
                                             response_format={"type": "json_object"})
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
        pieces = client.completions.create(model="tiny", prompt="a", max_tokens=50, stream=True, seed=3,
                                           extra_body={"structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}})
        assert re.fullmatch("[a-z]{3}-[0-9]{2}", "".join(c.choices[0].text for c in pieces))
        picks = client.completions.create(model="tiny", prompt="a", max_tokens=50, n=4, seed=4, extra_body={
            "structured_outputs": {"choice": ["red", "green", "blue"]}})
        assert {c.text for c in picks.choices} <= {"red", "green", "blue"}
        with pytest.raises(openai.BadRequestError, match="invalid regex") as e:
            client.completions.create(model="tiny", prompt="a", extra_body={"structured_outputs": {"regex": "(a"}})
        assert e.value.body["param"] == "structured_outputs"
        _wait(lambda: server.loop.engine.running == 0)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 7}}}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}


def test_tools_are_read_into_the_calls_json_and_earlier_calls_into_the_conversation():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]
    p = api.parse_chat({"messages": msgs, "tools": [WEATHER, CLOCK]})
    assert (p.tools.choice, p.tools.parallel, [t.name for t in p.tools.tools]) == ("auto", True, ["get_weather", "now"])
    assert p.messages[2]["content"] == '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}'
    assert p.structure.kind == "json" and json.loads(p.structure.spec) == p.tools.schema()
    convo = p.tools.messages(p.messages)
    assert len(convo) == 4 and convo[0]["content"].startswith("Be brief.\n\nYou can call these tools: ")
    assert '"get_weather"' in convo[0]["content"] and p.messages[0]["content"] == "Be brief."
    named = api.parse_chat({"messages": msgs[1:2], "tools": [WEATHER, CLOCK], "parallel_tool_calls": False,
                            "tool_choice": {"type": "function", "function": {"name": "now"}}}).tools
    assert [t.name for t in named.callable] == ["now"] and named.messages(msgs[1:2])[0]["role"] == "system"
    assert named.schema()["properties"]["tool_calls"]["maxItems"] == 1
    assert api.parse_chat({"messages": msgs, "tools": [WEATHER], "tool_choice": "none"}).tools is None
    content, calls = p.tools.reply('{"tool_calls": [{"name": "now", "arguments": {}}]}')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("now", "{}")]
    assert p.tools.reply('{"response": "Hi"}') == ("Hi", ())
    assert p.tools.reply('{"tool_calls": [{"na') == ('{"tool_calls": [{"na', ())  # cut by max_tokens


def test_tool_calls_through_the_openai_client(tok):
    """Random logits: 'required' always calls, with arguments that fit the tool's parameters;
    a named tool is the only one called; without parallel calls there is one; 'auto' calls or
    answers; streamed, each call's start comes first, then its arguments in pieces (and the
    SDK's stream helper puts them together); 'none' is the plain reply; the prompt
    carries the tools; a conversation with earlier calls and their results goes through."""
    with serving(RandomExecutor(max_batch=4, max_seq=4096, vocab=CONFIG["vocab"]), tok) as (url, server):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "Weather in Oslo?"}]

        def chat(**kw):
            return client.chat.completions.create(model="tiny", messages=msgs, **{"max_tokens": 1000, **kw})

        def fits(call):
            args = json.loads(call.function.arguments)
            if call.function.name == "now":
                return args == {}
            return (call.function.name == "get_weather" and args["city"] in ("Paris", "Oslo")
                    and set(args) <= {"city", "days"} and 1 <= args.get("days", 1) <= 7)
        r = chat(tools=[WEATHER, CLOCK], tool_choice="required", n=4, seed=5)
        for c in r.choices:
            assert c.finish_reason == "tool_calls" and c.message.content is None
            assert c.message.tool_calls and all(fits(t) and t.id.startswith("call_") for t in c.message.tool_calls)
        assert "get_weather" in tok.decode(server.loop.engine.ex.starts[-1][1])  # the tools are in the prompt
        named = chat(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "now"}},
                     parallel_tool_calls=False, n=3, seed=6)
        assert all([t.function.name for t in c.message.tool_calls] == ["now"] for c in named.choices)
        auto = chat(tools=[WEATHER], n=6, seed=7).choices  # an answer may run to max_tokens: its raw text
        kinds = {c.finish_reason for c in auto}
        assert "tool_calls" in kinds and kinds <= {"tool_calls", "stop", "length"}
        assert all(c.message.content is None and all(map(fits, c.message.tool_calls)) if c.finish_reason == "tool_calls"
                   else c.message.content and c.message.tool_calls is None for c in auto)
        calls, pieces = {}, 0  # streamed: each call's start, then its arguments' text in pieces
        for ch in chat(tools=[WEATHER, CLOCK], tool_choice="required", seed=5, stream=True):
            for t in ch.choices[0].delta.tool_calls or []:
                if t.id:
                    assert t.index == len(calls) and t.function.name and t.function.arguments == ""
                    calls[t.index] = [t.id, t.function.name, ""]
                else:
                    calls[t.index][2] += t.function.arguments
                    pieces += 1
        want = r.choices[0].message.tool_calls
        assert [(n, json.loads(a)) for _, n, a in calls.values()] == \
            [(t.function.name, json.loads(t.function.arguments)) for t in want]
        assert pieces > 2 * len(calls) and all(i.startswith("call_") for i, _, _ in calls.values())
        with client.chat.completions.stream(model="tiny", messages=msgs, max_tokens=1000, seed=5,
                                            tools=[WEATHER, CLOCK], tool_choice="required") as s:
            final = s.get_final_completion().choices[0]  # the SDK's own accumulation of the deltas
        assert final.finish_reason == "tool_calls" and [
            (t.function.name, json.loads(t.function.arguments)) for t in final.message.tool_calls] == \
            [(t.function.name, json.loads(t.function.arguments)) for t in want]
        seed, answer = next((s, c) for s in range(40)  # a seed whose reply answers, not calls
                            if (c := chat(tools=[WEATHER], seed=s, max_tokens=400).choices[0]).finish_reason == "stop")
        deltas = [c.choices[0] for c in chat(tools=[WEATHER], seed=seed, max_tokens=400, stream=True)]
        texts = [d.delta.content for d in deltas if d.delta.content]
        assert "".join(texts) == answer.message.content and len(texts) > 3  # streamed as it comes, unescaped
        assert deltas[-1].finish_reason == "stop" and not any(d.delta.tool_calls for d in deltas)
        assert chat(tools=[WEATHER], tool_choice="none", seed=8).choices[0].message.content == chat(seed=8).choices[0].message.content
        cut = chat(tools=[WEATHER], tool_choice="required", max_tokens=3, seed=5).choices[0]
        assert (cut.finish_reason, cut.message.tool_calls) == ("length", None) and cut.message.content
        call = r.choices[0].message.tool_calls[0]
        later = client.chat.completions.create(model="tiny", max_tokens=300, seed=9, tools=[WEATHER, CLOCK], messages=[
            *msgs, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "-3 C"}])
        assert later.choices[0].finish_reason in ("stop", "tool_calls")
        _wait(lambda: server.loop.engine.running == 0)


def test_tokenize_and_detokenize_as_vllm_serves_them(tok):
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        r = httpx.post(url + "/tokenize", json={"model": "tiny", "prompt": "hello world"}).json()
        assert r == {"count": len(tok.encode("hello world")), "max_model_len": 64, "tokens": tok.encode("hello world")}
        msgs = [{"role": "user", "content": "hi"}]
        chat = httpx.post(url + "/tokenize", json={"messages": msgs}).json()["tokens"]
        assert chat == tok.encode(tok.render_chat(msgs))  # what the chat API prefills
        bare = httpx.post(url + "/tokenize", json={"messages": msgs, "add_generation_prompt": False}).json()
        assert bare["tokens"] == tok.encode(tok.render_chat(msgs, add_generation_prompt=False))
        assert httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "hello world"}
        for path, body, param in [("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 5}, "prompt"),
                                  ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
                                  ("/tokenize", {"prompt": "x", "add_special_tokens": "no"}, "add_special_tokens"),
                                  ("/detokenize", {"tokens": [1, CONFIG["vocab"]]}, "tokens"),
                                  ("/detokenize", {"tokens": "1"}, "tokens")]:
            bad = httpx.post(url + path, json=body)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (path, body)


def test_an_api_key_guards_the_v1_routes_and_leaves_the_probes_open(tok):
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok, api_key="s3cret") as (url, _):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"}):
            r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            assert httpx.get(url + "/v1/models", headers=headers).status_code == 401
        assert httpx.get(url + "/health").status_code == 200
        assert 'sandwichc_error_responses_total{status="401"} 6.0' in httpx.get(url + "/metrics").text
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model="tiny", prompt=[1, 2], max_tokens=2, temperature=0).choices[0].text
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_vllms_length_controls_as_benchmark_clients_send_them(tok):
    """The fake model's next token is last + 1, so a prompt ending just before an end-of-turn
    id replies with that id alone; `min_tokens` holds every stop id back (greedy takes the
    best of the rest) for that many tokens; `ignore_eos` runs through it to max_tokens; `stop_token_ids`
    ends the reply at an id of the client's."""
    eos = max(tok.stop_ids)
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

        def reply(**extra):
            r = client.completions.create(model="tiny", prompt=[eos - 1], max_tokens=6, temperature=0,
                                          logprobs=0, extra_body=extra)
            return r.choices[0].finish_reason, r.usage.completion_tokens

        assert reply() == ("stop", 1)
        assert reply(min_tokens=3) == ("stop", 4)  # three others, then the end-of-turn id
        assert reply(ignore_eos=True) == ("length", 6)
        assert reply(ignore_eos=True, stop_token_ids=[eos + 2]) == ("stop", 3)
        with pytest.raises(openai.BadRequestError, match="min_tokens") as e:
            reply(min_tokens=7)
        assert e.value.body["param"] == "min_tokens"
        with pytest.raises(openai.BadRequestError, match="outside the vocabulary") as e:
            reply(stop_token_ids=[CONFIG["vocab"]])
        assert e.value.body["param"] == "stop_token_ids"


def test_a_stop_string_ends_the_reply_before_it(tok):
    prompt = tok.encode("hello world")
    full, _, _ = _expected(tok, prompt, 12)
    stop = full[3:6]
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, server):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                      stop=[stop])
        assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"
        s = "".join(c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=prompt, max_tokens=12, temperature=0, stop=stop, stream=True))
        assert s == r.choices[0].text
        _wait(lambda: server.loop.engine.running == 0)  # the stopped requests left their slots


def test_logprobs_of_every_token_streamed_or_not_in_both_apis(tok):
    """Each token's log-probability and its likeliest alternatives, in chat's and in the
    completions API's shape: one entry per token of the reply (the stop token has none), its
    bytes joining to the text, the same figures streamed or not, and the model's own figures
    at any temperature."""
    from sandwich.runtime.logprobs import log_softmax

    vocab = CONFIG["vocab"]
    hot, cold = (float(v) for v in log_softmax(np.eye(vocab)[0])[:2])  # the fake's one-hot rows
    msgs = [{"role": "user", "content": "hi"}]
    chat_prompt = tok.encode(tok.render_chat(msgs))
    want, n, finish = _expected(tok, chat_prompt, 9)
    ids = [(chat_prompt[-1] + i) % vocab for i in range(1, n + 1)]
    shown = [t for t in ids if t not in tok.stop_ids]
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=vocab), tok) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        c = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=9, temperature=0,
                                           logprobs=True, top_logprobs=2)
        content = c.choices[0].logprobs.content
        assert c.choices[0].message.content == want and len(content) == len(shown)
        assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == want
        assert [e.logprob for e in content] == [pytest.approx(hot)] * len(shown)
        assert [[a.logprob for a in e.top_logprobs] for e in content] == \
            [[pytest.approx(hot), pytest.approx(cold)]] * len(shown)
        assert all(e.top_logprobs[0].token == e.token for e in content)
        parts = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=9,
                                                    temperature=0, logprobs=True, top_logprobs=2,
                                                    stream=True))
        streamed = [e for p in parts if p.choices and p.choices[0].logprobs
                    for e in p.choices[0].logprobs.content]
        assert [(e.token, e.bytes, e.logprob) for e in streamed] == [(e.token, e.bytes, e.logprob) for e in content]
        hot_sampled = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4,
                                                     temperature=2.0, seed=3, logprobs=True)
        assert all(e.logprob in (pytest.approx(hot), pytest.approx(cold)) and e.top_logprobs == []
                   for e in hot_sampled.choices[0].logprobs.content)
        assert client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                              temperature=0).choices[0].logprobs is None

        prompt = tok.encode("hello world")
        text = _expected(tok, prompt, 6)[0]
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        assert r.choices[0].text == text and len(lp.tokens) == len(lp.token_logprobs) == 6
        assert lp.token_logprobs == [pytest.approx(hot)] * 6 and all(len(d) == 3 for d in lp.top_logprobs)
        assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
        assert all(text.startswith(t, o) for t, o in zip(lp.tokens, lp.text_offset, strict=True)
                   if "\\x" not in t)
        chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=6,
                                                temperature=0, logprobs=3, stream=True))
        assert [t for ch in chunks if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens] == lp.tokens


def test_echo_returns_the_prompt_and_scores_it_as_lm_eval_asks(tok):
    """The completions API's echo: the prompt comes back before the reply; with logprobs each
    prompt token after the first is scored (the first has null figures), which is how
    evaluation harnesses score a text (max_tokens 0, or 1 and the last dropped)."""
    from sandwich.runtime.logprobs import log_softmax

    vocab = CONFIG["vocab"]
    hot, cold = (float(v) for v in log_softmax(np.eye(vocab)[0])[:2])
    prompt = tok.encode("hello world, the quick brown fox")
    echo = tok.decode(prompt)
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=vocab), tok) as (url, server):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                      temperature=0)
        lp = r.choices[0].logprobs
        assert r.choices[0].text == echo and r.usage.completion_tokens == 0
        assert len(lp.tokens) == len(prompt) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        # the fake's row after token t is one-hot at t + 1
        want = [hot if b == (a + 1) % vocab else cold for a, b in zip(prompt, prompt[1:], strict=False)]
        assert lp.token_logprobs[1:] == [pytest.approx(v) for v in want]
        assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
        more = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, echo=True, logprobs=0,
                                         temperature=0)
        reply = _expected(tok, prompt, 3)[0]
        assert more.choices[0].text == echo + reply and more.usage.completion_tokens == 3
        assert len(more.choices[0].logprobs.tokens) == len(prompt) + 3
        assert more.choices[0].logprobs.text_offset[len(prompt)] == len(echo)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=prompt, max_tokens=3, echo=True, temperature=0, stream=True))
        assert streamed == echo + reply
        assert "".join(c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=prompt, max_tokens=0, echo=True, stream=True)) == echo
        with pytest.raises(openai.BadRequestError, match="not streamed"):
            client.completions.create(model="tiny", prompt=prompt, echo=True, logprobs=1, stream=True)
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.completions.create(model="tiny", prompt=prompt, max_tokens=0)
        _wait(lambda: server.loop.engine.running == 0)


BAD = [
    (b"{not json", "not valid JSON"),
    (json.dumps({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}).encode(),
     "not served here"),
    (json.dumps({"model": "tiny"}).encode(), "'messages' is required"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 500}).encode(),
     "max_seq"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": -0.5}).encode(),
     "temperature"),
    (b'{"messages": [{"role": "user", "content": "' + b"x" * (10 << 20) + b'"}]}',
     "larger than the server's limit"),
    (json.dumps([1, 2]).encode(), "JSON object"),
]


def test_bad_requests_get_400_with_an_error_body_and_the_server_goes_on(tok):
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        for body, says in BAD:
            r = httpx.post(url + "/v1/chat/completions", content=body, timeout=60,
                           headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (says, r.text[:200])
            err = r.json()["error"]
            assert says in err["message"] and err["type"] == "invalid_request_error", err
        ok = httpx.post(url + "/v1/chat/completions", timeout=60,
                        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None
        missing = httpx.get(url + "/v1/nothing")
        assert missing.status_code == 404 and "error" in missing.json()
        assert httpx.get(url + "/v1/completions").status_code == 405


def test_a_request_the_engine_cannot_take_fails_alone(tok, monkeypatch):
    """A request whose submit raises inside the engine thread gets a 500 with an error body;
    the engine keeps serving (before, the exception stopped the engine: every later request
    got 503). A negative seed, which used to be such a request, now samples."""
    from sandwich.runtime import engine as engine_mod

    real = engine_mod.Sampler

    def sampler(params, *args):
        if params.seed == 13:
            raise RuntimeError("a fault in the sampler")
        return real(params, *args)

    monkeypatch.setattr(engine_mod, "Sampler", sampler)
    body = {"prompt": "x", "max_tokens": 3, "temperature": 0.7}
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, server):
        bad = httpx.post(url + "/v1/completions", json=body | {"seed": 13}, timeout=60)
        assert bad.status_code == 500
        assert "a fault in the sampler" in bad.json()["error"]["message"]
        assert server.loop.alive and server.loop.in_flight == 0
        for seed in (-1, -1, 2):
            r = httpx.post(url + "/v1/completions", json=body | {"seed": seed}, timeout=60)
            assert r.status_code == 200, r.text[:200]
        assert httpx.get(url + "/health").status_code == 200


def test_clients_that_leave_mid_stream_free_their_slots(tok):
    """max_batch 16, twelve streams of sixteen sequences (four with n=2) killed after their
    first token: a 17th request still runs at once (held slots would make it wait ~60 s for
    the killed streams' max_tokens)."""
    fake = FakeExecutor(max_batch=16, max_seq=4096, vocab=CONFIG["vocab"], step_s=0.015)
    with serving(fake, tok) as (url, server):
        body = {"prompt": [5], "max_tokens": 4000, "stream": True, "temperature": 0}
        lines = []  # the line iterators stay referenced: closing one closes its response
        with contextlib.ExitStack() as streams:
            for n in [1] * 8 + [2] * 4:
                r = streams.enter_context(httpx.stream("POST", url + "/v1/completions",
                                                       json=body | {"n": n}, timeout=30))
                lines.append(r.iter_lines())
                for line in lines[-1]:
                    if line.startswith("data: ") and '"text"' in line:
                        break  # one token seen
            # a stream's second choice may join the batch a step after its first one's token
            _wait(lambda: len(fake.kv.in_use()) == 16 and server.loop.engine.running == 16)
            lines.clear()
        # the sixteen clients went away
        _wait(lambda: server.loop.engine.running == 0 and not fake.kv.in_use())
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"prompt": [5], "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 5
        # a non-streaming client that leaves is noticed too
        with contextlib.suppress(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body | {"stream": False, "n": 3}, timeout=0.5)
        _wait(lambda: server.loop.engine.running == 0 and not fake.kv.in_use())
        # every choice of the clients that left is counted so: 16 streamed, 3 not
        _wait(lambda: server.metrics.registry.get_sample_value(
            "sandwichc_requests_total", {"api": "completions", "outcome": "cancelled"}) == 19)


def test_concurrent_streams_share_one_batch(tok):
    fake = FakeExecutor(max_batch=4, max_seq=64, vocab=CONFIG["vocab"], step_s=0.005)
    prompts = [[10 + 7 * i] for i in range(8)]
    with serving(fake, tok) as (url, server):
        async def one(client, p):
            s = await client.completions.create(model="tiny", prompt=p, max_tokens=8,
                                                temperature=0, stream=True)
            return "".join([c.choices[0].text async for c in s])

        async def main():
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            try:
                return await asyncio.gather(*(one(client, p) for p in prompts))
            finally:
                await client.close()

        texts = asyncio.run(main())
        assert texts == [_expected(tok, p, 8)[0] for p in prompts]
        assert server.loop.engine.stats.max_running == 4  # the requests joined one batch


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- the real path: tuned kernels, `sandwichc serve` as a process, the openai client ---------
@pytest.mark.tvm
def test_sandwichc_serve_answers_as_generate_does(tiny, cache):
    from conftest import tune_model
    from test_gguf import _generate_json

    from sandwich.bench.http_serving import ServerProcess

    tune_model(tiny, cache)
    common = ["--model", str(tiny), "--cache-dir", str(cache.dir), "--no-tune"]

    def generate(*extra):  # the command in this process (test_gguf runs it as its own)
        return _generate_json([*common, "--prompt", "hello world", "--max-new-tokens", "8",
                               *extra])["text"]

    plain, chat = generate(), generate("--chat")
    msgs = [{"role": "user", "content": "hello world"}]
    with ServerProcess(common + ["--max-batch", "4", "--max-seq", "64", "--api-key", "k"], timeout_s=300) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
        kw = dict(model="tiny", max_tokens=8, temperature=0)
        assert client.completions.create(prompt="hello world", **kw).choices[0].text == plain
        assert "".join(c.choices[0].text for c in client.completions.create(
            prompt="hello world", stream=True, **kw)) == plain
        assert client.chat.completions.create(messages=msgs, **kw).choices[0].message.content == chat
        assert "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            messages=msgs, stream=True, **kw)) == chat
        bad = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100},
                         headers={"Authorization": "Bearer k"})
        assert bad.status_code == 400 and "max_seq" in bad.json()["error"]["message"]
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
    assert srv.proc.returncode == 0  # Ctrl-C (SIGINT) stops it cleanly
