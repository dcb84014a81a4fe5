"""High-level AST -> source text; `parse(print_module(m)) == m` for every well-formed AST."""

from __future__ import annotations

from sandwich.dsl import ast as A
from sandwich.dsl.highlevel import ast as H

_PREC = {"or": 1, "and": 2, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
         "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_NOT, _NEG, _ATOM = 3, 7, 8
_INDENT = "    "


def _prec(e) -> int:
    if isinstance(e, A.Binary):
        return _PREC[e.op]
    if isinstance(e, A.Unary):
        return _NOT if e.op == "not" else _NEG
    return _ATOM


def _wrap(e, min_prec: int) -> str:
    text = print_expr(e)
    return f"({text})" if _prec(e) < min_prec else text


def _float(v: float) -> str:
    text = repr(float(v))
    return text if text != "inf" else "inf"


def print_expr(e) -> str:
    """One expression, with the fewest parentheses the grammar needs."""
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, A.IntLit):
        return str(e.value)
    if isinstance(e, A.FloatLit):
        return _float(e.value)
    if isinstance(e, A.BoolLit):
        return "True" if e.value else "False"
    if isinstance(e, A.Unary):
        if e.op == "not":
            return f"not {_wrap(e.operand, _NOT)}"
        return f"-{_wrap(e.operand, _NEG)}"
    if isinstance(e, A.Binary):
        p = _PREC[e.op]
        right_min = p + 1
        left_min = p + 1 if p == 4 else p  # comparisons do not chain
        return f"{_wrap(e.left, left_min)} {e.op} {_wrap(e.right, right_min)}"
    if isinstance(e, A.Call):
        return f"{e.func}({', '.join(print_expr(a) for a in e.args)})"
    if isinstance(e, A.Cast):
        return f"{e.dtype}({print_expr(e.value)})"
    if isinstance(e, A.Index):
        return f"{e.array}[{', '.join(print_expr(i) for i in e.indices)}]"
    raise TypeError(f"not an expression: {e!r}")


def _shape(shape) -> str:
    return f"[{', '.join(print_expr(s) for s in shape)}]" if shape else ""


def _range(f: H.For) -> str:
    if f.step == A.IntLit(1):
        if f.start == A.IntLit(0):
            return print_expr(f.stop)
        return f"{print_expr(f.start)}, {print_expr(f.stop)}"
    return f"{print_expr(f.start)}, {print_expr(f.stop)}, {print_expr(f.step)}"


def _suite(stmts, depth: int) -> list[str]:
    if not stmts:
        return [_INDENT * depth + "pass"]
    out: list[str] = []
    for s in stmts:
        out.extend(_stmt(s, depth))
    return out


def _if(s: A.If, depth: int, keyword: str) -> list[str]:
    pad = _INDENT * depth
    out = [f"{pad}{keyword} {print_expr(s.cond)}:", *_suite(s.then, depth + 1)]
    if len(s.orelse) == 1 and isinstance(s.orelse[0], A.If):
        out.extend(_if(s.orelse[0], depth, "elif"))
    elif s.orelse:
        out.extend([f"{pad}else:", *_suite(s.orelse, depth + 1)])
    return out


def _stmt(s, depth: int) -> list[str]:
    pad = _INDENT * depth
    if isinstance(s, A.Decl):
        init = f" = {print_expr(s.init)}" if s.init is not None else ""
        return [f"{pad}{s.name}: {s.dtype}{_shape(s.shape)}{init}"]
    if isinstance(s, A.Assign):
        return [f"{pad}{print_expr(s.target)} {s.op} {print_expr(s.value)}"]
    if isinstance(s, A.Assert):
        return [f"{pad}assert {print_expr(s.cond)}"]
    if isinstance(s, A.Prefetch):
        return [f"{pad}prefetch({print_expr(s.target)})"]
    if isinstance(s, A.Tile):
        return [f"{pad}{s.op}({', '.join(print_expr(a) for a in s.args)})"]
    if isinstance(s, H.For):
        return [f"{pad}for {s.var} in {s.kind}({_range(s)}):", *_suite(s.body, depth + 1)]
    if isinstance(s, A.If):
        return _if(s, depth, "if")
    raise TypeError(f"not a statement: {s!r}")


def _tunable(t: A.Tunable) -> str:
    dtype = "int" if t.dtype == "i32" else t.dtype
    if t.domain is None:
        return f"{t.name}: tunable[{dtype}]"
    items = ", ".join(print_expr(d) for d in t.domain)
    return f"{t.name}: tunable[{dtype}] in ({items}{',' if len(t.domain) == 1 else ''})"


def print_kernel(k: H.Kernel) -> str:
    params = ", ".join(f"{p.name}: {p.dtype}{_shape(p.shape)}" for p in k.params)
    lines = [f"def {k.name}({params}):"]
    lines.extend(_INDENT + _tunable(t) for t in k.tunables)
    if k.body or not k.tunables:
        lines.extend(_suite(k.body, 1))
    return "\n".join(lines) + "\n"


def print_module(m: H.Module) -> str:
    """The whole module; kernels are separated by a blank line."""
    return "\n".join(print_kernel(k) for k in m.kernels)
