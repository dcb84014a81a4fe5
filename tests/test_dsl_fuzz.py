"""Fuzz both parsers (issue 3): generated and mutated sources end in DSLError or succeed.

Never another exception: no Lark error, no IndexError from error formatting, no
RecursionError, no AssertionError from the indenter. 5,000 examples per level.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel.printer import print_module
from sandwich.dsl.load import load_source

LOW_SEEDS = [
    """kernel silu(i32 M, i32 N, f32 x[M, 2 * N], f32 out[M, N]) {
    parallel for (i32 i = 0; i < M; i++) {
        vectorize for (i32 j = 0; j < N; j++) {
            f32 g = x[i, j];
            out[i, j] = g / (1.0 + exp(-g)) * x[i, N + j];
        }
    }
}""",
    """// all statement kinds
kernel k(tunable i32 mu in {1, 2 * vlen}, i32 n, f32 s, f32 a[n], i32 idx[n]) {
    assert(n % mu == 0);
    f32 t[mu, vlen];
    bool c = n > 1 && !(s < 2.0) || false;
    unroll for (i32 i = 0; i <= mu - 1; i += 1) { t[i, 0] = (f32) idx[i] * 1e-3; }
    if (c) { a[0] += c ? s : -inf; } else if (n == 2) { a[1] = rsqrt(max(s, 1)); } else { }
}""",
]
HIGH_SEEDS = [print_module(load_source(s)) for s in LOW_SEEDS] + [
    """def k(n: i32, a: f32[n],):
    mu: tunable[int] in (1, 2, 4)
    # a comment
    for i in parallel(0, n, mu):
        x: f32 = a[i] * 2.0
        if x > 1.0 and not x < 0.5:
            pass
        elif x == 3.0:
            a[i] = select(True, -x, inf)
        else:
            a[(i + 1) % n] -= f32(i)
""",
]
TOKENS = ["(", ")", "{", "}", "[", "]", ";", ",", ":", "=", "+=", "<", "<=", "?", "!", "&&",
          "-", "*", "/", "%", "for", "if", "else", "elif", "in", "tunable", "kernel", "def",
          "range(", "vector(", "parallel", "unroll", "pass", "assert", "f32", "i32", "bool",
          "int", "x", "n", "vlen", "0", "1.5", "1e9", "inf", "True", "\n", "\n    ", "    ",
          "\t", "\r\n", "#", "//", "/*", "*/", "(" * 400, "[" * 300, "-" * 600, "\x00", "é"]

_mutation = st.tuples(
    st.sampled_from(["insert", "delete", "duplicate", "truncate", "replace"]),
    st.floats(0, 1), st.floats(0, 1), st.sampled_from(TOKENS))


def _mutate(src: str, mutations) -> str:
    for kind, a, b, tok in mutations:
        i = int(a * len(src))
        j = min(len(src), i + 1 + int(b * 40))
        if kind == "insert":
            src = src[:i] + tok + src[i:]
        elif kind == "delete":
            src = src[:i] + src[j:]
        elif kind == "duplicate":
            src = src[:j] + src[i:j] + src[j:]
        elif kind == "truncate":
            src = src[:i]
        else:
            src = src[:i] + tok + src[j:]
    return src


def _sources(seeds):
    mutated = st.builds(_mutate, st.sampled_from(seeds), st.lists(_mutation, max_size=4))
    noise = st.lists(st.sampled_from(TOKENS), max_size=30).map(" ".join)
    return st.one_of(mutated, mutated, mutated, noise, st.text(max_size=60))


def _only_dsl_errors(source: str, level: str) -> None:
    try:
        load_source(source, file="fuzz", level=level)
    except DSLError as e:
        assert str(e).startswith("fuzz")  # every message names the input


FUZZ = settings(max_examples=5000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(_sources(LOW_SEEDS))
def test_low_level_parser_raises_only_dsl_errors(source):
    _only_dsl_errors(source, "low")


@FUZZ
@given(_sources(HIGH_SEEDS))
def test_high_level_parser_raises_only_dsl_errors(source):
    _only_dsl_errors(source, "high")


def test_seeds_are_valid():
    for s in LOW_SEEDS:
        load_source(s, level="low")
    for s in HIGH_SEEDS:
        load_source(s, level="high")
