"""High-level IR nodes that differ from the low level: the range-style loop and the kernel."""

from __future__ import annotations

from dataclasses import dataclass

from sandwich.dsl.ast import Expr, Loc, Param, Tunable, _loc

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
