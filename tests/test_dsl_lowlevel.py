"""Low-level (C-like) grammar: tables of valid and invalid sources."""

import pytest

from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLSyntaxError
from sandwich.dsl.lowlevel import ast as L
from sandwich.dsl.lowlevel.transform import parse


def body(stmts: str):
    return parse(f"kernel k(i32 n, f32 a[n]) {{ {stmts}\n}}").kernels[0].body


VALID = [
    "f32 x = 1.5;",
    "f32 x;",
    "bf16 t[4, n];",
    "a[0] = 2.0;",
    "a[n - 1] += a[0] * 2;",
    "f32 x = (f32) n / 3;",
    "bool b = n > 2 && !(n == 3) || false;",
    "f32 y = n > 2 ? 1.0 : -inf;",
    "f32 z = exp(max(a[0], 0.5));",
    "for (i32 i = 0; i < n; i++) { a[i] = 0.0; }",
    "parallel for (i64 i = 0; i <= n; ++i) { }",
    "vectorize for (i32 i = 2; i < n; i += 2) { a[i] *= a[i]; }",
    "unroll for (i32 i = 0; i < 4; i++) { }",
    "if (n > 0) { a[0] = 1.0; } else if (n < 0) { } else { a[0] = 0.0; }",
    "assert(n % 4 == 0);",
    "prefetch(a[n + 64]);",
    "f32 w = 1e-6 + .5 + 3.e2; // comment",
    "/* block\n comment */ f32 v = 1.0;",
]


@pytest.mark.parametrize("src", VALID)
def test_valid_statements_parse(src):
    assert isinstance(body(src), tuple)


INVALID = [
    ("f32 x = ;", "unexpected ';'"),
    ("x = 1", "unexpected .}., expected .;."),
    ("for (i32 i = 0; i < n; i -= 1) { }", "unexpected '-='"),
    ("for (i32 i = 0; i > n; i++) { }", "unexpected '>'"),
    ("if n > 0 { }", "unexpected 'n'"),
    ("if (n) a[0] = 1.0;", "unexpected 'a'"),
    ("f32 x = 1 $ 2;", "unexpected character '$'"),
    ("f32 f32 = 1.0;", "unexpected 'f32'"),
    ("f32 x = 1 < 2 < 3;", "unexpected '<'"),
    ("f32 x = 123456789012345678901234567890123456789012345;", "too large"),
    ("f32 t[4] = 1.0;", "unexpected '='"),
]


@pytest.mark.parametrize("src,message", INVALID)
def test_invalid_statements_raise_syntax_error(src, message):
    with pytest.raises(DSLSyntaxError, match=message.replace("$", r"\$")):
        body(src)


def test_tunable_params_keep_their_domain():
    k = parse("kernel k(tunable i32 mu in {1, 2 * vlen}, tunable i32 nb, f32 a[mu]) { }").kernels[0]
    mu, nb, a = k.params
    assert mu == A.Tunable("mu", "i32", (A.IntLit(1), A.Binary("*", A.IntLit(2), A.Name("vlen"))))
    assert nb.domain is None  # the checker, not the grammar, rejects a missing domain
    assert a == A.Param("a", "f32", (A.Name("mu"),))


def test_for_loop_keeps_clauses_as_written():
    (f,) = body("parallel for (i32 i = 1; i <= n; i += 2) { }")
    assert f == L.For("parallel", "i", "i32", A.IntLit(1), "i", "<=", A.Name("n"), "i",
                      A.IntLit(2), ())


def test_operators_follow_c_precedence():
    (d,) = body("bool b = !c && x + y * z < w || q;")
    assert d.init == A.Binary("or", A.Binary("and", A.Unary("not", A.Name("c")), A.Binary(
        "<", A.Binary("+", A.Name("x"), A.Binary("*", A.Name("y"), A.Name("z"))),
        A.Name("w"))), A.Name("q"))


def test_ternary_and_cast_become_select_and_cast():
    (d,) = body("f32 y = c ? (f32) n : 0.0;")
    assert d.init == A.Call("select", (A.Name("c"), A.Cast("f32", A.Name("n")), A.FloatLit(0.0)))


def test_else_if_nests_in_orelse():
    (s,) = body("if (a) { } else if (b) { } else { x = 1; }")
    assert s.orelse == (A.If(A.Name("b"), (), (A.Assign(A.Name("x"), "=", A.IntLit(1)),)),)


def test_nodes_carry_locations_that_equality_ignores():
    m = parse("kernel k() {\n  f32 x = 1.0;\n}", "f.sw")
    (d,) = m.kernels[0].body
    assert d.loc == A.Loc("f.sw", 2, 3)
    assert d == A.Decl("x", "f32", (), A.FloatLit(1.0))


def test_several_kernels_in_one_file():
    m = parse("kernel a() { } kernel b(i32 n) { }")
    assert [k.name for k in m.kernels] == ["a", "b"]
