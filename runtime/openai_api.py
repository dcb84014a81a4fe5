"""The OpenAI completions and chat-completions wire format: request bodies checked into
plain dataclasses (every refusal an `ApiError` with the field it is about), and the response
and stream-chunk bodies built back. No HTTP here: the server glues this to Starlette."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sandwich.runtime.logprobs import MAX_TOP, TokenLogprob
from sandwich.runtime.sampling import BIAS_RANGE, PENALTY_RANGE

MAX_STOP = 4  # OpenAI's limit on `stop` strings
MAX_CHOICES = 128  # prompts x n in one request: each choice is a sequence in the engine
ROLES = ("system", "user", "assistant", "developer", "tool")


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

    @property
    def choices(self) -> int:
        return max(1, len(self.prompts)) * self.n


def parse_completion(body: Any) -> GenParams:
    """`POST /v1/completions`: `prompt` is a string or token ids, or a batch (a list) of
    either; the choices come prompt by prompt, `n` for each."""
    body = _object(body)
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
    body = _object(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError("'messages' is required: a non-empty list of {role, content}",
                       param="messages")
    checked = tuple(_message(m, i) for i, m in enumerate(msgs))
    if body.get("tools") or body.get("functions"):
        raise ApiError("tool and function calling are not supported", param="tools")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise ApiError("only response_format {'type': 'text'} is supported", param="response_format")
    asked = body.get("logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise ApiError(f"'logprobs' must be true or false, got {asked!r}", param="logprobs")
    top = _int(body, "top_logprobs", default=None, low=0, nullable=True)
    if top is not None and not asked:
        raise ApiError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if top is not None and top > MAX_TOP:
        raise ApiError(f"'top_logprobs' must be 0 to {MAX_TOP}, got {top}", param="top_logprobs")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _params(body, chat=True, prompts=(), messages=checked,
                   logprobs=(top or 0) if asked else None,
                   max_tokens=_int(body, key, default=None, low=1, nullable=True))


def _params(body: dict, **fixed) -> GenParams:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("'model' must be a string", param="model")
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
              logit_bias=_logit_bias(body.get("logit_bias")), **fixed)
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


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def _message(m: Any, i: int) -> dict:
    param = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise ApiError(f"{param} must be an object with a role in {', '.join(ROLES)}", param=param)
    content = m.get("content")
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


def _bool(body: dict, key: str) -> bool:
    x = body.get(key) or False
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
    """One finished choice of a reply without `stream`."""

    text: str
    finish: str
    logprobs: dict[str, Any] | None = None


def response(p: GenParams, rid: str, model: str, choices: Sequence[Choice],
             use: dict[str, int]) -> dict[str, Any]:
    """The whole reply of a request without `stream`: its choices in index order."""
    out = []
    for i, c in enumerate(choices):
        body = {"message": {"role": "assistant", "content": c.text}} if p.chat else {"text": c.text}
        out.append({"index": i, **body, "logprobs": c.logprobs, "finish_reason": c.finish})
    return {"id": rid, "object": "chat.completion" if p.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": out, "usage": use}


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
