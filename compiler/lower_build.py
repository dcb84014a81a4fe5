"""Build one DSL kernel for the host: `--param name=value` pairs -> tunables + fixed
scalars -> TIR -> tvm.compile (the `sandwichc compile` path and the benchmarks)."""

from __future__ import annotations

from pathlib import Path

from sandwich.compiler.amx import request_tiles
from sandwich.compiler.build import compile_source
from sandwich.compiler.lower_tir import to_tvmscript
from sandwich.compiler.target import CpuInfo
from sandwich.dsl import ast as A
from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.space import domains


def split_params(kernel: H.Kernel, params: dict[str, str], *, vlen: int) -> tuple[dict, dict]:
    """`name=value` strings -> (tunable values, fixed scalar parameters), type-checked.

    Every tunable needs a value; any scalar parameter may be fixed (a model constant such
    as the head dimension), the others stay runtime arguments.
    """
    tunables = {t.name for t in kernel.tunables}
    scalars = {p.name: p.dtype for p in kernel.params if not p.shape}
    tun, fixed = {}, {}
    for name, text in params.items():
        if name not in tunables and name not in scalars:
            raise DSLError(f"kernel {kernel.name} has no tunable or scalar parameter {name!r} "
                           f"(tunables: {', '.join(sorted(tunables)) or 'none'}; scalars: "
                           f"{', '.join(scalars) or 'none'})")
        is_int = name in tunables or scalars[name] in A.INT_DTYPES
        try:
            value = int(text) if is_int else float(text)
        except ValueError:
            kind = "an integer" if is_int else "a number"
            raise DSLError(f"--param {name}={text}: the value must be {kind}") from None
        (tun if name in tunables else fixed)[name] = value
    missing = sorted(tunables - set(tun))
    if missing:
        doms = domains(kernel, vlen=vlen)
        raise DSLError(f"kernel {kernel.name}: give every tunable a value; missing "
                       + ", ".join(f"{m} (one of {list(doms[m])})" for m in missing))
    return tun, fixed


def build_kernel(kernel: H.Kernel, *, tunables: dict, fixed: dict | None, cpu: CpuInfo,
                 threads: int, directory: Path | None = None):
    """The compiled kernel (a tvm module; call ex["main"]), kept in `directory` when given
    (compiler/build.compile_source). A kernel with AMX tile statements builds only where
    `cpu` has AMX-BF16; for the host, this process then asks Linux for the tile state, so
    the kernel can run here."""
    source = to_tvmscript(kernel, tunables=tunables, vlen=cpu.lanes_f32, fixed=fixed,
                          amx=cpu.amx, isa=cpu.isa, bf16_dot=cpu.bf16_dot)
    if any(isinstance(s, A.Tile) for s in H.walk(kernel.body)):
        request_tiles()
    return compile_source(source, cpu, threads, directory)
