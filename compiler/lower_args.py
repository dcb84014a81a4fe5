"""Which kernel parameters become PrimFunc arguments, and the fixed values' types."""

from __future__ import annotations

from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel import ast as H


def check_fixed(kernel: H.Kernel, fixed: dict) -> None:
    scalars = {p.name: p for p in kernel.params if not p.shape}
    for name, value in fixed.items():
        if name not in scalars:
            raise DSLError(f"kernel {kernel.name}: cannot fix {name!r}: not a scalar parameter "
                           f"(scalar parameters: {', '.join(scalars) or 'none'})")
        want_int = scalars[name].dtype in A.INT_DTYPES
        if want_int != isinstance(value, int) or isinstance(value, bool):
            raise DSLError(f"kernel {kernel.name}: {name} is {scalars[name].dtype}, "
                           f"got {value!r}")


def signature(kernel: H.Kernel, args: tuple[str, ...] | None, fixed: dict) -> list:
    """The parameters that are PrimFunc arguments, in order (all of them by default).

    A scalar left out must be fixed or be a whole dimension of an array argument (it is
    then bound from that array's shape, as a GEMM's M); an array left out must be unused."""
    if args is None:
        return list(kernel.params)
    by_name = {p.name: p for p in kernel.params}
    unknown = [a for a in args if a not in by_name]
    if unknown:
        raise DSLError(f"kernel {kernel.name} has no parameter {unknown[0]!r}")
    dims = {d.id for a in args for d in by_name[a].shape if isinstance(d, A.Name)}
    for p in kernel.params:
        if p.name not in args and not p.shape and p.name not in fixed and p.name not in dims:
            raise DSLError(f"kernel {kernel.name}: scalar {p.name} is not an argument, so it "
                           "must be fixed or be a dimension of an array argument")
    return [by_name[a] for a in args]
