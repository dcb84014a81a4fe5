"""ShareGPT-style conversations as a trace: a JSON array of
{"conversations": [{"from": "human" | "gpt", "value": text}, ...]}.

A request is a conversation's first human turn as the prompt, asking for as many tokens as
the gpt reply that follows it has. Conversations without such a pair (ShareGPT dumps hold
many) are skipped. The file has no times: arrivals come from a seeded Poisson or Gamma
process at a given rate, in file order. Texts go through the model's tokenizer when there is
one, else lengths are estimated from words (WORDS_PER_TOKEN) and the prompt ids are random.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.runtime.traces import TraceEntry, TraceError, check_order, read_text

HUMAN = {"human", "user"}
GPT = {"gpt", "chatgpt", "assistant"}
# OpenAI's rule of thumb for English text: a token is about 3/4 of a word
WORDS_PER_TOKEN = 0.75
_WS = re.compile(r"\s*")


def estimate_tokens(text: str) -> int:
    """Tokens of `text` without a tokenizer: words / WORDS_PER_TOKEN, at least 1."""
    return max(1, math.ceil(len(text.split()) / WORDS_PER_TOKEN))


def array_items(text: str, path: Path) -> Iterator[tuple[int, object]]:
    """(line, element) for each element of a top-level JSON array, decoded one at a time so
    a bad element is named by its line and a long file can stop early."""
    dec, line, seen = json.JSONDecoder(), 1, 0

    def line_at(i: int) -> int:
        nonlocal line, seen
        line += text.count("\n", seen, i)
        seen = i
        return line

    i = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[i:i + 1] != "[":
        raise TraceError(f"{path}:{line_at(i)}: expected a JSON array of conversations")
    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i:i + 1] == "]":
        return
    while True:
        try:
            obj, j = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        yield line_at(i), obj
        i = _WS.match(text, j).end()  # type: ignore[union-attr]
        if text[i:i + 1] == "]":
            return
        if text[i:i + 1] != ",":
            raise TraceError(f"{path}:{line_at(i)}: expected ',' or ']' after a conversation")
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]


def first_exchange(obj, where: str) -> tuple[str, str] | None:
    """(first human turn, the gpt reply after it), or None when there is no such pair."""
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list):
        raise TraceError(f"{where}: expected an object with a 'conversations' list")
    prompt = None
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get("from"), str) \
                or not isinstance(t.get("value"), str):
            raise TraceError(f"{where}: each turn needs 'from' and 'value' strings, got {t!r:.60}")
        if prompt is None and t["from"] in HUMAN and t["value"].strip():
            prompt = t["value"]
        elif prompt is not None and t["from"] in GPT:
            return prompt, t["value"]
    return None


def read_sharegpt(path: str | Path, *, rate: float, seed: int, arrivals=None, tokenizer=None,
                  until_s: float | None = None) -> list[TraceEntry]:
    """Requests of the conversations arriving before until_s (all when None)."""
    from sandwich.runtime.trace_synth import Arrivals

    p = Path(path)
    if not rate > 0:
        raise ConfigError(f"a ShareGPT trace needs an arrival rate > 0 (--rate), got {rate}")
    proc, rng = arrivals or Arrivals(), np.random.default_rng(seed)
    out, t, skipped = [], 0.0, 0
    for line, obj in array_items(read_text(p), p):
        pair = first_exchange(obj, f"{p}:{line}")
        if pair is None:
            skipped += 1
            continue
        t += proc.gap(rng, rate)
        if until_s is not None and t >= until_s:
            break
        if tokenizer is not None:
            ids = tuple(tokenizer.encode(pair[0]))
            new = max(1, len(tokenizer.encode(pair[1], add_bos=False)))
            out.append((line, TraceEntry(t, len(ids), new, ids) if ids else
                        TraceEntry(t, 1, new)))
        else:
            out.append((line, TraceEntry(t, estimate_tokens(pair[0]), estimate_tokens(pair[1]))))
    if not out and skipped:
        raise TraceError(f"{p}:1: none of {skipped} conversations has a human turn followed by "
                         f"a gpt reply")
    return check_order(out, p)
