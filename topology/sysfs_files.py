"""The files of a sysfs tree as the parsers read them: cpu lists or the hex masks older
kernels write instead, trailing padding dropped, a missing file named in the error."""

from __future__ import annotations

from pathlib import Path

from sandwich.errors import TopologyError
from sandwich.topology.cpulist import parse_cpulist, parse_cpumask

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"
HINT = "point --sysfs-root at a directory laid out like / (sys/devices/system/cpu/...)"
PADDING = "\x00 \t\n"  # rule trailing-padding
# list file -> the mask file older kernels write instead (rule mask-instead-of-list)
_MASK_OF = {"core_cpus_list": "core_cpus", "thread_siblings_list": "thread_siblings",
            "cluster_cpus_list": "cluster_cpus", "shared_cpu_list": "shared_cpu_map",
            "cpulist": "cpumap", "package_cpus_list": "package_cpus",
            "core_siblings_list": "core_siblings"}


def read(root: Path, rel: str, source: str) -> str:
    """A file's text without its padding; a missing or unreadable file is a TopologyError."""
    path = root / rel
    if not path.exists():
        raise TopologyError(f"{source}: missing {rel}; {HINT}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"{source}: cannot read {rel} as text ({e})") from None
    return text.strip(PADDING)  # rule trailing-padding (and leading, for symmetry)


def mask_file(rel: str) -> str | None:
    """The mask file an older kernel writes in place of list file `rel` (None: it has none)."""
    head, _, name = rel.rpartition("/")
    mask = _MASK_OF.get(name)
    return f"{head}/{mask}" if mask else None


def first(root: Path, *rels: str) -> str | None:
    """The first list file that exists, or whose mask does."""
    return next((rel for rel in rels if has_cpus(root, rel)), None)


def has_cpus(root: Path, rel: str) -> bool:
    """The list file, or the mask an older kernel writes instead, exists."""
    mask = mask_file(rel)
    return (root / rel).exists() or (mask is not None and (root / mask).exists())


def read_list(root: Path, rel: str, source: str) -> frozenset[int]:
    """The cpus of a list file, read from its mask where that exists."""
    mask = mask_file(rel)
    if mask is not None and (root / mask).exists():  # rules mask-instead-of-list, mask-over-list
        return parse_cpumask(read(root, mask, source), source=f"{source}: {mask}")
    return parse_cpulist(read(root, rel, source), source=f"{source}: {rel}")
