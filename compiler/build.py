"""Build TVMScript kernels with tvm.compile, export them as `.so` files and load them back."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from sandwich.compiler.gemm_template import GemmProblem, gemm_tvmscript
from sandwich.compiler.llvm_splice import STAND_INS, splice_module
from sandwich.compiler.target import CpuInfo, tvm_target
from sandwich.errors import BuildError, first_line
from sandwich.types import KernelSchedule


def parse_tvmscript(source: str):
    """TVMScript text -> IRModule (only `T` is in scope)."""
    import tvm
    from tvm.script import parse
    from tvm.script import tirx as T

    func = parse(source, extra_vars={"T": T})
    return tvm.IRModule({"main": func})


# the modules this process compiled, by source and target: a process that makes several
# executors (a plan measured phase by phase, Splitwise's pools, a test worker) builds each
# norm, RoPE and attention kernel once, not once per executor (about 1 s each on a Zen 3,
# most of it TVMScript's parser). A module is never changed after it is built, so one
# serves every caller. Failed builds are not kept: each caller sees the error.
_BUILT: OrderedDict[str, object] = OrderedDict()
_BUILT_MAX = 128
_BUILT_LOCK = threading.Lock()


def _source_key(source: str, target) -> str:
    """Names a build: TVM's version, the target (CPU, features, threads) and the source."""
    import tvm

    return hashlib.sha256(f"{tvm.__version__}\0{target}\0{source}".encode()).hexdigest()


def _remember(key: str, module):
    with _BUILT_LOCK:
        _BUILT[key] = module
        while len(_BUILT) > _BUILT_MAX:
            _BUILT.popitem(last=False)
    return module


def _recalled(key: str):
    with _BUILT_LOCK:
        if key in _BUILT:
            _BUILT.move_to_end(key)
        return _BUILT.get(key)


class StoredBuild:
    """A module loaded from a build directory: it runs as the compiled one does, and its
    export copies the file (a loaded `.so` holds no object code for TVM to link again)."""

    def __init__(self, module, path: Path) -> None:
        self.module, self.path = module, path

    def __getitem__(self, name: str):
        return self.module[name]

    def export_library(self, file_name: str) -> None:
        shutil.copyfile(self.path, file_name)


def compile_source(source: str, cpu: CpuInfo, threads: int, directory: Path | None = None):
    """Compile TVMScript for the host; returns the TVM runtime module: the same one again
    for the same source and target in this process (_BUILT), and with a `directory` (and
    $SANDWICHC_BUILD_CACHE) kept there as `<key>.so` for other processes. The runtime's own
    kernels (norms, RoPE, attention) are not tuned and take no record, so the kernel cache
    keeps them this way: each `generate`, `serve` or plan measurement after the first loads
    them instead of compiling (1-2 s per kernel on a 2-core machine). A build found in one
    directory is copied to the other; a file that does not load is built again and replaced."""
    import tvm

    target = tvm_target(cpu, threads)
    key = _source_key(source, target)
    dirs = dict.fromkeys(str(d) for d in (directory, os.environ.get("SANDWICHC_BUILD_CACHE")) if d)
    paths = [Path(d) / f"{key}.so" for d in dirs]
    ex, stale = _recalled(key), []
    for path in paths if ex is None else ():
        if path.exists():
            try:
                ex = _remember(key, StoredBuild(load_module(path), path))
                break
            except BuildError:
                stale.append(path)  # a damaged or foreign file: replaced below
    if ex is None:
        try:
            ex = tvm.compile(parse_tvmscript(source), target=target)
        except Exception as e:  # TVM raises many types; the user sees one line
            first = first_line(e)
            raise BuildError(f"TVM failed to compile the kernel: {first}") from e
        ex = _remember(key, splice_module(ex) if any(n in source for n in STAND_INS) else ex)
    for path in paths:
        if path in stale or not path.exists():
            _keep(ex, path)
    return ex


def _keep(ex, path: Path) -> None:
    try:
        export_atomic(ex, path)
    except OSError:
        pass  # a read-only directory still runs, it only compiles again next time


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


def load_module(path: Path):
    """Load an exported `.so` (one BuildError line if it cannot be)."""
    import tvm

    try:
        return tvm.runtime.load_module(str(path))
    except Exception as e:
        raise BuildError(f"cannot load kernel {path}: {first_line(e)}") from e


def load_function(path: Path, name: str = "main"):
    """Load an exported `.so` and return its packed function."""
    mod = load_module(path)
    try:
        return mod[name]
    except Exception as e:
        raise BuildError(f"cannot load kernel {path}: {first_line(e)}") from e


def executable_function(executable, name: str = "main"):
    """The callable of a freshly compiled kernel."""
    return executable[name]
