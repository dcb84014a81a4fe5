"""Which NUMA nodes and cpus of a sysfs tree count: node cpu lists, memory that is usable
(has_memory, the cpuset cgroup's mems, GPU memory nodes) and the cpus the cpuset allows."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from sandwich.errors import TopologyError
from sandwich.topology.sysfs_files import CPU_DIR, NODE_DIR, PADDING, has_cpus, read_list


def allowed_cpus_and_mems(root: Path, source: str) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """The cpus and memory nodes this process may use (rules cgroup-cpuset, cgroup-cpuset-mems);
    None for either when nothing says."""
    import os

    if root.resolve() == Path("/"):
        return frozenset(os.sched_getaffinity(0)), None
    base = _cpuset_dir(root)
    if base is None:
        return None, None
    found = []
    for names in (("cpus", "cpuset.cpus", "cpuset.cpus.effective"),
                  ("mems", "cpuset.mems", "cpuset.mems.effective")):
        files = [base / n for n in names if (base / n).is_file()]
        found.append(read_list(root, str(files[0].relative_to(root)), source) if files else None)
    if found[1] is not None and not found[1]:
        found[1] = None  # cgroup2 leaves cpuset.mems empty when the parent's apply
    return found[0], found[1]


def _cpuset_dir(root: Path) -> Path | None:
    """The cpuset cgroup directory of proc/self/cpuset under the mount proc/mounts names."""
    own = root / "proc/self/cpuset"
    mounts = root / "proc/mounts"
    if not own.is_file() or not mounts.is_file():
        return None
    group = own.read_text(errors="replace").strip(PADDING).lstrip("/")
    for line in mounts.read_text(errors="replace").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, opts = fields[1], fields[2], fields[3].split(",")
        if fstype == "cpuset" or (fstype == "cgroup" and "cpuset" in opts) or fstype == "cgroup2":
            base = root / point.lstrip("/") / group
            if any((base / n).is_file() for n in ("cpus", "cpuset.cpus", "cpuset.cpus.effective")):
                return base
    return None


def numa_nodes(root: Path, online: frozenset[int], package_of: dict[int, object], mems: frozenset[int] | None,
          source: str) -> tuple[dict[int, int] | None, tuple[int, ...], frozenset[int]]:
    """(cpu -> node, memory-only nodes, cpus whose node block is filled)."""
    node_dir = root / NODE_DIR
    if not node_dir.is_dir():
        return None, (), frozenset()
    with_memory = _nodes_with_memory(root, source, mems)
    numa_of: dict[int, int] = {}
    memory_only = []
    filled: set[int] = set()
    for d in sorted(node_dir.iterdir(), key=lambda p: p.name):
        if not re.fullmatch(r"node\d+", d.name):
            continue
        node = int(d.name[4:])
        cpus = read_list(root, f"{NODE_DIR}/{d.name}/cpulist", source) & online
        has_memory = with_memory is None or node in with_memory
        if not cpus and has_memory:
            memory_only.append(node)
        if not has_memory:  # rules numa-without-memory, cgroup-cpuset-mems, nvidia-gpu-memory
            filled |= cpus
        for c in cpus:
            if c in numa_of:
                if _same_cpus_in_every_node(root, node_dir, online, source):  # rule numa-overlap
                    return None, (), frozenset()
                raise TopologyError(f"{source}: cpu {c} is listed in NUMA nodes {numa_of[c]} and {node}; inconsistent ids")
            numa_of[c] = node
    if not numa_of:
        return None, tuple(memory_only), frozenset()
    orphans = online - numa_of.keys()
    for c in orphans:  # rule cpu-without-node: one filled block per package
        numa_of[c] = -1 - sorted({package_of.get(o, 0) for o in orphans}, key=str).index(package_of.get(c, 0))
    return numa_of, tuple(memory_only), frozenset(filled | orphans)


def _nodes_with_memory(root: Path, source: str, mems: frozenset[int] | None) -> frozenset[int] | None:
    """Nodes whose memory counts (None: all), by rules numa-without-memory, cgroup-cpuset-mems
    and nvidia-gpu-memory."""
    out = None
    if (root / NODE_DIR / "has_memory").is_file():
        out = read_list(root, f"{NODE_DIR}/has_memory", source)
    if mems is not None:
        out = mems if out is None else out & mems
    gpus = root / "proc/driver/nvidia/gpus"
    if gpus.is_dir():
        gpu_nodes = set()
        for status in gpus.glob("*/numa_status"):
            m = re.search(r"Node:\s*(\d+)", status.read_text(errors="replace"))
            if m:
                gpu_nodes.add(int(m.group(1)))
        if gpu_nodes:
            every = {int(d.name[4:]) for d in (root / NODE_DIR).iterdir() if re.fullmatch(r"node\d+", d.name)}
            out = frozenset((every if out is None else out) - gpu_nodes)
    return out


def _same_cpus_in_every_node(root: Path, node_dir: Path, online: frozenset[int], source: str) -> bool:
    lists = {read_list(root, f"{NODE_DIR}/{d.name}/cpulist", source) & online
             for d in node_dir.iterdir() if re.fullmatch(r"node\d+", d.name)}
    return len(lists - {frozenset()}) == 1


def memory_only_packages(root: Path, memory_only: tuple[int, ...], held: set[object],
                         source: str, *, package_of: Callable[[int], object | None]
                         ) -> tuple[frozenset[int], ...]:
    """Rule memory-only-package: the packages of memory-only nodes that hold no usable cpu
    (every cpu of theirs offline or outside the cpuset), each as the node cpus it holds.
    A cpu with no topology directory (an offline one) tells no package: skipped."""
    found: dict[object, set[int]] = {}
    for node in memory_only:
        rel = f"{NODE_DIR}/node{node}/cpulist"
        for cpu in sorted(read_list(root, rel, source) if has_cpus(root, rel) else ()):
            if not (root / CPU_DIR / f"cpu{cpu}" / "topology").is_dir():
                continue
            key = package_of(cpu)
            if key is not None and key not in held:
                found.setdefault(key, set()).add(cpu)
    return tuple(sorted((frozenset(c) for c in found.values()), key=min))
