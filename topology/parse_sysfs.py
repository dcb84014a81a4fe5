"""Read the CPU topology from sysfs, live (`/`) or from a snapshot directory laid out like `/`."""

from __future__ import annotations

import re
from pathlib import Path

from sandwich.errors import TopologyError
from sandwich.topology.cpulist import format_cpulist, parse_cpulist, parse_cpumask
from sandwich.topology.raw import RawTopology, make_raw

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"
_HINT = "point --sysfs-root at a directory laid out like / (sys/devices/system/cpu/...)"

# What real sysfs dumps do that a tidy one does not; each tolerance is one named rule.
RULES = {
    "trailing-padding": "a file's text ends in NUL bytes, spaces or newlines after its value "
                        "(seen in dumps of a 128-core ARM server); they are dropped",
    "mask-instead-of-list": "a kernel without the `*_list` files has only the hex masks "
                            "(`thread_siblings`, `core_siblings`, `shared_cpu_map`, node `cpumap`: "
                            "32-bit words, most significant first); the mask is read instead",
    "empty-online-list": "an empty `online` (or `present`) file lists no cpu; the cpuN "
                         "directories and their `online` flags are read instead, an empty "
                         "flag (a file unreadable when dumped) counting as online",
    "empty-shared-map": "a cache whose shared-cpu mask is all zeros (old ia64 kernels) belongs "
                        "to that cpu alone, as hwloc reads it",
    "cgroup-cpuset": "only the cpus this process may use count: in a snapshot, the cpuset "
                     "cgroup named by proc/self/cpuset under the cpuset mount of proc/mounts "
                     "(`cpus`, `cpuset.cpus` or cgroup2's `cpuset.cpus.effective`); live, the "
                     "process's affinity",
    "numa-overlap": "NUMA nodes that all list the same cpus (a buggy BIOS lists every cpu in "
                    "every node) say nothing usable: the machine is read as one NUMA node, as "
                    "hwloc does; a partial overlap stays an error",
}
_PADDING = "\x00 \t\n"  # rule trailing-padding
# list file -> the mask file older kernels write instead (rule mask-instead-of-list)
_MASK_OF = {"core_cpus_list": "core_cpus", "thread_siblings_list": "thread_siblings",
            "cluster_cpus_list": "cluster_cpus", "shared_cpu_list": "shared_cpu_map",
            "cpulist": "cpumap"}


def parse_sysfs(root: str | Path = "/") -> RawTopology:
    """Online PUs with their package, NUMA node, L3, cluster, L2 and core siblings."""
    root = Path(root)
    source = f"sysfs root {root}"
    cpu_dir = root / CPU_DIR
    if not cpu_dir.is_dir():
        raise TopologyError(f"{source}: missing {CPU_DIR}; {_HINT}")
    online = _online(root, source)
    allowed = _allowed_cpus(root, source)
    if allowed is not None:  # rule cgroup-cpuset
        if not online & allowed:
            raise TopologyError(f"{source}: none of the online cpus {format_cpulist(online)} is "
                                f"allowed by the cpuset ({format_cpulist(allowed)})")
        online = online & allowed
    present = _read_list(root, f"{CPU_DIR}/present", source) if (cpu_dir / "present").exists() else online
    keys: dict[str, dict[int, object]] = {"package": {}, "core": {}, "l2": {}, "l3": {}, "cluster": {}}
    sizes: dict[str, int] = {}
    for cpu in sorted(online):
        topo = f"{CPU_DIR}/cpu{cpu}/topology"
        keys["package"][cpu] = int(_read(root, f"{topo}/physical_package_id", source))
        core_file = f"{topo}/core_cpus_list"
        if not _has_cpus(root, core_file):
            core_file = f"{topo}/thread_siblings_list"  # kernels before 5.9
        keys["core"][cpu] = _read_list(root, core_file, source)
        if _has_cpus(root, f"{topo}/cluster_cpus_list"):
            keys["cluster"][cpu] = _read_list(root, f"{topo}/cluster_cpus_list", source)
        for level, shared, size in _caches(root, cpu, source):
            keys[f"l{level}"][cpu] = shared
            sizes.setdefault(f"l{level}", size)
    keys = {k: v for k, v in keys.items() if v}
    for kind in ("cluster", "l2", "l3"):
        if kind in keys and len(keys[kind]) < len(online):
            missing = min(online - keys[kind].keys())
            raise TopologyError(f"{source}: cpu {missing} has no {kind} entry while other cpus do; incomplete snapshot")
    numa_of, memory_only = _numa(root, online, source)
    return make_raw(
        source=source,
        name=_model_name(root),
        cpus=online,
        keys=keys,
        numa_of=numa_of,
        cache_bytes=sizes,
        offline=present - online,
        memory_only_numa=memory_only,
    )


def _online(root: Path, source: str) -> frozenset[int]:
    for name in ("online", "present"):
        if (root / CPU_DIR / name).exists():
            cpus = _read_list(root, f"{CPU_DIR}/{name}", source)
            if cpus:
                return cpus  # else rule empty-online-list: try the next source
    dirs = [p.name for p in (root / CPU_DIR).iterdir() if re.fullmatch(r"cpu\d+", p.name)]
    if not dirs:
        raise TopologyError(f"{source}: missing {CPU_DIR}/online and no cpuN directories; {_HINT}")
    return frozenset(int(d[3:]) for d in dirs if _is_online(root / CPU_DIR / d))


