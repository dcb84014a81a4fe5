"""The OpenAI completions and chat-completions wire format: request bodies checked into
plain dataclasses (every refusal an `ApiError` with the field it is about), and the response
and stream-chunk bodies built back. No HTTP here: the server glues this to Starlette."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sandwich.runtime.logprobs import MAX_TOP, TokenLogprob
from sandwich.runtime.sampling import BIAS_RANGE, PENALTY_RANGE
from sandwich.runtime.structured import Structure
from sandwich.runtime.tool_calls import ANY_OBJECT, Tool, ToolCall, ToolUse, earlier_calls

MAX_STOP = 4  # OpenAI's limit on `stop` strings
MAX_CHOICES = 128  # prompts x n in one request: each choice is a sequence in the engine
ROLES = ("system", "user", "assistant", "developer", "tool")
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name


class ApiError(Exception):
    """A request the server refuses: HTTP `status` with an OpenAI-style error body."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class GenParams:
    """A checked request: the completions API's `prompts` (each text or token ids; a batch
    of several is allowed) or chat's `messages`; `n` choices of each. max_tokens None means
    "up to the context" (chat's default)."""

    chat: bool
    model: str | None
    prompts: tuple[str | tuple[int, ...], ...]
    messages: tuple[dict, ...] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # None: none; k: each token's log-probability and the k likeliest
    echo: bool = False  # completions: the prompt comes back before the reply (and its logprobs)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's extension (extra_body in the openai client)
    logit_bias: tuple[tuple[int, float], ...] = ()
    n: int = 1
    # vLLM's extensions, which benchmark clients send to fix a reply's length
    min_tokens: int = 0  # the end-of-turn and stop ids cannot end the reply before this many
    ignore_eos: bool = False  # the tokenizer's end-of-turn ids do not end the reply
    stop_token_ids: tuple[int, ...] = ()  # more ids that end it
    structure: Structure | None = None  # response_format / structured_outputs: what the reply parses as
    tools: ToolUse | None = None  # chat's tools the reply may call (its structure is then the calls')

    @property
    def choices(self) -> int:
        return max(1, len(self.prompts)) * self.n


def parse_completion(body: Any) -> GenParams:
    """`POST /v1/completions`: `prompt` is a string or token ids, or a batch (a list) of
    either; the choices come prompt by prompt, `n` for each."""
    body = request_object(body)
    prompts = _prompts(body.get("prompt"))
    echo = _bool(body, "echo")
    top = None if body.get("logprobs") is False else _int(body, "logprobs", default=None, low=0, nullable=True)
    if top is not None and top > MAX_TOP:
        raise ApiError(f"'logprobs' must be 0 to {MAX_TOP}, got {top}", param="logprobs")
    if echo and top is not None and body.get("stream"):
        raise ApiError("'echo' with 'logprobs' is not streamed; send it without 'stream'",
                       param="stream")
    new = _int(body, "max_tokens", default=16, low=0 if echo else 1, nullable=True)
    if body.get("suffix"):
        raise ApiError("'suffix' is not supported", param="suffix")
    _single(body, "best_of")
    return _params(body, chat=False, prompts=prompts, messages=None, logprobs=top,
                   echo=echo, max_tokens=new)


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt)):
        prompt = [prompt]  # one prompt: a batch of one
    if not isinstance(prompt, list) or not prompt:
        raise ApiError("'prompt' is required: a string or a list of token ids, or a list of "
                       "either", param="prompt")
    out: list[str | tuple[int, ...]] = []
    for i, x in enumerate(prompt):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list) and x and all(_is_int(t) for t in x):
            out.append(tuple(int(t) for t in x))
        else:
            raise ApiError(f"prompt[{i}] must be a string or a non-empty list of token ids",
                           param="prompt")
    return tuple(out)


