"""OpenAI tool calling for any model, by llama.cpp's generic protocol: the tools and the reply
format go into the system message, the reply is held (runtime/structured.py) to one JSON
object that either calls tools, `{"tool_calls": [{"name": ..., "arguments": {...}}]}`, or
answers, `{"response": "..."}`, and the server hands it back as `tool_calls` or `content`.
A template that knows its model's own tool format is not needed, and every call's arguments
fit its tool's parameter schema by construction."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandwich.runtime.structured import Structure

ANY_OBJECT = {"type": "object"}
# how a reply held to the protocol starts, once it has decided (its first key is fixed)
_ANSWERS = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_CALLS = re.compile(r'\s*\{\s*"tool_calls"')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"'}


@dataclass(frozen=True)
class Tool:
    """One function the model may call; `parameters`: its JSON schema, as JSON text."""

    name: str
    description: str = ""
    parameters: str = json.dumps(ANY_OBJECT)

    def card(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "parameters": json.loads(self.parameters)}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    @classmethod
    def new(cls, name: str, arguments: Any) -> ToolCall:
        return cls(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(arguments, ensure_ascii=False))

    def body(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's shape (a stream's delta also names its index)."""
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ToolUse:
    """What a request allows: `choice` is "auto" (call tools or answer), "required" (call at
    least one) or a tool's name (call that one); `parallel`: several calls in one reply."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True

    @property
    def callable(self) -> tuple[Tool, ...]:
        return self.tools if self.choice in ("auto", "required") else \
            tuple(t for t in self.tools if t.name == self.choice)

    def schema(self) -> dict[str, Any]:
        """The JSON schema a reply must fit."""
        calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                  "properties": {"name": {"const": t.name}, "arguments": json.loads(t.parameters)}}
                 for t in self.callable]
        items: dict[str, Any] = {"type": "array", "minItems": 1,
                                 "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not self.parallel:
            items["maxItems"] = 1
        call = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
                "properties": {"tool_calls": items}}
        if self.choice != "auto":
            return call
        answer = {"type": "object", "additionalProperties": False, "required": ["response"],
                  "properties": {"response": {"type": "string"}}}
        return {"anyOf": [call, answer]}

    def structure(self) -> Structure:
        return Structure.json_schema(self.schema())

    def instructions(self) -> str:
        """What the system message tells the model."""
        cards = json.dumps([t.card() for t in self.callable], ensure_ascii=False)
        call = ('{"tool_calls": [{"name": <a tool\'s name>, "arguments": {<its parameters>}}'
                + (", ...]}" if self.parallel else "]}"))
        if self.choice == "auto":
            how = (f"To call tools, reply with {call}; to answer the user directly, reply with "
                   f'{{"response": <your answer>}}.')
        else:
            how = f"Reply with {call}."
        return (f"You can call these tools: {cards}\nReply with one JSON object only. {how} "
                f"A tool's result comes back in a message of role tool.")

    def messages(self, messages: Sequence[dict]) -> list[dict]:
        """The conversation with the instructions in its system message (the first message,
        joined to it when there is one: templates take one system message, at the start)."""
        out = [dict(m) for m in messages]
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{self.instructions()}"
        else:
            out.insert(0, {"role": "system", "content": self.instructions()})
        return out

    def reply(self, text: str) -> tuple[str | None, tuple[ToolCall, ...]]:
        """(content, tool calls) of a reply: the calls, or the answer; a reply that is not the
        protocol's JSON (cut short by max_tokens) comes back as the text it is."""
        try:
            x = json.loads(text)
        except ValueError:
            return text, ()
        if isinstance(x, dict) and isinstance(x.get("tool_calls"), list):
            calls = tuple(ToolCall.new(c["name"], c["arguments"]) for c in x["tool_calls"]
                          if isinstance(c, dict) and "name" in c and "arguments" in c)
            return None, calls
        if isinstance(x, dict) and isinstance(x.get("response"), str):
            return x["response"], ()
        return text, ()


def earlier_calls(calls: Sequence[dict]) -> str:
    """An assistant message's earlier `tool_calls`, as the protocol's JSON the model wrote."""
    out = []
    for c in calls:
        f = c["function"]
        try:
            args = json.loads(f["arguments"]) if isinstance(f["arguments"], str) else f["arguments"]
        except ValueError:
            args = f["arguments"]
        out.append({"name": f["name"], "arguments": args})
    return json.dumps({"tool_calls": out}, ensure_ascii=False)


class ReplyStream:
    """A tool-calling reply as it is generated: once its JSON shows that it answers
    (`{"response": "...`), the answer's text as it comes, unescaped; calls are read whole
    when the reply ends."""

    def __init__(self, use: ToolUse) -> None:
        self.use, self.raw, self.mode = use, "", ""  # mode: "", "answer" or "calls"
        self._answer = JsonString()

    def push(self, delta: str) -> str:
        """The answer text that `delta` adds ("" while undecided, or calling tools)."""
        self.raw += delta
        if self.mode == "answer":
            return self._answer.feed(delta)
        if not self.mode:
            if m := _ANSWERS.match(self.raw):
                self.mode = "answer"
                return self._answer.feed(self.raw[m.end():])
            if _CALLS.match(self.raw):
                self.mode = "calls"
        return ""

    def end(self) -> tuple[str | None, tuple[ToolCall, ...]]:
        """(content, calls) of the whole reply, as `ToolUse.reply` reads it."""
        return self.use.reply(self.raw)


class JsonString:
    """A JSON string's characters as its text arrives in pieces (after the opening quote): an
    escape split between pieces waits for the rest; the closing quote ends it."""

    def __init__(self) -> None:
        self.pending, self.done = "", False

    def feed(self, piece: str) -> str:
        if self.done:
            return ""
        buf, out, i = self.pending + piece, [], 0
        while i < len(buf):
            c = buf[i]
            if c == '"':
                self.done = True
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            if i + 1 >= len(buf):
                break
            if buf[i + 1] != "u":
                out.append(_ESCAPES.get(buf[i + 1], buf[i + 1]))
                i += 2
                continue
            if i + 6 > len(buf):
                break
            code = int(buf[i + 2: i + 6], 16)
            if 0xD800 <= code < 0xDC00:  # a surrogate pair: \uD83D\uDE00
                if i + 12 > len(buf):
                    break
                code = 0x10000 + ((code - 0xD800) << 10) + (int(buf[i + 8: i + 12], 16) - 0xDC00)
                i += 6
            out.append(chr(code))
            i += 6
        self.pending = "" if self.done else buf[i:]
        return "".join(out)
