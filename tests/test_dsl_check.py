"""Semantic checks: each bad source raises DSLSemanticError naming the problem and place."""

import pytest

from sandwich.dsl.errors import DSLError, DSLSemanticError
from sandwich.dsl.load import load_source
from sandwich.errors import SandwichError

HEAD = "kernel k(tunable i32 mu in {1, 2}, i32 n, f32 s, f32 a[n], i32 idx[n], f32 b[n, mu]) {\n"


def run(stmts: str):
    return load_source(HEAD + stmts + "\n}", file="k.sw")


GOOD = [
    "f32 x = a[0] * 2 + s;",
    "i64 w = n * 2; i32 v = (i32) w;",
    "f32 t[mu, vlen]; t[0, 0] = 1.0;",
    "for (i32 i = 0; i < n; i++) { a[i] = exp(a[i]) + (f32) idx[i]; }",
    "for (i32 i = 0; i < n; i++) { f32 x = 1.0; } for (i32 i = 0; i < n; i++) { f32 x = 2.0; }",
    "bool c = n > 1 && s < 2.0; if (c) { } else { }",
    "f32 y = n > 2 ? s : 0.0; f32 z = max(y, 1) + rsqrt(4);",
    "assert(n % mu == 0);",
    "prefetch(b[n, n + 100]);",
    "b[0, 1] -= select(true, 1.0, s);",
]


@pytest.mark.parametrize("src", GOOD)
def test_well_formed_sources_pass(src):
    run(src)


BAD = [
    ("f32 x = y;", "undefined name 'y'", 2),
    ("q[0] = 1.0;", "undefined name 'q'", 2),
    ("f32 x = a;", "array 'a' used without an index", 2),
    ("f32 x = a[0, 1];", "shape mismatch: 'a' has 1 dimension", 2),
    ("f32 x = s[0];", "'s' is a scalar", 2),
    ("f32 x = a[s];", "index of 'a' must be an integer", 2),
    ("i32 x = s;", "cannot assign f32 to 'x'", 2),
    ("f32 x = n;", "cannot assign i32 to 'x'", 2),
    ("f32 x = s + n;", "type mismatch: f32 \\+ i32", 2),
    ("bool c = n;", "cannot assign i32", 2),
    ("if (n) { }", "if needs a bool condition", 2),
    ("f32 x = exp(n);", "exp needs a float argument", 2),
    ("f32 x = exp(s, s);", "exp takes 1 argument", 2),
    ("f32 x = foo(s);", "unknown function 'foo'", 2),
    ("i32 x = n % s;", "type mismatch", 2),
    ("f32 x = 1.0; f32 x = 2.0;", "'x' is already defined", 2),
    ("f32 n = 1.0;", "'n' is already defined", 2),
    ("for (i32 i = 0; i < n; i++) { for (i32 i = 0; i < n; i++) { } }", "'i' is already defined", 2),
    ("n = 3;", "cannot assign to 'n': it is a param", 2),
    ("mu = 3;", "cannot assign to 'mu': it is a tunable", 2),
    ("a = 1.0;", "it is an array", 2),
    ("for (i32 i = 0; i < n; i++) { i = 2; }", "it is a loop", 2),
    ("for (i32 i = 0; j < n; i++) { }", "loop over 'i' tests or steps 'j'", 2),
    ("for (f32 i = 0; i < n; i++) { }", "loop variables are i32 or i64", 2),
    ("f32 t[s];", "array dimension must be an integer", 2),
    ("i32 m = 4; f32 t[m];", "dimensions may use only scalar parameters", 2),
    ("f32 range = 1.0;", "'range' is a reserved word", 2),
    ("bool c = true; c += true;", "'\\+=' cannot apply to bool", 2),
    ("assert(n);", "assert needs a bool", 2),
    ("f32 t[mu]; prefetch(t[0]);", "prefetch needs an array parameter; 't' is a local", 2),
    ("prefetch(a[0, 1]);", "shape mismatch: 'a' has 1 dimension", 2),
    ("prefetch(a[s]);", "index of 'a' must be an integer", 2),
    ("f32 x = 99999999999999999999 * 1.0;", "does not fit in i64", 2),
    ("f32 x = -true;", "'-' cannot apply to bool", 2),
]


@pytest.mark.parametrize("src,message,line", BAD)
def test_semantic_errors_name_problem_and_place(src, message, line):
    with pytest.raises(DSLSemanticError, match=message) as info:
        run(src)
    assert info.value.file == "k.sw" and info.value.line == line
    assert isinstance(info.value, DSLError) and isinstance(info.value, SandwichError)
    assert "\n    " + src.split(";")[0][:10] in str(info.value)  # the offending line is shown


KERNEL_LEVEL = [
    ("kernel k(tunable i32 mu) { }", "tunable 'mu' has no domain"),
    ("kernel k(tunable f32 mu in {1}) { }", "tunables are i32 or i64"),
    ("kernel k(tunable i8 mu in {1}) { }", "tunables are i32 or i64"),
    ("kernel k(i32 n, i8 Q[n], f32 C[n]) { C[0] = (f32)(Q[0] + 1); }", "i8 is a storage type"),
    ("kernel k(i32 n, u8 Q[n], f32 C[n]) { C[0] = (f32)(-Q[0]); }", "u8 is a storage type"),
    ("kernel k(i32 n, f32 X[n], i32 C[n]) { C[0] = madd16(1, 2, X[0]); }",
     "madd16 needs an integer argument, got f32"),
    ("kernel k(i32 n, i8 Q[n], i32 C[n]) { C[0] = madd16(Q[0], 2, 3); }",
     "i8 is a storage type; cast it for madd16"),
    ("kernel k(i32 n, i32 C[n]) { f32 x = madd16(1, 2, 3); }", "cannot assign i32"),
    ("kernel k(tunable i32 mu in {n}, i32 n) { }", "must be constant"),
    ("kernel k(i32 n, f32 n) { }", "'n' is already defined"),
    ("kernel k(f32 a[m]) { }", "undefined name 'm'"),
    ("kernel k(f32 s, f32 a[s]) { }", "array dimension must be an integer"),
    ("kernel k() { } kernel k() { }", "kernel 'k' is defined twice"),
    ("kernel vlen() { }", "reserved"),
]


@pytest.mark.parametrize("src,message", KERNEL_LEVEL)
def test_kernel_level_errors(src, message):
    with pytest.raises(DSLSemanticError, match=message):
        load_source(src, file="k.sw")


def test_high_level_sources_are_checked_too():
    src = "def k(n: i32):\n    x: f32 = n\n"
    with pytest.raises(DSLSemanticError, match=r"k.swpy:2:14: semantic error: type mismatch"):
        load_source(src, file="k.swpy", level="high")
    with pytest.raises(DSLSemanticError, match="tunable 'mu' has no domain"):
        load_source("def k():\n    mu: tunable[int]\n", level="high")