def parse_chat(body: Any) -> GenParams:
    """`POST /v1/chat/completions`: `messages` with text content (a string or text parts)."""
    body = request_object(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError("'messages' is required: a non-empty list of {role, content}",
                       param="messages")
    checked = tuple(_message(m, i) for i, m in enumerate(msgs))
    tools = _tools(body)
    asked = body.get("logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise ApiError(f"'logprobs' must be true or false, got {asked!r}", param="logprobs")
    top = _int(body, "top_logprobs", default=None, low=0, nullable=True)
    if top is not None and not asked:
        raise ApiError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if top is not None and top > MAX_TOP:
        raise ApiError(f"'top_logprobs' must be 0 to {MAX_TOP}, got {top}", param="top_logprobs")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    p = _params(body, chat=True, prompts=(), messages=checked,
                logprobs=(top or 0) if asked else None,
                max_tokens=_int(body, key, default=None, low=1, nullable=True))
    if tools is None:
        return p
    if p.structure is not None:
        raise ApiError("a reply that may call tools is the tools' JSON: drop 'response_format' "
                       "(or 'structured_outputs'), or set 'tool_choice': 'none'", param="response_format")
    return replace(p, tools=tools, structure=_checked(tools.structure(), "tools"))


def _tools(body: dict) -> ToolUse | None:
    """Chat's `tools`, `tool_choice` ("auto" by default, "none", "required", or one function
    by name) and `parallel_tool_calls`; None when no tool may be called."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise ApiError("'functions' and 'function_call' are deprecated: send 'tools' and "
                       "'tool_choice'", param="functions")
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise ApiError("'tools' must be a list", param="tools")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ApiError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                           f"'parameters': {{...}}}}}} with a name of 1-64 letters, digits, _ or -",
                           param="tools")
        params, about = f.get("parameters", ANY_OBJECT), f.get("description") or ""
        if not isinstance(params, dict) or not isinstance(about, str):
            raise ApiError(f"tools[{i}].function: 'parameters' must be a JSON schema object and "
                           f"'description' a string", param="tools")
        if any(x.name == name for x in out):
            raise ApiError(f"tools[{i}]: a second function named {name!r}", param="tools")
        out.append(Tool(name, about, json.dumps(params)))
    if choice == "none":
        return None
    if isinstance(choice, dict):
        named = choice.get("function") if choice.get("type") == "function" else None
        choice = named.get("name") if isinstance(named, dict) else None
        if choice not in {t.name for t in out}:
            raise ApiError("'tool_choice' names no function of 'tools'", param="tool_choice")
    elif choice not in (None, "auto", "required"):
        raise ApiError("'tool_choice' must be 'none', 'auto', 'required' or "
                       "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError("'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    return ToolUse(tuple(out), choice or "auto", parallel)


@dataclass(frozen=True)
class TokenizeParams:
    """vLLM's `POST /tokenize`: a `prompt`, or chat `messages` through the chat template."""

    model: str | None
    prompt: str | None
    messages: tuple[dict, ...] | None
    add_special_tokens: bool = True  # the tokenizer's BOS where the model adds one
    add_generation_prompt: bool = True


def parse_tokenize(body: Any) -> TokenizeParams:
    body = request_object(body)
    prompt, msgs = body.get("prompt"), body.get("messages")
    if (prompt is None) == (msgs is None) or (prompt is not None and not isinstance(prompt, str)) \
            or (msgs is not None and (not isinstance(msgs, list) or not msgs)):
        raise ApiError("give 'prompt' (a string) or 'messages' (a non-empty list)", param="prompt")
    return TokenizeParams(_model(body), prompt,
                          None if msgs is None else tuple(_message(m, i) for i, m in enumerate(msgs)),
                          add_special_tokens=_bool(body, "add_special_tokens", True),
                          add_generation_prompt=_bool(body, "add_generation_prompt", True))


def parse_detokenize(body: Any, vocab: int) -> tuple[str | None, list[int]]:
    """vLLM's `POST /detokenize`: (model, token ids)."""
    body = request_object(body)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(_is_int(t) and 0 <= t < vocab for t in ids):
        raise ApiError(f"'tokens' must be a list of token ids in [0, {vocab})", param="tokens")
    return _model(body), ids


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("'model' must be a string", param="model")
    return model


def _params(body: dict, **fixed) -> GenParams:
    model = _model(body)
    stream = _bool(body, "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError("'stream_options' must be an object", param="stream_options")
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
        raise ApiError("'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    p = GenParams(model=model, stream=stream, include_usage=bool(opts.get("include_usage")),
              n=_int(body, "n", default=1, low=1, nullable=True),
              min_tokens=_int(body, "min_tokens", default=0, low=0, nullable=True) or 0,
              ignore_eos=_bool(body, "ignore_eos"), stop_token_ids=tuple(ids),
              temperature=_float(body, "temperature", default=1.0, low=0.0, high=2.0),
              top_p=_float(body, "top_p", default=1.0, low=0.0, high=1.0, open_low=True),
              top_k=_int(body, "top_k", default=0, low=0, nullable=True) or 0,
              seed=_int(body, "seed", default=None, nullable=True),
              stop=_stop(body.get("stop")),
              presence_penalty=_float(body, "presence_penalty", default=0.0,
                                      low=-PENALTY_RANGE, high=PENALTY_RANGE),
              frequency_penalty=_float(body, "frequency_penalty", default=0.0,
                                       low=-PENALTY_RANGE, high=PENALTY_RANGE),
              repetition_penalty=_float(body, "repetition_penalty", default=1.0, low=0.0,
                                        high=math.inf, open_low=True),
              logit_bias=_logit_bias(body.get("logit_bias")), structure=_structure(body), **fixed)
    if p.choices > MAX_CHOICES:
        raise ApiError(f"{p.choices} choices (prompts x n) in one request is more than this "
                       f"server's {MAX_CHOICES}; split the request", param="n")
    return p


def _logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: an object from token ids (as strings, JSON keys) to a value in
    [-100, 100] added to that token's logit."""
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise ApiError("'logit_bias' must be an object mapping token ids to numbers",
                       param="logit_bias")
    out = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            raise ApiError(f"'logit_bias' keys must be token ids, got {key!r}", param="logit_bias")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                not -BIAS_RANGE <= value <= BIAS_RANGE:
            raise ApiError(f"'logit_bias' values must be numbers in [-{BIAS_RANGE:g}, "
                           f"{BIAS_RANGE:g}], got {value!r} for token {key}", param="logit_bias")
        out.append((int(key), float(value)))
    return tuple(out)


def _structure(body: dict) -> Structure | None:
    """What the reply must parse as: OpenAI's `response_format` (`text`, `json_object`, or
    `json_schema` with its `schema`) or vLLM's `structured_outputs` (one of `json`, `regex`,
    `choice`, `grammar` (Lark), `json_object`); a bad schema, regex or grammar is a 400."""
    fmt, so = body.get("response_format"), body.get("structured_outputs")
    if fmt is not None and so is not None:
        raise ApiError("give 'response_format' or 'structured_outputs', not both",
                       param="structured_outputs")
    if fmt is not None:
        param = "response_format"
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return _checked(Structure.json_schema({"type": "object"}), param)
        if kind == "json_schema":
            js = fmt.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
                raise ApiError("response_format 'json_schema' needs a 'json_schema' object with a "
                               "'schema' object", param=param)
            if not isinstance(js.get("name", ""), str):
                raise ApiError("response_format.json_schema.name must be a string", param=param)
            return _checked(Structure.json_schema(js["schema"]), param)
        raise ApiError("response_format must be {'type': 'text'}, {'type': 'json_object'} or "
                       "{'type': 'json_schema', 'json_schema': {...}}", param=param)
    if so is None:
        return None
    param = "structured_outputs"
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object")
             if isinstance(so, dict) and so.get(k) not in (None, False)]
    if len(given) != 1:
        raise ApiError("structured_outputs takes one of 'json', 'regex', 'choice', 'grammar' or "
                       "'json_object'", param=param)
    kind, x = given[0], so[given[0]]
    if kind == "json" and isinstance(x, str):  # vLLM takes the schema as JSON text too
        try:
            x = json.loads(x)
        except ValueError:
            x = None
    ok = {"json": isinstance(x, dict), "regex": isinstance(x, str), "grammar": isinstance(x, str),
          "choice": isinstance(x, list) and all(isinstance(c, str) for c in x),
          "json_object": x is True}[kind]
    if not ok:
        what = {"json": "a JSON schema object", "choice": "a list of strings",
                "json_object": "true"}.get(kind, "a string")
        raise ApiError(f"structured_outputs.{kind} must be {what}", param=param)
    made = {"json": lambda: Structure.json_schema(x), "choice": lambda: Structure.choice(x),
            "json_object": lambda: Structure.json_schema({"type": "object"})}
    return _checked(made[kind]() if kind in made else Structure(kind, x), param)


def _checked(structure: Structure, param: str) -> Structure:
    why = structure.problem()
    if why:
        raise ApiError(f"{param}: {why}", param=param)
    return structure


def request_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def _message(m: Any, i: int) -> dict:
    param = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise ApiError(f"{param} must be an object with a role in {', '.join(ROLES)}", param=param)
    content = m.get("content")
    calls = m.get("tool_calls") if m["role"] == "assistant" else None
    if calls:  # the calls as the model wrote them (runtime/tool_calls.py), its text dropped
        if not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str) and "arguments" in c["function"]
                for c in calls):
            raise ApiError(f"{param}.tool_calls must be a list of {{'function': {{'name', "
                           f"'arguments'}}}}", param=param)
        content = earlier_calls(calls)
    if content is None and m["role"] == "assistant":
        content = ""
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise ApiError(f"{param}.content: only text parts are supported", param=param)
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(f"{param}.content must be a string or a list of text parts", param=param)
    return {"role": "system" if m["role"] == "developer" else m["role"], "content": content}


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP:
        raise ApiError(f"'stop' takes at most {MAX_STOP} strings, got {len(stops)}", param="stop")
    return tuple(s for s in stops if s)


