"""OpenAI's Responses API (`POST /v1/responses`), which newer clients speak (the OpenAI Agents
SDK, `client.responses.create`): a request is read into the chat API's checked parameters
(its `input` items into messages, `instructions` into the system message, `text.format`
into a response_format, flat function tools into chat's), so it runs on the same engine path
with the same checks; the reply is built back as a Response object or as its typed stream
events. `previous_response_id` continues a stored response's conversation (the server keeps
the last STORE_LIMIT in memory; `store: false` keeps none). No HTTP here."""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandwich.runtime.openai_api import ApiError, Choice, GenParams, parse_chat, request_object

STORE_LIMIT = 256  # responses whose conversation a later request may continue
ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
# a chat field a refusal names, as the Responses API calls it
FIELDS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text"}


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked request: the chat parameters it runs as, the conversation (without the
    instructions, which a continuation does not inherit), and what its Response repeats."""

    params: GenParams
    conversation: tuple[dict, ...]
    instructions: str | None
    store: bool
    previous: str | None
    echo: dict[str, Any]  # tools, tool_choice, parallel_tool_calls, text, temperature, ...


def parse_responses(body: Any, stored: ResponseStore) -> ResponsesRequest:
    body = request_object(body)
    previous = body.get("previous_response_id")
    history: list[dict] = []
    if previous is not None:
        if not isinstance(previous, str) or stored.get(previous) is None:
            raise ApiError(f"previous response {previous!r} is not stored here (responses are "
                           f"kept in memory, the last {STORE_LIMIT}, unless sent with store: false)",
                           param="previous_response_id", code="previous_response_not_found")
        history = list(stored.get(previous) or ())
    conversation = history + _items(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError("'instructions' must be a string", param="instructions")
    msgs = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    tools, choice = _tools(body.get("tools")), _choice(body.get("tool_choice"))
    chat = {"model": body.get("model"), "messages": msgs, "stream": body.get("stream"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "max_tokens": body.get("max_output_tokens"), "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": body.get("parallel_tool_calls"),
            "response_format": _format(body.get("text"))}
    try:
        p = parse_chat({k: v for k, v in chat.items() if v is not None})
    except ApiError as e:
        param = e.param.split("[")[0] if e.param else None
        e.param = FIELDS.get(param or "", param)
        raise
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise ApiError("'store' must be true or false", param="store")
    echo = {"tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "text": body.get("text") or {"format": {"type": "text"}},
            "temperature": p.temperature, "top_p": p.top_p,
            "max_output_tokens": body.get("max_output_tokens"), "metadata": body.get("metadata") or {}}
    return ResponsesRequest(p, tuple(conversation), instructions, store, previous, echo)


def _items(items: Any) -> list[dict]:
    """`input` as chat messages: a string is one user message; a list holds messages (text
    content, or input_text / output_text parts), `function_call` items (merged into one
    assistant message's tool_calls) and `function_call_output` items (tool messages)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError("'input' is required: a string or a non-empty list of items", param="input")
    out: list[dict] = []
    for i, it in enumerate(items):
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message" and it.get("role") in ROLES:
            out.append({"role": it["role"], "content": _text(it.get("content"), i)})
        elif kind == "function_call" and all(isinstance(it.get(k), str) for k in ("call_id", "name", "arguments")):
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output" and isinstance(it.get("call_id"), str):
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": _text(it.get("output"), i)})
        else:
            raise ApiError(f"input[{i}] must be a message ({', '.join(ROLES)}), a function_call or a "
                           f"function_call_output item", param="input")
    return out


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(c, dict) and c.get("type") in TEXT_PARTS
                                         and isinstance(c.get("text"), str) for c in content):
        return "".join(c["text"] for c in content)
    raise ApiError(f"input[{i}]: content must be a string or text parts", param="input")


def _tools(tools: Any) -> list[dict] | None:
    """The Responses API's flat function tools as chat's nested ones."""
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError("'tools' must be a list of tools", param="tools")
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function":
            raise ApiError(f"tools[{i}]: only function tools are served here, not "
                           f"{t.get('type')!r}", param="tools")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                     if t.get(k) is not None}})
    return out


def _choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text: Any) -> dict | None:
    """`text.format` as chat's response_format."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        if isinstance(text, dict):
            return None
        raise ApiError("'text' must be an object with a 'format'", param="text")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict")
                                                   if k in fmt}}


class ResponseStore:
    """Each stored response: its conversation, its reply included, and its Response object
    (the last STORE_LIMIT)."""

    def __init__(self, limit: int = STORE_LIMIT) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, tuple[tuple[dict, ...], dict]] = OrderedDict()

    def get(self, rid: str) -> tuple[dict, ...] | None:
        """The conversation a continuation of `rid` starts from."""
        kept = self._kept.get(rid)
        return None if kept is None else kept[0]

    def body(self, rid: str) -> dict | None:
        kept = self._kept.get(rid)
        return None if kept is None else kept[1]

    def put(self, rid: str, conversation: Sequence[dict], body: dict) -> None:
        self._kept[rid] = (tuple(conversation), body)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def delete(self, rid: str) -> bool:
        return self._kept.pop(rid, None) is not None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reply_message(c: Choice) -> dict:
    """The reply as the chat message a continuation sends back."""
    if c.tool_calls:
        return {"role": "assistant", "content": None, "tool_calls": [t.body() for t in c.tool_calls]}
    return {"role": "assistant", "content": c.text or ""}


def output_items(c: Choice, msg_id: str, call_items: Sequence[str] = ()) -> list[dict]:
    """A reply's output items: its function calls (the first with the item ids
    `call_items`, the ids a stream gave them), or one message with its text."""
    if c.tool_calls:
        return [function_item(t.id, t.name, t.arguments,
                              call_items[i] if i < len(call_items) else new_id("fc"))
                for i, t in enumerate(c.tool_calls)]
    return [message_item(msg_id, c.text or "", "incomplete" if c.finish == "length" else "completed")]


def message_item(msg_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": msg_id, "status": status, "role": "assistant", "content": content}


def function_item(call_id: str, name: str, arguments: str, item_id: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response_body(r: ResponsesRequest, rid: str, model: str, created: int, output: list[dict],
                  *, status: str, usage: tuple[int, int] | None = None) -> dict[str, Any]:
    """The Response object; `usage` (prompt tokens, output tokens) once it is done."""
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "error": None, "instructions": r.instructions,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "previous_response_id": r.previous, "store": r.store, **r.echo,
            "usage": None if usage is None else {
                "input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage),
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}}}


class Events:
    """A streamed response's server-sent events, numbered as they are made."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        self.n += 1
        body = {"type": kind, "sequence_number": self.n - 1, **fields}
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"


def now() -> int:
    return int(time.time())
