"""OpenAI's Responses API (`POST /v1/responses`) through the official client, on the fake
executors with the tiny GGUF's tokenizer: a reply equals the chat API's for the same
conversation; instructions and a stored response's conversation reach the prompt as the chat
template renders them; streamed events arrive in the API's order and add up to the reply;
function tools give function_call items whose results continue the conversation; text.format
holds the reply to a schema; bad requests are 400s naming the Responses API's fields."""

import json

import httpx
import pytest
from engine_fakes import FakeExecutor, RandomExecutor
from gguf_tiny import CONFIG, write_tiny_gguf
from test_http_server import serving

from sandwich.runtime.tokenizer import load_tokenizer

openai = pytest.importorskip("openai")
NOW = {"type": "function", "name": "now", "description": "The time",
       "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                      "required": ["zone"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")[0])


def client_of(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def test_a_reply_is_the_chat_apis_and_a_stored_one_continues(tok):
    with serving(FakeExecutor(max_batch=2, max_seq=256, vocab=CONFIG["vocab"]), tok) as (url, server):
        c = client_of(url)
        r = c.responses.create(model="tiny", input="hi", max_output_tokens=5, temperature=0)
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=5, temperature=0).choices[0]
        assert r.output_text == chat.message.content and r.object == "response" and r.id.startswith("resp_")
        assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")
        assert r.usage.output_tokens == 5 and r.usage.total_tokens == r.usage.input_tokens + 5
        assert r.output[0].type == "message" and r.output[0].role == "assistant"
        r2 = c.responses.create(model="tiny", input=[{"role": "user", "content": [{"type": "input_text", "text": "more"}]}],
                                instructions="Be brief.", previous_response_id=r.id, max_output_tokens=3, temperature=0)
        convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": r.output_text}, {"role": "user", "content": "more"}]
        assert server.loop.engine.ex.starts[-1][1] == tuple(tok.encode(tok.render_chat(convo)))
        assert r2.previous_response_id == r.id and r2.instructions == "Be brief."
        unstored = c.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False)
        with pytest.raises(openai.BadRequestError, match="not stored") as e:
            c.responses.create(model="tiny", input="x", previous_response_id=unstored.id)
        assert e.value.body["param"] == "previous_response_id"
        got = c.responses.retrieve(r2.id)
        assert (got.id, got.output_text, got.usage.output_tokens) == (r2.id, r2.output_text, r2.usage.output_tokens)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(unstored.id)
        c.responses.delete(r.id)
        with pytest.raises(openai.BadRequestError, match="not stored"):  # its continuation is gone too
            c.responses.create(model="tiny", input="x", previous_response_id=r.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.delete(r.id)


def test_streamed_events_come_in_order_and_add_up_to_the_reply(tok):
    with serving(FakeExecutor(max_batch=2, max_seq=256, vocab=CONFIG["vocab"]), tok) as (url, _):
        c = client_of(url)
        whole = c.responses.create(model="tiny", input="hello world", max_output_tokens=6, temperature=0)
        events = list(c.responses.create(model="tiny", input="hello world", max_output_tokens=6,
                                         temperature=0, stream=True))
        kinds = [e.type for e in events]
        assert kinds[:3] == ["response.created", "response.output_item.added", "response.content_part.added"]
        assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                              "response.output_item.done", "response.incomplete"]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == whole.output_text == events[-1].response.output_text
        assert events[0].response.status == "in_progress" and events[-1].response.usage.output_tokens == 6


def test_function_tools_call_and_their_results_continue_the_conversation(tok):
    with serving(RandomExecutor(max_batch=2, max_seq=4096, vocab=CONFIG["vocab"]), tok) as (url, server):
        c = client_of(url)
        # greedy: sampled at random, the grammar's calls now and then ran past max_output_tokens
        r = c.responses.create(model="tiny", input="What time is it?", tools=[NOW], tool_choice="required",
                               max_output_tokens=600, temperature=0)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and calls and len(calls) == len(r.output)
        assert all(o.name == "now" and json.loads(o.arguments)["zone"] in ("UTC", "CET") and o.call_id for o in calls)
        streamed = [e for e in c.responses.create(model="tiny", input="What time is it?", tools=[NOW],
                                                  tool_choice="required", max_output_tokens=600, stream=True,
                                                  temperature=0)]
        done = [e.item for e in streamed if e.type == "response.output_item.done"]
        assert done and all(i.type == "function_call" for i in done) and streamed[-1].type == "response.completed"
        for k, item in enumerate(done):  # each call's item first, then its arguments in pieces
            mine = [e for e in streamed if getattr(e, "output_index", None) == k]
            assert [e.type for e in mine][0] == "response.output_item.added" and mine[0].item.id == item.id
            pieces = [e.delta for e in mine if e.type == "response.function_call_arguments.delta"]
            assert len(pieces) > 2 and "".join(pieces) == item.arguments and json.loads(item.arguments)
            assert streamed[-1].response.output[k].arguments == item.arguments
        later = c.responses.create(model="tiny", previous_response_id=r.id, tools=[NOW], max_output_tokens=200,
                                   input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                           "output": "12:00"}])
        assert later.status in ("completed", "incomplete")
        assert "12:00" in tok.decode(server.loop.engine.ex.starts[-1][1])  # the result reached the prompt
        schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["a"], "additionalProperties": False}
        j = c.responses.create(model="tiny", input="json", max_output_tokens=400,
                               text={"format": {"type": "json_schema", "name": "x", "schema": schema}})
        assert j.status == "completed" and 0 <= json.loads(j.output_text)["a"] <= 9


@pytest.mark.parametrize("body, param", [
    ({}, "input"), ({"input": []}, "input"), ({"input": [{"type": "reasoning"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "tools": [{"type": "function", "name": "a b"}]}, "tools"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text"),
    ({"input": "x", "instructions": 5}, "instructions"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "model": "other"}, "model"),
])
def test_bad_requests_name_the_responses_apis_fields(tok, body, param):
    with serving(FakeExecutor(max_batch=2, max_seq=64, vocab=CONFIG["vocab"]), tok) as (url, _):
        r = httpx.post(url + "/v1/responses", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