def _allowed_cpus(root: Path, source: str) -> frozenset[int] | None:
    """The cpus this process may use (rule cgroup-cpuset), or None when nothing says."""
    import os

    if root.resolve() == Path("/"):
        return frozenset(os.sched_getaffinity(0))
    own = root / "proc/self/cpuset"
    mounts = root / "proc/mounts"
    if not own.is_file() or not mounts.is_file():
        return None
    group = own.read_text(errors="replace").strip(_PADDING).lstrip("/")
    for line in mounts.read_text(errors="replace").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, opts = fields[1], fields[2], fields[3].split(",")
        if fstype == "cpuset" or (fstype == "cgroup" and "cpuset" in opts) or fstype == "cgroup2":
            base = root / point.lstrip("/") / group
            for name in ("cpus", "cpuset.cpus", "cpuset.cpus.effective"):
                if (base / name).is_file():
                    rel = str((base / name).relative_to(root))
                    return _read_list(root, rel, source)
    return None


def _is_online(cpu_path: Path) -> bool:
    flag = cpu_path / "online"
    if not flag.exists():
        return True
    value = flag.read_text(errors="replace").strip(_PADDING)
    return value in ("1", "")  # rule empty-online-list: an empty flag, like a missing one


def _caches(root: Path, cpu: int, source: str) -> list[tuple[int, frozenset[int], int]]:
    """(level, shared cpus, bytes) of the unified or data caches of levels 2 and 3."""
    cache_dir = root / CPU_DIR / f"cpu{cpu}" / "cache"
    if not cache_dir.is_dir():
        return []
    out = []
    for index in sorted(cache_dir.glob("index*")):
        rel = index.relative_to(root)
        level = int(_read(root, f"{rel}/level", source))
        kind = _read(root, f"{rel}/type", source)
        if level not in (2, 3) or kind == "Instruction":
            continue
        shared = _read_list(root, f"{rel}/shared_cpu_list", source) or frozenset({cpu})  # rule empty-shared-map
        size_file = index / "size"
        size = _size(_read(root, f"{rel}/size", source), f"{source}: {rel}/size") if size_file.exists() else 0
        out.append((level, shared, size))
    return out


def _numa(root: Path, online: frozenset[int], source: str) -> tuple[dict[int, int] | None, tuple[int, ...]]:
    node_dir = root / NODE_DIR
    if not node_dir.is_dir():
        return None, ()
    numa_of: dict[int, int] = {}
    memory_only = []
    for d in sorted(node_dir.iterdir(), key=lambda p: p.name):
        if not re.fullmatch(r"node\d+", d.name):
            continue
        node = int(d.name[4:])
        cpus = _read_list(root, f"{NODE_DIR}/{d.name}/cpulist", source) & online
        if not cpus:
            memory_only.append(node)
        for c in cpus:
            if c in numa_of:
                if _same_cpus_in_every_node(root, node_dir, online, source):  # rule numa-overlap
                    return None, ()
                raise TopologyError(f"{source}: cpu {c} is listed in NUMA nodes {numa_of[c]} and {node}; inconsistent ids")
            numa_of[c] = node
    if not numa_of:
        return None, tuple(memory_only)
    missing = online - numa_of.keys()
    if missing:
        raise TopologyError(f"{source}: online cpu {min(missing)} is in no {NODE_DIR}/node*/cpulist; inconsistent snapshot")
    return numa_of, tuple(memory_only)


def _same_cpus_in_every_node(root: Path, node_dir: Path, online: frozenset[int], source: str) -> bool:
    lists = {_read_list(root, f"{NODE_DIR}/{d.name}/cpulist", source) & online
             for d in node_dir.iterdir() if re.fullmatch(r"node\d+", d.name)}
    return len(lists - {frozenset()}) == 1


def _model_name(root: Path) -> str:
    info = root / "proc" / "cpuinfo"
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model name", "cpu model") and value.strip():
                return value.strip()
    return "unknown cpu"


def _read(root: Path, rel: str, source: str) -> str:
    path = root / rel
    if not path.exists():
        raise TopologyError(f"{source}: missing {rel}; {_HINT}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"{source}: cannot read {rel} as text ({e})") from None
    return text.strip(_PADDING)  # rule trailing-padding (and leading, for symmetry)


def _mask_file(rel: str) -> str | None:
    head, _, name = rel.rpartition("/")
    mask = _MASK_OF.get(name)
    return f"{head}/{mask}" if mask else None


def _has_cpus(root: Path, rel: str) -> bool:
    """The list file, or the mask an older kernel writes instead, exists."""
    mask = _mask_file(rel)
    return (root / rel).exists() or (mask is not None and (root / mask).exists())


def _read_list(root: Path, rel: str, source: str) -> frozenset[int]:
    mask = _mask_file(rel)
    if not (root / rel).exists() and mask is not None and (root / mask).exists():
        return parse_cpumask(_read(root, mask, source), source=f"{source}: {mask}")  # rule mask-instead-of-list
    return parse_cpulist(_read(root, rel, source), source=f"{source}: {rel}")


def _size(text: str, source: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(i?B)?", text)
    if not m:
        raise TopologyError(f"{source}: bad cache size {text!r}; expected e.g. '32768K'")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
