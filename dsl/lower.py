"""Low-level AST -> high-level AST: C loops become range/parallel/vector/unroll loops and
tunable parameters become explicit tunable declarations."""

from __future__ import annotations

from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLSemanticError
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.lowlevel import ast as L

_KIND = {None: "range", "parallel": "parallel", "vectorize": "vector", "unroll": "unroll"}


def _error(message: str, loc: A.Loc | None, source: str | None) -> DSLSemanticError:
    if loc is None:
        return DSLSemanticError(message)
    return DSLSemanticError(message, file=loc.file, line=loc.line, column=loc.column,
                            source=source)


def _for(f: L.For, source: str | None) -> H.For:
    if f.cond_var != f.var or f.step_var != f.var:
        other = f.cond_var if f.cond_var != f.var else f.step_var
        raise _error(f"loop over '{f.var}' tests or steps '{other}'; write "
                     f"`for ({f.var_dtype} {f.var} = a; {f.var} < b; {f.var} += s)`",
                     f.loc, source)
    if f.var_dtype not in A.INT_DTYPES:
        raise _error(f"loop variable '{f.var}' is {f.var_dtype}; loop variables are i32 or i64",
                     f.loc, source)
    stop = f.stop
    if f.cond_op == "<=":
        stop = A.Binary("+", stop, A.IntLit(1, loc=stop.loc), loc=stop.loc)
    return H.For(f.var, _KIND[f.hint], f.start, stop, f.step, _body(f.body, source), loc=f.loc)


def _stmt(s, source: str | None):
    if isinstance(s, L.For):
        return _for(s, source)
    if isinstance(s, A.If):
        return A.If(s.cond, _body(s.then, source), _body(s.orelse, source), loc=s.loc)
    return s  # Decl, Assign, Assert, Prefetch: the same node at both levels


def _body(stmts, source: str | None) -> tuple:
    return tuple(_stmt(s, source) for s in stmts)


def lower_kernel(k: L.Kernel, source: str | None = None) -> H.Kernel:
    tunables = tuple(p for p in k.params if isinstance(p, A.Tunable))
    params = tuple(p for p in k.params if isinstance(p, A.Param))
    return H.Kernel(k.name, tunables, params, _body(k.body, source), loc=k.loc)


def lower(m: L.Module, source: str | None = None) -> H.Module:
    """Lower a parsed low-level module; `source` only improves error messages."""
    return H.Module(tuple(lower_kernel(k, source) for k in m.kernels), loc=m.loc)
