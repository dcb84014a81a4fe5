"""Low-level AST -> C-like source (normalised layout); parse(print_module(m)) == m."""

from __future__ import annotations

from sandwich.dsl import ast as A
from sandwich.dsl.lowlevel import ast as L

_PREC = {"or": 1, "and": 2, "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3,
         "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}
_SYMBOL = {"or": "||", "and": "&&"}
_UNARY, _ATOM = 6, 7
_INDENT = "    "


def _prec(e) -> int:
    if isinstance(e, A.Binary):
        return _PREC[e.op]
    return _UNARY if isinstance(e, (A.Unary, A.Cast)) else _ATOM


def _wrap(e, min_prec: int) -> str:
    text = print_expr(e)
    return f"({text})" if _prec(e) < min_prec else text


def print_expr(e) -> str:
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, A.IntLit):
        return str(e.value)
    if isinstance(e, A.FloatLit):
        return repr(float(e.value))
    if isinstance(e, A.BoolLit):
        return "true" if e.value else "false"
    if isinstance(e, A.Unary):
        return f"{'!' if e.op == 'not' else '-'}{_wrap(e.operand, _UNARY)}"
    if isinstance(e, A.Cast):
        return f"({e.dtype}) {_wrap(e.value, _UNARY)}"
    if isinstance(e, A.Binary):
        p = _PREC[e.op]
        left = _wrap(e.left, p + 1 if p == 3 else p)
        return f"{left} {_SYMBOL.get(e.op, e.op)} {_wrap(e.right, p + 1)}"
    if isinstance(e, A.Call):
        return f"{e.func}({', '.join(print_expr(a) for a in e.args)})"
    if isinstance(e, A.Index):
        return f"{e.array}[{', '.join(print_expr(i) for i in e.indices)}]"
    raise TypeError(f"not an expression: {e!r}")


def _shape(shape) -> str:
    return f"[{', '.join(print_expr(s) for s in shape)}]" if shape else ""


def _block(stmts, depth: int) -> list[str]:
    out: list[str] = []
    for s in stmts:
        out.extend(_stmt(s, depth))
    return out


def _stmt(s, depth: int) -> list[str]:
    pad = _INDENT * depth
    if isinstance(s, A.Decl):
        init = f" = {print_expr(s.init)}" if s.init is not None else ""
        return [f"{pad}{s.dtype} {s.name}{_shape(s.shape)}{init};"]
    if isinstance(s, A.Assign):
        return [f"{pad}{print_expr(s.target)} {s.op} {print_expr(s.value)};"]
    if isinstance(s, A.Assert):
        return [f"{pad}assert({print_expr(s.cond)});"]
    if isinstance(s, A.Prefetch):
        return [f"{pad}prefetch({print_expr(s.target)});"]
    if isinstance(s, A.Tile):
        return [f"{pad}{s.op}({', '.join(print_expr(a) for a in s.args)});"]
    if isinstance(s, L.For):
        hint = f"{s.hint} " if s.hint else ""
        step = (f"{s.step_var}++" if s.step == A.IntLit(1)
                else f"{s.step_var} += {print_expr(s.step)}")
        head = (f"{pad}{hint}for ({s.var_dtype} {s.var} = {print_expr(s.start)}; "
                f"{s.cond_var} {s.cond_op} {print_expr(s.stop)}; {step}) {{")
        return [head, *_block(s.body, depth + 1), pad + "}"]
    if isinstance(s, A.If):
        out = [f"{pad}if ({print_expr(s.cond)}) {{", *_block(s.then, depth + 1)]
        if len(s.orelse) == 1 and isinstance(s.orelse[0], A.If):
            nested = _stmt(s.orelse[0], depth)
            return [*out, f"{pad}}} else {nested[0].lstrip()}", *nested[1:]]
        if s.orelse:
            out += [f"{pad}}} else {{", *_block(s.orelse, depth + 1)]
        return [*out, pad + "}"]
    raise TypeError(f"not a statement: {s!r}")


def _param(p) -> str:
    if isinstance(p, A.Tunable):
        domain = "" if p.domain is None else (
            " in {" + ", ".join(print_expr(d) for d in p.domain) + "}")
        return f"tunable {p.dtype} {p.name}{domain}"
    return f"{p.dtype} {p.name}{_shape(p.shape)}"


def print_kernel(k: L.Kernel) -> str:
    params = "".join(f"\n{_INDENT}{_param(p)}," for p in k.params).rstrip(",")
    head = f"kernel {k.name}({params}\n) {{" if k.params else f"kernel {k.name}() {{"
    return "\n".join([head, *_block(k.body, 1), "}"]) + "\n"


def print_module(m: L.Module) -> str:
    return "\n".join(print_kernel(k) for k in m.kernels)
