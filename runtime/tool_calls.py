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
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class CallDelta:
    """A streamed piece of tool call `index`: its start (`id` and `name`, no arguments yet)
    or a piece of its arguments' JSON text, as OpenAI streams them."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def body(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class ReplyStream:
    """A tool-calling reply as it is generated: once its JSON shows that it answers
    (`{"response": "...`), the answer's text as it comes, unescaped; once it shows that it
    calls tools, each call's start as soon as its name is complete, then its arguments' text
    as it comes (CallScanner)."""

    def __init__(self, use: ToolUse) -> None:
        self.use, self.raw, self.mode = use, "", ""  # mode: "", "answer" or "calls"
        self._answer = JsonString()
        self._calls = CallScanner()

    def push(self, delta: str) -> tuple[str, list[CallDelta]]:
        """The answer text that `delta` adds ("" while undecided, or calling tools), and the
        pieces of calls it adds."""
        self.raw += delta
        if self.mode == "answer":
            return self._answer.feed(delta), []
        if self.mode == "calls":
            return "", self._calls.feed(delta)
        if m := _ANSWERS.match(self.raw):
            self.mode = "answer"
            return self._answer.feed(self.raw[m.end():]), []
        if _CALLS.match(self.raw):
            self.mode = "calls"
            return "", self._calls.feed(self.raw)
        return "", []

    def end(self) -> tuple[str | None, tuple[ToolCall, ...]]:
        """(content, calls) of the whole reply, as `ToolUse.reply` reads it; the calls whose
        starts were streamed keep the id and the arguments' text (the model's own, which the
        pieces sent add up to) the stream gave them."""
        content, calls = self.use.reply(self.raw)
        ids, args = self._calls.ids, self._calls.arguments
        return content, tuple(replace(c, id=ids[i], arguments=args[i]) if i < len(ids) else c
                              for i, c in enumerate(calls))


class CallScanner:
    """The protocol's `{"tool_calls": [{"name": ..., "arguments": ...}, ...]}` read character
    by character as it arrives (the grammar fixes its shape and key order): a call starts
    once its name's string is closed; its arguments' text is passed on as it comes, from the
    value's first character to its last."""

    CALL_DEPTH = 3  # the reply object, the tool_calls array, a call object

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.in_string = self.escape = False
        self.ids: list[str] = []
        self.arguments: list[str] = []  # each started call's arguments' text so far
        self._key, self._string = "", ""  # the call-level key read last; a string being read
        self._reading = ""  # what the call-level string being read is: "key", "name" or ""
        self._expect = "key"  # at call level: "key", then "value" after its colon
        self._args = ""  # the arguments' value: "" (not reached), "on" (inside), "closed"

    def feed(self, text: str) -> list[CallDelta]:
        """The starts and argument pieces that `text` adds."""
        out: list[CallDelta] = []
        piece: list[str] = []
        for c in text:
            started, take = self._step(c)
            if take:
                piece.append(c)
            elif started:
                if piece:
                    out.append(self._piece(piece))
                out.append(CallDelta(len(self.ids), id=started[0], name=started[1]))
                self.ids.append(started[0])
                self.arguments.append("")
        if piece:
            out.append(self._piece(piece))
        return out

    def _piece(self, piece: list[str]) -> CallDelta:
        text, piece[:] = "".join(piece), []
        self.arguments[-1] += text
        return CallDelta(len(self.ids) - 1, text)

    def _step(self, c: str) -> tuple[tuple[str, str] | None, bool]:
        """Advance by one character: a call's (id, name) when its name has just closed, and
        whether the character is part of the arguments' value."""
        at_call = len(self.stack) == self.CALL_DEPTH
        if self.in_string:
            if self._reading:
                self._string += c
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
                return self._string_closed(), self._args == "on"
            return None, self._args == "on"
        if at_call and self._expect == "value" and self._key == "arguments" and not self._args \
                and not c.isspace():
            self._args = "on"
        take = self._args == "on"
        if c == '"':
            self.in_string = True
            if at_call and self._expect == "key":
                self._reading, self._string = "key", '"'
            elif at_call and self._key == "name" and self._expect == "value":
                self._reading, self._string = "name", '"'
        elif c in "{[":
            self.stack.append(c)
            if len(self.stack) == self.CALL_DEPTH:  # a new call object
                self._key, self._expect, self._args = "", "key", ""
        elif c in "}]":
            if self.stack:
                self.stack.pop()
            if take and len(self.stack) <= self.CALL_DEPTH:  # the value's end
                self._args = "closed"
                take = len(self.stack) == self.CALL_DEPTH  # its own bracket, not the call's
        elif take and at_call and (c == "," or c.isspace()):  # a scalar value's end
            self._args, take = "closed", False
        if at_call and c == ":":
            self._expect = "value"
        elif at_call and c == ",":
            self._expect = "key"
        return None, take

    def _string_closed(self) -> tuple[str, str] | None:
        reading, self._reading = self._reading, ""
        if reading == "key":
            self._key = json.loads(self._string)
        elif reading == "name":
            return f"call_{uuid.uuid4().hex[:24]}", json.loads(self._string)
        return None


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