def _single(body: dict, key: str) -> None:
    if body.get(key) not in (None, 1):
        raise ApiError(f"'{key}' must be 1: one completion per request", param=key)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    x = body.get(key)
    if x is None:
        return default
    x = x or False
    if not isinstance(x, bool):
        raise ApiError(f"'{key}' must be true or false", param=key)
    return x


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int(body: dict, key: str, *, default: int | None, low: int | None = None,
         nullable: bool = False) -> int | None:
    x = body.get(key, default)
    if x is None and nullable:
        return default
    if not _is_int(x):
        raise ApiError(f"'{key}' must be an integer, got {x!r}", param=key)
    if low is not None and x < low:
        raise ApiError(f"'{key}' must be >= {low}, got {x}", param=key)
    return x


def _float(body: dict, key: str, *, default: float, low: float, high: float,
           open_low: bool = False) -> float:
    x = body.get(key)
    if x is None:
        return default
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        raise ApiError(f"'{key}' must be a number, got {x!r}", param=key)
    if x > high or x < low or (open_low and x == low):
        lo = "(" if open_low else "["
        raise ApiError(f"'{key}' must be in {lo}{low:g}, {high:g}], got {x:g}", param=key)
    return float(x)


# -- response bodies ------------------------------------------------------------------------
def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def logprobs_body(p: GenParams, lps: Sequence[TokenLogprob | int], piece: Callable[[int], bytes],
                  offsets: Sequence[int] = ()) -> dict[str, Any] | None:
    """A choice's `logprobs` (None unless the request asked): chat's `content` list of
    {token, logprob, bytes, top_logprobs}, or the completions API's parallel lists (with each
    token's `text_offset` into the reply; a bare token id, an echoed prompt's first token, has
    null figures). `piece(id)` gives a token's bytes: a token that ends inside a UTF-8
    character shows its bytes as \\x escapes in `token`, and whole in `bytes`."""
    if p.logprobs is None:
        return None
    if p.chat:
        def entry(token: int, logprob: float) -> dict[str, Any]:
            b = piece(token)
            return {"token": _text(b), "logprob": _finite(logprob), "bytes": list(b)}
        return {"content": [entry(lp.token, lp.logprob) | {"top_logprobs": [entry(t, v) for t, v in lp.top]}
                            for lp in lps], "refusal": None}
    scored = [lp if isinstance(lp, TokenLogprob) else None for lp in lps]
    return {"tokens": [_text(piece(lp if s is None else s.token)) for lp, s in zip(lps, scored, strict=True)],
            "token_logprobs": [None if s is None else _finite(s.logprob) for s in scored],
            "top_logprobs": [None if s is None else {_text(piece(t)): _finite(v) for t, v in s.top}
                             for s in scored],
            "text_offset": list(offsets)}


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="backslashreplace")


