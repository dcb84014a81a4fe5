"""Build TVMScript kernels with tvm.compile, export them as `.so` files and load them back."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sandwich.compiler.gemm_template import GemmProblem, gemm_tvmscript
from sandwich.compiler.llvm_splice import DPBF16PS, splice_module
from sandwich.compiler.target import CpuInfo, tvm_target
from sandwich.errors import BuildError
from sandwich.types import KernelSchedule


def parse_tvmscript(source: str):
    """TVMScript text -> IRModule (only `T` is in scope)."""
    import tvm
    from tvm.script import parse
    from tvm.script import tirx as T

    func = parse(source, extra_vars={"T": T})
    return tvm.IRModule({"main": func})


def compile_source(source: str, cpu: CpuInfo, threads: int):
    """Compile TVMScript for the host; returns the TVM runtime module."""
    import tvm

    try:
        ex = tvm.compile(parse_tvmscript(source), target=tvm_target(cpu, threads))
    except Exception as e:  # TVM raises many types; the user sees one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BuildError(f"TVM failed to compile the kernel: {first}") from e
    return splice_module(ex) if DPBF16PS in source else ex


def build_gemm(schedule: KernelSchedule, *, n: int, k: int, cpu: CpuInfo, threads: int):
    """Compile the GEMM template for the family of one schedule (any M, any slice)."""
    src = gemm_tvmscript(schedule, GemmProblem(n=n, k=k, lanes=cpu.lanes_f32))
    return compile_source(src, cpu, threads)


def export_atomic(executable, path: Path) -> None:
    """Write the `.so` next to its final name, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", prefix=".tmp-", dir=path.parent)
    os.close(fd)
    try:
        executable.export_library(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_function(path: Path, name: str = "main"):
    """Load an exported `.so` and return its packed function."""
    import tvm

    try:
        mod = tvm.runtime.load_module(str(path))
        return mod[name]
    except Exception as e:
        raise BuildError(f"cannot load kernel {path}: {str(e).strip().splitlines()[0] if str(e).strip() else e}") from e


def executable_function(executable, name: str = "main"):
    """The callable of a freshly compiled kernel."""
    return executable[name]
