"""Imports follow the data flow (ARCHITECTURE.md): a module imports only its own layer and
the layers below it. Read with ast, so nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first; a layer may import itself and every layer before it
CHAIN = ("core", "dsl", "compiler", "tuner", "runtime", "bench", "cli")
# topology stands beside the chain: it reads only the core, and only layers from the tuner
# up (which place processes and threads) read it
TOPOLOGY_READS = {"core", "topology"}
TOPOLOGY_READERS = {"tuner", "runtime", "bench", "cli"}
FOLDERS = {"dsl": "dsl", "compiler": "compiler", "tuner": "tuner", "runtime": "runtime",
           "topology": "topology", "bench": "bench"}
# tvm is built with in compiler/ alone; the MetaSchedule baseline drives TVM's own tuner
TVM_OUTSIDE_COMPILER = {"sandwich.bench.baselines.metaschedule"}


def layer(module: str) -> str:
    """The layer of a `sandwich.*` module name."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in (*FOLDERS, "cli"):
        return parts[1]
    return "core"


def allowed(src: str, dst: str) -> bool:
    if src == dst:
        return True
    if src == "topology":
        return dst in TOPOLOGY_READS
    if dst == "topology":
        return src in TOPOLOGY_READERS
    return CHAIN.index(dst) < CHAIN.index(src)


def source_modules() -> list[tuple[str, Path]]:
    """(module name, file) of every module of the package, as pyproject.toml maps folders."""
    out = []
    for folder, name in (("sandwich", "sandwich"),
                         *((f, f"sandwich.{f}") for f in FOLDERS)):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out.append((".".join((name, *rel)), path))
    return out


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, in functions too."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append((node.lineno, base))
            # `from sandwich import tuner` names the subpackage, not the core
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names
                      if base == "sandwich" and a.name in (*FOLDERS, "cli")]
    return found


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def upward_imports(modules) -> list[str]:
    bad = []
    for module, path in modules:
        src = layer(module)
        for line, target in imports(module, path):
            if target.split(".")[0] != "sandwich" or target == "sandwich":
                continue
            dst = layer(target)
            if not allowed(src, dst):
                bad.append(f"{_where(path)}:{line}: {src} imports {target} ({dst})")
    return bad


def test_the_package_has_every_layer():
    layers = {layer(m) for m, _ in source_modules()}
    assert layers == {*CHAIN, "topology"}


def test_no_module_imports_against_the_data_flow():
    bad = upward_imports(source_modules())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_only_the_compiler_imports_tvm():
    bad = [f"{_where(path)}:{line}: {target}"
           for module, path in source_modules()
           if layer(module) != "compiler" and module not in TVM_OUTSIDE_COMPILER
           for line, target in imports(module, path)
           if target.split(".")[0] in ("tvm", "tvm_ffi")]
    assert not bad, "tvm imported outside compiler/:\n" + "\n".join(bad)


@pytest.mark.parametrize("src,code,dst", [
    ("tuner", "from sandwich.runtime.executor import Executor", "runtime"),
    ("dsl", "from sandwich.compiler import build", "compiler"),
    ("topology", "from sandwich.tuner.search import SandwichSearch", "tuner"),
    ("core", "from .bench import gemm", "bench"),
    ("compiler", "import sandwich.cli", "cli"),
    ("runtime", "from sandwich import bench", "bench"),
])
def test_an_upward_import_is_named(tmp_path, src, code, dst):
    folder = {"core": "sandwich"}.get(src, src)
    module = "sandwich" if src == "core" else f"sandwich.{src}"
    path = tmp_path / folder / "added.py"
    path.parent.mkdir()
    path.write_text(f"def f():\n    {code}\n")
    bad = upward_imports([(f"{module}.added", path)])
    assert len(bad) == 1 and f"{src} imports" in bad[0] and f"({dst})" in bad[0], bad


def test_a_downward_import_passes(tmp_path):
    path = tmp_path / "added.py"
    path.write_text("from sandwich.compiler.target import detect_cpu\nfrom . import tune\n")
    assert upward_imports([("sandwich.tuner.added", path)]) == []