def _finite(logprob: float) -> float:
    """OpenAI's stand-in for an impossible token (-inf is not JSON)."""
    return max(logprob, -9999.0)


@dataclass(frozen=True)
class Choice:
    """One finished choice of a reply without `stream` (with tools: its calls, the text None)."""

    text: str | None
    finish: str
    logprobs: dict[str, Any] | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def of(cls, p: GenParams, text: str, finish: str, logprobs: dict[str, Any] | None = None) -> Choice:
        """A reply as the client gets it: a tool-calling reply's calls, or its answer."""
        if p.tools is None:
            return cls(text, finish, logprobs)
        content, calls = p.tools.reply(text)
        return cls(content, "tool_calls" if calls else finish, logprobs, calls)


def response(p: GenParams, rid: str, model: str, choices: Sequence[Choice],
             use: dict[str, int]) -> dict[str, Any]:
    """The whole reply of a request without `stream`: its choices in index order."""
    out = []
    for i, c in enumerate(choices):
        body = {"message": _message_body(c)} if p.chat else {"text": c.text}
        out.append({"index": i, **body, "logprobs": c.logprobs, "finish_reason": c.finish})
    return {"id": rid, "object": "chat.completion" if p.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": out, "usage": use}


def _message_body(c: Choice) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": c.text}
    if c.tool_calls:
        out["tool_calls"] = [t.body() for t in c.tool_calls]
    return out


def tool_chunk(p: GenParams, rid: str, model: str, calls: list[dict[str, Any]],
               logprobs: dict[str, Any] | None, index: int) -> dict[str, Any]:
    """Pieces of a choice's tool calls as one stream delta: a call's start (index, id, type,
    name, empty arguments), or more of its arguments' text (index, arguments)."""
    delta = {"tool_calls": calls} if calls else {}
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}],
            **({"usage": None} if p.include_usage else {})}


def chunk(p: GenParams, rid: str, model: str, text: str | None, finish: str | None = None,
          *, first: bool = False, use: dict[str, int] | None = None,
          logprobs: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    """One server-sent event of a stream: a text delta of choice `index` (with its tokens'
    logprobs when asked), its finish reason, or (with stream_options.include_usage) the
    closing usage chunk with no choices."""
    if use is not None:
        choices: list[dict] = []
    elif p.chat:
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        elif first:
            delta["content"] = ""
        choices = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
    else:
        choices = [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]
    out = {"id": rid, "object": "chat.completion.chunk" if p.chat else "text_completion",
           "created": int(time.time()), "model": model, "choices": choices}
    if p.include_usage:
        out["usage"] = use
    return out


def model_card(model: str, created: int) -> dict[str, Any]:
    """The one model this server serves, as GET /v1/models/{model} returns it."""
    return {"id": model, "object": "model", "created": created, "owned_by": "sandwichc"}


def models_list(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(model, created)]}
