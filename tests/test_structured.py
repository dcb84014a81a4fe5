"""Structured replies (runtime/structured.py): under a JSON schema, a regex, a list of choices
or a Lark grammar, every reply sampled from random logits parses as asked, on both kinds of
tiny vocabulary; the same logits without the grammar do not; the engine ends a reply when its
grammar is complete and fails only the request whose grammar breaks; bad specs are one line."""

import json
import re

import numpy as np
import pytest
from engine_fakes import RandomExecutor
from gguf_tiny import write_tiny_gguf

from sandwich.errors import ConfigError
from sandwich.runtime.engine import Engine, Request
from sandwich.runtime.sampling import Sampler, SamplingParams
from sandwich.runtime.structured import Grammars, Structure
from sandwich.runtime.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "n", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                         "ok": {"type": "boolean"}}}
CHOICES = ["yes", "no", 'the "dog"']
REGEX = r"[a-z]{2,5}-[0-9]{2}"
LARK = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'


def fits_schema(text: str) -> bool:
    try:
        x = json.loads(text)
    except ValueError:
        return False
    # the properties come in the schema's order, as OpenAI's structured outputs promise
    return (isinstance(x, dict) and list(x)[:3] == ["name", "n", "tags"] and set(x) <= {"name", "n", "tags", "ok"}
            and isinstance(x["name"], str) and len(x["name"]) <= 6
            and type(x["n"]) is int and 0 <= x["n"] <= 99
            and isinstance(x["tags"], list) and len(x["tags"]) <= 3 and set(x["tags"]) <= {"a", "b"}
            and type(x.get("ok", True)) is bool)


CASES = {
    "json": (Structure.json_schema(SCHEMA), fits_schema),
    "regex": (Structure("regex", REGEX), lambda t: re.fullmatch(REGEX, t) is not None),
    "choice": (Structure.choice(CHOICES), lambda t: t in CHOICES),
    "grammar": (Structure("grammar", LARK), lambda t: re.fullmatch(r"\(\d{1,3}(,\d{1,3})*\)", t) is not None),
}


