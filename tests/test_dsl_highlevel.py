"""High-level (Python-like) grammar, printer and the round trip parse(print(ir)) == ir."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandwich.dsl import ast as A
from sandwich.dsl.builtins import RESERVED
from sandwich.dsl.errors import DSLSyntaxError
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.highlevel.printer import print_expr, print_module
from sandwich.dsl.highlevel.transform import parse
from sandwich.dsl.load import builtin_kernels, load_file


def test_tunables_loops_and_aliases():
    m = parse("def k(n: int, a: f32[n, 2 * n]):\n"
              "    mu_m: tunable[int] in (1, 2, 4, 6, 8)\n"
              "    mu_n: tunable[i64] in (vlen,)\n"
              "    for i in parallel(n):\n"
              "        for j in vector(1, n, mu_m):\n"
              "            a[i, j] = float(j)\n")
    (k,) = m.kernels
    assert k.tunables[0] == A.Tunable("mu_m", "i32", tuple(A.IntLit(v) for v in (1, 2, 4, 6, 8)))
    assert k.tunables[1] == A.Tunable("mu_n", "i64", (A.Name("vlen"),))
    assert k.params[0] == A.Param("n", "i32")
    outer = k.body[0]
    assert (outer.kind, outer.start, outer.stop, outer.step) == (
        "parallel", A.IntLit(0), A.Name("n"), A.IntLit(1))
    assert outer.body[0].kind == "vector" and outer.body[0].step == A.Name("mu_m")


def test_elif_and_pass():
    (k,) = parse("def k(x: f32):\n    if x > 1.0:\n        pass\n    elif x < 0.0:\n"
                 "        y: f32 = 1.0\n    else:\n        pass\n").kernels
    (s,) = k.body
    assert s.then == () and s.orelse == (A.If(A.Binary("<", A.Name("x"), A.FloatLit(0.0)),
                                              (A.Decl("y", "f32", (), A.FloatLit(1.0)),), ()),)


@pytest.mark.parametrize("src,message", [
    ("def k():\n    x = \n", "2:9: syntax error: unexpected newline"),
    ("def k():\n        x = 1\n    y = 2\n", "3:5: syntax error: dedent does not match"),
    ("def k():\nx = 1\n", "2:1: syntax error: unexpected 'x', expected an indented block"),
    ("def k(:\n    pass\n", "1:7: syntax error: unexpected ':'"),
    ("def k():\n    for i in loop(3):\n        pass\n", "unexpected 'loop'"),
    ("def k():\n    pass\n    mu: tunable[int] in (1,)\n", "unexpected 'tunable'"),
])
def test_syntax_errors_point_at_the_problem(src, message):
    with pytest.raises(DSLSyntaxError, match=message) as info:
        parse(src, "k.swpy")
    assert str(info.value).startswith("k.swpy:") and str(info.value).endswith("^")


@pytest.mark.parametrize("name", sorted(builtin_kernels()))
def test_shipped_kernels_round_trip(name):
    m = load_file(builtin_kernels()[name])
    assert parse(print_module(m)) == m


def test_printer_parenthesises_only_where_needed():
    e = A.Binary("*", A.Binary("-", A.Name("a"), A.Name("b")), A.Unary("-", A.Name("c")))
    assert print_expr(e) == "(a - b) * -c"
    e = A.Binary("-", A.Name("a"), A.Binary("-", A.Name("b"), A.Name("c")))
    assert print_expr(e) == "a - (b - c)"
    e = A.Binary("<", A.Unary("not", A.Name("p")), A.Binary("==", A.Name("q"), A.Name("r")))
    assert print_expr(e) == "(not p) < (q == r)"


# -- generated IR ---------------------------------------------------------------------
_FIRST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
names = st.builds(lambda a, b: a + b, st.sampled_from(_FIRST),
                  st.text(_FIRST + "0123456789", max_size=4)).filter(lambda s: s not in RESERVED)
dtypes = st.sampled_from(A.DTYPES)
leaves = st.one_of(
    st.builds(A.Name, names),
    st.builds(A.IntLit, st.integers(0, 2**40)),
    st.builds(A.FloatLit, st.floats(min_value=0.0, allow_nan=False)),
    st.builds(A.BoolLit, st.booleans()),
)


def _extend(e):
    return st.one_of(
        st.builds(A.Unary, st.sampled_from(["-", "not"]), e),
        st.builds(A.Binary, st.sampled_from(["+", "-", "*", "/", "%", "<", "<=", ">", ">=",
                                             "==", "!=", "and", "or"]), e, e),
        st.builds(A.Call, names, st.lists(e, max_size=3).map(tuple)),
        st.builds(A.Cast, dtypes, e),
        st.builds(A.Index, names, st.lists(e, min_size=1, max_size=3).map(tuple)),
    )


exprs = st.recursive(leaves, _extend, max_leaves=5)
shapes = st.lists(exprs, max_size=2).map(tuple)
targets = st.one_of(st.builds(A.Name, names),
                    st.builds(A.Index, names, st.lists(exprs, min_size=1, max_size=2).map(tuple)))
simple = st.one_of(
    st.builds(A.Decl, names, dtypes, shapes, st.none() | exprs),
    st.builds(A.Assign, targets, st.sampled_from(A.ASSIGN_OPS), exprs),
    st.builds(A.Assert, exprs),
)


def _blocks(stmt):
    body = st.lists(stmt, max_size=3).map(tuple)
    return st.one_of(
        st.builds(A.If, exprs, body, body),
        st.builds(H.For, names, st.sampled_from(H.LOOP_KINDS), exprs, exprs, exprs, body),
    )


stmts = st.recursive(simple, _blocks, max_leaves=5)
kernels = st.builds(
    H.Kernel, names,
    st.lists(st.builds(A.Tunable, names, dtypes,
                       st.none() | st.lists(exprs, min_size=1, max_size=3).map(tuple)),
             max_size=2).map(tuple),
    st.lists(st.builds(A.Param, names, dtypes, shapes), max_size=3).map(tuple),
    st.lists(stmts, max_size=4).map(tuple),
)
modules = st.builds(H.Module, st.lists(kernels, min_size=1, max_size=2).map(tuple))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modules)
def test_parse_print_round_trip_on_generated_ir(module):
    assert parse(print_module(module)) == module
