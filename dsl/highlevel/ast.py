"""High-level IR nodes that differ from the low level: the range-style loop and the kernel."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sandwich.dsl.ast import Expr, If, Loc, Param, Tunable, _loc

LOOP_KINDS = ("range", "parallel", "vector", "unroll")


@dataclass(frozen=True)
class For:
    """`for var in kind(start, stop, step):` -- kind says how the loop maps onto the CPU.

    `vector` loops are split by the target's SIMD width (vlen) and vectorised; `parallel`
    loops are spread over threads; `unroll` loops are fully unrolled.
    """

    var: str
    kind: str
    start: Expr
    stop: Expr
    step: Expr
    body: tuple
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Kernel:
    """Tunables (the search space the tuner sees) are declared apart from the arguments."""

    name: str
    tunables: tuple[Tunable, ...]
    params: tuple[Param, ...]
    body: tuple
    loc: Loc | None = _loc()


@dataclass(frozen=True)
class Module:
    kernels: tuple[Kernel, ...]
    loc: Loc | None = _loc()


def walk(stmts) -> Iterator:
    """Every statement of a high-level body, depth first, through `if` branches and loops."""
    for s in stmts:
        yield s
        if isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse)
        elif isinstance(s, For):
            yield from walk(s.body)
