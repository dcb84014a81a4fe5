"""Low-level IR nodes that differ from the high level: the C `for` loop and the kernel."""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.dsl.ast import Expr, Loc, Param, Tunable, _loc


@dataclass(frozen=True)
class For:
    """`[hint] for (T var = start; cond_var cond_op stop; step_var += step) { body }`.

    The loop is kept as written (names in all three clauses, `<` or `<=`) so that the
    lowering, not the parser, reports a loop that is not in canonical form.
    """

    hint: str | None  # None, "parallel", "vectorize" or "unroll"
    var: str
    var_dtype: str
    start: Expr
    cond_var: str
    cond_op: str
    stop: Expr
    step_var: str
    step: Expr
    body: tuple
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Kernel:
    """Parameters in source order; a tunable is a parameter the tuner fixes."""

    name: str
    params: tuple[Param | Tunable, ...]
    body: tuple
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Module:
    kernels: tuple[Kernel, ...]
    loc: Loc | None = _loc()
