"""The search space a DSL kernel exposes to the tuner: tunable domains and constraints."""

from __future__ import annotations

from sandwich.dsl import ast as A
from sandwich.dsl.check import _names
from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.interp import Interpreter


def domains(kernel: H.Kernel, *, vlen: int) -> dict[str, tuple[int, ...]]:
    """Candidate values of each tunable on a target with `vlen` f32 lanes, duplicates dropped."""
    interp = Interpreter({A.VLEN: vlen})
    return {t.name: tuple(dict.fromkeys(int(interp.expr(d)) for d in t.domain or ()))
            for t in kernel.tunables}


def constraints(kernel: H.Kernel) -> tuple[A.Assert, ...]:
    """Top-level asserts that mention only tunables and vlen: they prune the search space."""
    known = {t.name for t in kernel.tunables} | {A.VLEN}
    return tuple(s for s in kernel.body
                 if isinstance(s, A.Assert) and set(_names(s.cond)) <= known)


def is_valid(kernel: H.Kernel, values: dict[str, int], *, vlen: int) -> bool:
    """True when every tunable has a value from its domain and the constraints hold."""
    doms = domains(kernel, vlen=vlen)
    if set(values) != set(doms) or any(values[k] not in doms[k] for k in doms):
        return False
    interp = Interpreter({A.VLEN: vlen, **values})
    try:
        return all(interp.expr(c.cond) for c in constraints(kernel))
    except ZeroDivisionError:
        return False


def require_valid(kernel: H.Kernel, values: dict[str, int], *, vlen: int) -> None:
    if not is_valid(kernel, values, vlen=vlen):
        raise DSLError(f"kernel {kernel.name}: tunable values {values} are outside the "
                       f"search space (domains {domains(kernel, vlen=vlen)}, vlen={vlen})")