@pytest.fixture(scope="module", params=["gpt2", "spm"])
def tok(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    return load_tokenizer(write_tiny_gguf(path, vocab=request.param)[0])


def vocab(tok) -> int:
    return tok.backend.get_vocab_size()


def reply(tok, structure, seed: int, *, temperature=1.0, steps=300, grammars=None):
    """Ids sampled from seeded random logits (under `structure` unless None), up to a stop id,
    the grammar's end, or `steps`; and whether the grammar ended it."""
    rng = np.random.default_rng(seed)
    c = None if structure is None else (grammars or Grammars.of(tok, vocab(tok))).constraint(structure)
    s = Sampler(SamplingParams(temperature=temperature, seed=seed), constraint=c)
    ids = []
    while len(ids) < steps:
        ids.append(s(rng.standard_normal(vocab(tok)).astype(np.float32) * 4))
        assert c is None or c.error is None
        if ids[-1] in tok.stop_ids or (c is not None and c.done):
            break
    return ids, c is not None and c.done


@pytest.mark.parametrize("kind", CASES)
def test_every_sampled_reply_parses_as_asked_and_without_the_grammar_none_does(tok, kind):
    structure, fits = CASES[kind]
    assert structure.problem() is None
    grammars = Grammars.of(tok, vocab(tok))
    for seed in range(6):
        for t in (1.0, 0.0):
            ids, ended = reply(tok, structure, seed, temperature=t, grammars=grammars)
            text = tok.decode(ids)
            assert ended and fits(text), (seed, t, text)
    # the same logits with no grammar: random text, which the checks reject
    assert not any(fits(tok.decode(reply(tok, None, seed, steps=40)[0])) for seed in range(6))


def test_json_takes_compact_spaced_or_indented_replies_but_not_runs_of_blanks(tok):
    """Between a JSON reply's tokens: nothing, a space, or a newline and up to 20 blanks (as
    llama.cpp's JSON grammar), so random logits cannot spend a reply on white space; a
    schema's own `x-guidance` whitespace setting still wins."""
    schema = {"type": "object", "properties": {"a": {"type": "string"},
                                               "b": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a", "b"]}

    if tok.backend.encode("{").tokens[0] != "{":  # SentencePiece: a prefix space, not a reply's
        pytest.skip("the tokenizer adds a space before a text's first token")

    def takes(structure, text):
        c = Grammars.of(tok, vocab(tok)).constraint(structure)
        for t in tok.encode(text):
            c.advance(t)
        return c.error is None

    strict = Structure.json_schema(schema)
    for text in ('{"a":"x","b":[1,2]}', '{"a": "x", "b": [1, 2]}',
                 '{\n    "a": "x",\n    "b": [\n\t\t1,\n\t\t2\n    ]\n}'):
        assert takes(strict, text), text
    for text in ('{"a":' + " " * 30 + '"x","b":[]}', '{  "a":"x","b":[]}', '{\n' + " " * 21 + '"a":"x","b":[]}'):
        assert not takes(strict, text), text
    loose = Structure.json_schema(schema | {"x-guidance": {"whitespace_flexible": True}})
    assert takes(loose, '{  "a":"x","b":[]}')


def test_a_reply_that_may_go_on_ends_at_an_end_of_turn_id(tok):
    """`[a-z]+` never forces an end: the reply stops when an end-of-turn id is picked where
    the regex is complete, and that id ends it."""
    grammars = Grammars.of(tok, vocab(tok))
    ends = 0
    for seed in range(8):
        ids, ended = reply(tok, Structure("regex", "[a-z]+"), seed, steps=60, grammars=grammars)
        body = ids[:-1] if ids[-1] in tok.stop_ids else ids
        assert re.fullmatch("[a-z]+", tok.decode(body)), tok.decode(body)
        ends += ids[-1] in tok.stop_ids and ended
    assert ends > 0


def test_the_grammar_wins_over_adjustments_that_leave_nothing():
    """min_tokens' ban on the end-of-turn ids can remove every token the grammar allows: the
    mask then falls back to the unadjusted logits, masked."""
    c = type("C", (), {"allowed": lambda self: np.array([False, True, True, False])})()
    from sandwich.runtime.structured import Constraint

    row = np.array([5.0, -np.inf, -np.inf, 1.0], np.float32)
    raw = np.array([5.0, 2.0, 3.0, 1.0], np.float32)
    out = Constraint.mask(c, row, raw)
    assert out.tolist() == [-np.inf, 2.0, 3.0, -np.inf]


@pytest.mark.parametrize("structure, says", [
    (Structure("regex", "[a-"), "invalid regex"),
    (Structure("grammar", "start: foo"), "unknown name"),
    (Structure.json_schema({"type": "objectx"}), "objectx"),
    (Structure.choice([]), "non-empty list"),
    (Structure.choice(["a", ""]), "non-empty strings"),
])
def test_bad_specs_are_one_line(structure, says):
    why = structure.problem()
    assert says in why and "\n" not in why


def test_the_engine_ends_structured_replies_and_fails_only_a_broken_one(tok):
    """Random logits (seeded by the last token) through the engine: a choice ends 'stop' with
    the option's ids; a plain request beside it runs to its length; a structured request to an
    engine with no tokenizer fails alone; a grammar the sampler breaks fails its request."""
    v = vocab(tok)
    plain = Request(prompt=(5, 6), max_new_tokens=6)
    choice = Request(prompt=(5, 6), max_new_tokens=30, structure=Structure.choice(CHOICES))
    bare = Engine(RandomExecutor(max_batch=3, max_seq=64, vocab=v))
    no_tok, ok = bare.run([choice, plain])
    assert no_tok.finish == "error" and "tokenizer" in no_tok.error and ok.finish == "length"
    eng = Engine(RandomExecutor(max_batch=3, max_seq=64, vocab=v), grammars=Grammars.of(tok, v))
    a, b = eng.run([choice, plain])
    assert a.finish == "stop" and tok.decode(a.ids) in CHOICES
    assert b.finish == "length" and len(b.ids) == 6

    def breaking(params, scratch, prompt, constraint):  # a sampler that ignores the mask
        s = Sampler(params, scratch, prompt, constraint)
        s.constraint.mask = lambda row, raw: raw
        return s
    import sandwich.runtime.engine as engine_mod

    orig, engine_mod.Sampler = engine_mod.Sampler, breaking
    try:
        bad = eng.run([Request(prompt=(5, 6), max_new_tokens=30, structure=Structure("regex", "z{8}"))])[0]
    finally:
        engine_mod.Sampler = orig
    assert bad.finish == "error" and bad.error.startswith("structured output:")
    assert eng.run([plain])[0].finish == "length"  # and the engine goes on


def test_a_tokenizer_llguidance_cannot_read_is_one_line():
    with pytest.raises(ConfigError, match="structured output cannot read this tokenizer"):
        Grammars("{not a tokenizer", 10, [0]).constraint(Structure("regex", "a"))


@pytest.mark.parametrize("text", ['He said "hi"\\ \n\ttab/é', "emoji 😀 and 中文 \u0001", "\b\f\r", ""])
def test_a_json_string_split_anywhere_reads_as_json_loads_it(text):
    """A streamed tool-calling answer is unescaped as it comes: every split into pieces, with
    ASCII escapes (surrogate pairs) or not, gives json.loads' text and stops at the quote."""
    import random

    from sandwich.runtime.tool_calls import JsonString

    rng = random.Random(0)
    for ascii_only in (True, False):
        enc = json.dumps(text, ensure_ascii=ascii_only)[1:]  # after the opening quote
        for _ in range(100):
            cuts = sorted(rng.sample(range(len(enc) + 1), min(3, len(enc) + 1)))
            pieces = [enc[a:b] for a, b in zip([0, *cuts], [*cuts, len(enc)], strict=True)] + ['}, "x": "y"']
            r = JsonString()
            assert "".join(r.feed(x) for x in pieces) == text and r.done


def test_a_reply_stream_tells_an_answer_from_calls():
    from sandwich.runtime.tool_calls import ReplyStream, Tool, ToolUse

    use = ToolUse((Tool("now"),))
    answer = ReplyStream(use)
    got = [answer.push(x) for x in ['{\n ', ' "respon', 'se": "Hel', 'lo \\', 'n there', '"}']]
    assert got == [(t, []) for t in ["", "", "Hel", "lo ", "\n there", ""]] and answer.mode == "answer"
    assert answer.end() == ("Hello \n there", ())
    calls = ReplyStream(use)
    got = [calls.push(x) for x in ['{"tool_', 'calls": [{"name": "n', 'ow", ', '"arguments": {', '}}]}']]
    assert [t for t, _ in got] == [""] * 5 and [len(d) for _, d in got] == [0, 0, 1, 1, 1]
    start, args = got[2][1][0], got[3][1] + got[4][1]
    assert (start.index, start.name, start.arguments) == (0, "now", "") and start.id.startswith("call_")
    assert [(d.index, d.id, d.arguments) for d in args] == [(0, None, "{"), (0, None, "}")]
    content, made = calls.end()
    assert calls.mode == "calls" and content is None and [(c.name, c.arguments) for c in made] == [("now", "{}")]
    assert made[0].id == start.id  # the id the stream gave


CALLS = [
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\\"ris]}", "n": [1, {"a": 2}]}},'
    ' {"name": "f2", "arguments": {}}]}',
    '{\n  "tool_calls": [\n    {\n      "name": "x\\u00e9\\"",\n      "arguments": {\n        "q": "}]\\\\"'
    '\n      }\n    }\n  ]\n}',
    '{"tool_calls":[{"name":"s","arguments":"str,ing"},{"name":"n","arguments":42 },{"name":"m","arguments":true}]}',
]


@pytest.mark.parametrize("text", CALLS)
def test_calls_split_anywhere_stream_their_starts_then_their_arguments(text):
    """Every split of a calls reply into pieces: each call starts (its id, its name as JSON
    reads it) before any of its arguments, and its argument pieces join to the value's JSON
    text, whatever braces, brackets, commas or escapes sit in its strings."""
    import random

    from sandwich.runtime.tool_calls import CallScanner

    rng = random.Random(1)
    want = [(c["name"], c["arguments"]) for c in json.loads(text)["tool_calls"]]
    for _ in range(100):
        cuts = sorted(rng.sample(range(len(text) + 1), 6))
        scanner, calls = CallScanner(), []
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            for d in scanner.feed(text[a:b]):
                if d.id is not None:
                    assert d.index == len(calls) and d.arguments == ""
                    calls.append([d.name, ""])
                else:
                    assert d.index == len(calls) - 1 and d.arguments
                    calls[-1][1] += d.arguments
        assert [(n, json.loads(a)) for n, a in calls] == want
