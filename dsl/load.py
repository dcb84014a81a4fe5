"""Entry points: source or file -> checked high-level IR (low-level sources are lowered)."""

from __future__ import annotations

from pathlib import Path

from sandwich.dsl.check import check
from sandwich.dsl.errors import DSLError
from sandwich.dsl.highlevel import ast as H
from sandwich.dsl.highlevel.transform import parse as parse_high
from sandwich.dsl.lower import lower
from sandwich.dsl.lowlevel.transform import parse as parse_low

LOW_SUFFIX = ".sw"  # C-like low-level IR
HIGH_SUFFIX = ".swpy"  # Python-like high-level IR
KERNEL_DIR = Path(__file__).parent / "kernels"


def load_source(source: str, *, file: str = "<source>", level: str = "low") -> H.Module:
    """Parse, lower (for level "low") and check; DSLError on any problem."""
    if level == "low":
        return check(lower(parse_low(source, file), source), source)
    if level == "high":
        return check(parse_high(source, file), source)
    raise DSLError(f"unknown IR level {level!r}; use 'low' or 'high'")


def level_of(path: Path) -> str:
    return "high" if path.suffix == HIGH_SUFFIX else "low"


def load_file(path: str | Path) -> H.Module:
    """A kernel file; the suffix says its level (.sw low-level, .swpy high-level)."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DSLError(f"cannot read kernel source {path}: {e}") from None
    return load_source(source, file=str(path), level=level_of(path))


def builtin_kernels() -> dict[str, Path]:
    """The kernels shipped in dsl/kernels, by file stem."""
    return {p.stem: p for p in sorted(KERNEL_DIR.glob(f"*{LOW_SUFFIX}"))}


def load_kernel(name: str) -> H.Kernel:
    """A shipped kernel by name, e.g. load_kernel("gemm")."""
    paths = builtin_kernels()
    if name not in paths:
        raise DSLError(f"no kernel named {name!r}; known: {', '.join(paths)}")
    for k in load_file(paths[name]).kernels:
        if k.name == name:
            return k
    raise DSLError(f"{paths[name]} defines no kernel named {name!r}")
