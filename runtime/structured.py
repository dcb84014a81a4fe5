"""Replies that must parse: a JSON schema, any JSON object, a regex, one of a list of strings
or a Lark grammar (what OpenAI's `response_format` and vLLM's `structured_outputs` ask for).

llguidance (the grammar engine vLLM and llama.cpp use) holds each reply's parse state; before
every pick the tokens that cannot continue a valid reply are masked out of the logits, and a
reply ends ("stop") as soon as its grammar is complete. llguidance reads the tokenizer's own
HF `tokenizer.json` text, so the mask knows each token's bytes as the model's tokenizer does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from sandwich.errors import ConfigError, first_line

KINDS = ("json", "regex", "choice", "grammar")


# the white space a JSON reply may put between its tokens: none, a space, or a newline and an
# indent of up to 20 (llama.cpp's JSON grammar allows the same). Unbounded, a model (or a
# test's random logits) can spend a reply's whole budget on blanks inside a tool call.
JSON_WHITESPACE = r"(?: |\n[ \t]{0,20})?"


@dataclass(frozen=True)
class Structure:
    """What a reply must match. `json`: a JSON schema, as JSON text (`{"type": "object"}` for
    any object); `regex`: a regular expression the whole reply matches; `choice`: a JSON list
    of strings, the reply being one of them; `grammar`: a Lark grammar (llguidance's dialect,
    whose `start` rule is the reply). A JSON reply's properties come in the schema's order."""

    kind: str
    spec: str

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Structure:
        return cls("json", json.dumps(schema))

    @classmethod
    def choice(cls, options: Sequence[str]) -> Structure:
        return cls("choice", json.dumps(list(options)))

    def grammar(self) -> str:
        """llguidance's grammar text."""
        from llguidance import LLMatcher

        if self.kind == "json":  # a schema's own x-guidance white space wins over ours
            schema = json.loads(self.spec)
            own = schema.get("x-guidance") if isinstance(schema, dict) else None
            ours = isinstance(own, dict) and any(k.startswith("whitespace") for k in own)
            return LLMatcher.grammar_from_json_schema(
                schema, defaults=None if ours else {"whitespace_pattern": JSON_WHITESPACE})
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":  # Lark string literals are JSON strings
            return LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(o) for o in json.loads(self.spec)))
        if self.kind == "grammar":
            return LLMatcher.grammar_from_lark(self.spec)
        raise ConfigError(f"unknown structure kind {self.kind!r}; one of {', '.join(KINDS)}")

    def problem(self) -> str | None:
        """Why no reply could be checked against this (a bad schema, regex or grammar), in
        one line, or None."""
        from llguidance import LLMatcher

        if self.kind == "choice":
            options = json.loads(self.spec)
            if not options or not all(isinstance(o, str) and o for o in options):
                return "choice needs a non-empty list of non-empty strings"
        try:
            why = LLMatcher.validate_grammar(self.grammar())
        except ValueError as e:  # a JSON schema that is not an object
            why = str(e)
        return first_line(why) if why and not why.startswith("WARNING") else None


class Grammars:
    """llguidance's view of one tokenizer (built at the first structured request, in the
    engine's thread: about 0.3 s for a 49k vocabulary) and a `Constraint` per reply. The
    token ids that end a turn are the ones llguidance lets end a complete reply."""

    def __init__(self, tokenizer_json: str, vocab: int, eos: Sequence[int]) -> None:
        self._json, self.vocab, self.eos = tokenizer_json, vocab, sorted(eos)

    @classmethod
    def of(cls, tok, vocab: int) -> Grammars:
        """For a `TextTokenizer` and the model's vocabulary (the logits' width)."""
        eos = tok.stop_ids or ({tok.eos_id} if tok.eos_id is not None else set())
        return cls(tok.backend.to_str(), vocab, eos)

    @cached_property
    def _tokenizer(self):
        from llguidance import LLTokenizer

        try:
            return LLTokenizer(self._json, n_vocab=self.vocab, eos_token=self.eos or None)
        except ValueError as e:
            raise ConfigError(f"structured output cannot read this tokenizer: "
                              f"{first_line(str(e))}") from None

    def constraint(self, structure: Structure) -> Constraint:
        """A fresh parse state for one reply; a grammar it cannot build is a one-line error."""
        from llguidance import LLMatcher

        m = LLMatcher(self._tokenizer, structure.grammar(), log_level=0)
        if m.is_error():
            raise ConfigError(f"{structure.kind} structure: {first_line(m.get_error())}")
        return Constraint(m, self.vocab)


class Constraint:
    """One reply's parse state: which tokens may come next, and whether it is complete."""

    def __init__(self, matcher, vocab: int) -> None:
        self._m, self.vocab = matcher, vocab
        self.error: str | None = None

    @property
    def done(self) -> bool:
        """The reply is complete: nothing may follow (the grammar ended, or an end-of-turn id
        was taken where the reply could end)."""
        return self._m.is_stopped()

    def allowed(self) -> np.ndarray:
        """A bool per token id: may it come next."""
        words = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(words, bitorder="little")[: self.vocab].astype(bool)

    def mask(self, row: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """`row` with every token the grammar forbids at -inf (in place: `row` is the sampler's
        own copy). When the request's adjustments leave no allowed token (a ban on the only
        one that fits), the grammar wins: `fallback`, the unadjusted logits, masked."""
        ok = self.allowed()
        row[~ok] = -np.inf
        if not np.isfinite(row.max()):
            np.copyto(row, np.where(ok, fallback, -np.inf))
        return row

    def advance(self, token: int) -> None:
        """Take the picked token; a token the grammar refuses leaves `error` set."""
        if not self._m.consume_token(token) and self.error is None:
            self.error = f"structured output: {first_line(self._m.get_error())}"
