"""Read the CPU topology from sysfs, live (`/`) or from a snapshot directory laid out like `/`."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from sandwich.errors import TopologyError
from sandwich.topology.cpulist import format_cpulist
from sandwich.topology.raw import RawTopology, make_raw
from sandwich.topology.sysfs_files import CPU_DIR, HINT, PADDING, first, has_cpus, read, read_list
from sandwich.topology.sysfs_memory import allowed_cpus_and_mems, memory_only_packages, numa_nodes

# What real sysfs dumps do that a tidy one does not; each tolerance is one named rule.
RULES = {
    "trailing-padding": "a file's text ends in NUL bytes, spaces or newlines after its value "
                        "(seen in dumps of a 128-core ARM server); they are dropped",
    "mask-instead-of-list": "a kernel without the `*_list` files has only the hex masks "
                            "(`thread_siblings`, `core_siblings`, `shared_cpu_map`, node `cpumap`: "
                            "32-bit words, most significant first); the mask is read instead",
    "mask-over-list": "where both a list and its mask exist, the mask is read, as hwloc reads only "
                      "masks: a 3.x kernel on a 64-core Opteron 6276 wrote `shared_cpu_list` 0 "
                      "beside `shared_cpu_map` 0x3 for an L2 that two cores share",
    "empty-online-list": "an empty `online` (or `present`) file lists no cpu; the cpuN "
                         "directories and their `online` flags are read instead, an empty "
                         "flag (a file unreadable when dumped) counting as online",
    "empty-shared-map": "a cache whose shared-cpu mask is all zeros (old ia64 kernels) is shared "
                        "by the cpu's core (its thread siblings), as hwloc reads it",
    "package-by-siblings": "a package is the set of cpus in `package_cpus` (`core_siblings` before "
                           "5.9), as hwloc reads it; `physical_package_id` only when neither "
                           "exists, since ids repeat across nodes on ia64 and are -1 on ppc and s390",
    "missing-package": "a kernel with neither package masks nor `physical_package_id` (the PS3) "
                       "says nothing of packages: one filled package holds every cpu",
    "missing-core": "a kernel with package information but neither `core_cpus` nor "
                    "`thread_siblings` says nothing of cores: each cpu is a filled core",
    "cgroup-cpuset": "only the cpus this process may use count: in a snapshot, the cpuset "
                     "cgroup named by proc/self/cpuset under the cpuset mount of proc/mounts "
                     "(`cpus`, `cpuset.cpus` or cgroup2's `cpuset.cpus.effective`); live, the "
                     "process's affinity",
    "numa-overlap": "NUMA nodes that all list the same cpus (a buggy BIOS lists every cpu in "
                    "every node) say nothing usable: the machine is read as one NUMA node, as "
                    "hwloc does; a partial overlap stays an error",
    "cgroup-cpuset-mems": "only the memory this process may use counts: a node outside the "
                          "cpuset cgroup's `mems` (`cpuset.mems`, `cpuset.mems.effective`) is no "
                          "NUMA node; its allowed cpus keep it as a filled block",
    "amd-compute-unit": "on AMD families 0x15/0x16 (Bulldozer to Jaguar, per proc/cpuinfo) the two "
                        "cores of a compute unit are listed as thread siblings but keep their own "
                        "`core_id`: each is a core, and they share the unit's L2, as hwloc reads them",
    "missing-cache": "a cpu with no entry for a cache level other cpus have (hwloc's "
                     "8em64t-2s4c-asymcaches: cpus 0 and 4 report only L1) is given a private "
                     "block at that level, marked filled; hwloc puts it under no cache",
    "redundant-cluster": "a cluster level each of whose blocks is a core, L2, L3 or package block "
                         "says nothing (x86 writes cluster_cpus equal to the core on P-cores and "
                         "to the L2 on E-cores): dropped, as hwloc merges identical groups",
    "cpu-without-node": "online cpus in no node's cpulist (their node is offline: hwloc's "
                        "offline-cpu0-node0) are grouped per package into filled NUMA blocks",
    "numa-without-memory": "a node with cpus but no memory (not in node/has_memory: HMAT "
                           "initiators) is no NUMA node; its cpus keep it as a filled block, and "
                           "a node with neither cpus nor memory (a generic initiator) is dropped",
    "memory-only-package": "a memory-only node (its memory allowed, none of its cpus) whose "
                           "package holds no usable cpu keeps that package as an object with "
                           "memory and no PU, as hwloc shows it (hwloc's 16amd64-8n2c-cpusets); "
                           "it is counted, not put in the tree, which places only PUs",
    "nvidia-gpu-memory": "a node that proc/driver/nvidia/gpus/*/numa_status names is a GPU's "
                         "memory, not a CPU memory node: dropped (hwloc drops it on POWER and "
                         "shows it as GPUMemory elsewhere)",
}


def parse_sysfs(root: str | Path = "/") -> RawTopology:
    """Online PUs with their package, NUMA node, L3, cluster, L2 and core siblings."""
    root = Path(root)
    source = f"sysfs root {root}"
    cpu_dir = root / CPU_DIR
    if not cpu_dir.is_dir():
        raise TopologyError(f"{source}: missing {CPU_DIR}; {HINT}")
    online = _online(root, source)
    allowed, mems = allowed_cpus_and_mems(root, source)
    if allowed is not None:  # rule cgroup-cpuset
        if not online & allowed:
            raise TopologyError(f"{source}: none of the online cpus {format_cpulist(online)} is "
                                f"allowed by the cpuset ({format_cpulist(allowed)})")
        online = online & allowed
    present = read_list(root, f"{CPU_DIR}/present", source) if (cpu_dir / "present").exists() else online
    keys: dict[str, dict[int, object]] = {"package": {}, "core": {}, "l2": {}, "l3": {}, "cluster": {}}
    sizes: dict[str, int] = {}
    filled: dict[str, frozenset[int]] = {}
    compute_units = _amd_with_compute_units(root)
    for cpu in sorted(online):
        topo = f"{CPU_DIR}/cpu{cpu}/topology"
        package = _package_key(root, cpu, source)
        if package is not None:
            keys["package"][cpu] = package
        else:
            filled["package"] = online  # rule missing-package
        core_file = first(root, f"{topo}/core_cpus_list", f"{topo}/thread_siblings_list")  # the latter before 5.9
        if core_file:
            keys["core"][cpu] = read_list(root, core_file, source)
        if compute_units and cpu in keys["core"] and _own_core_id(root, cpu, keys["core"][cpu] & online, source):
            keys["core"][cpu] = frozenset({cpu})  # rule amd-compute-unit
        if has_cpus(root, f"{topo}/cluster_cpus_list"):
            keys["cluster"][cpu] = read_list(root, f"{topo}/cluster_cpus_list", source)
        for level, shared, size in _caches(root, cpu, keys["core"].get(cpu, frozenset({cpu})), source):
            keys[f"l{level}"][cpu] = shared
            sizes.setdefault(f"l{level}", size)
    coreless = online - keys["core"].keys()
    if coreless == online and keys["package"]:
        filled["core"] = online  # rule missing-core
    elif coreless:
        read(root, f"{CPU_DIR}/cpu{min(coreless)}/topology/thread_siblings_list", source)  # says which
    keys = {k: v for k, v in keys.items() if v}
    if "cluster" in keys and len(keys["cluster"]) < len(online):
        missing = min(online - keys["cluster"].keys())
        raise TopologyError(f"{source}: cpu {missing} has no cluster entry while other cpus do; incomplete snapshot")
    for kind in ("l2", "l3"):
        if kind in keys and len(keys[kind]) < len(online):  # rule missing-cache
            filled[kind] = online - keys[kind].keys()
            keys[kind].update({c: frozenset({c}) for c in filled[kind]})
    numa_of, memory_only, filled["numa"] = numa_nodes(root, online, keys.get("package", {}), mems, source)
    held = set(keys.get("package", {}).values())
    memory_packages = memory_only_packages(root, memory_only, held, source,
                                           package_of=lambda c: _package_key(root, c, source))
    try:
        raw = make_raw(
            source=source,
            name=_model_name(root),
            cpus=online,
            keys=keys,
            numa_of=numa_of,
            cache_bytes=sizes,
            offline=present - online,
            memory_only_numa=memory_only,
            memory_only_packages=memory_packages,
            filled=filled,
        )
    except TopologyError as e:  # name the files the disagreeing lists came from
        kind = next((k for k in _FILES if f" {k} sibling" in str(e)), None)
        raise TopologyError(f"{e} (in {CPU_DIR}/cpu*/{_FILES[kind]})" if kind else str(e)) from None
    if "cluster" in raw.partitions and _redundant(raw, "cluster"):  # rule redundant-cluster
        raw = replace(raw, partitions={k: v for k, v in raw.partitions.items() if k != "cluster"})
    return raw


# which file each kind's sibling lists come from, for error messages
_FILES = {"core": "topology/core_cpus_list or thread_siblings_list", "package": "topology/package_cpus_list "
          "or core_siblings_list", "cluster": "topology/cluster_cpus_list",
          "l2": "cache/index*/shared_cpu_list (level 2)", "l3": "cache/index*/shared_cpu_list (level 3)"}


def _package_key(root: Path, cpu: int, source: str) -> object | None:
    """The cpu's package: its sibling list (rule package-by-siblings), else its
    `physical_package_id`; None when the kernel says nothing of packages (rule missing-package).
    A cpu without a topology directory names the missing id file in the error."""
    topo = f"{CPU_DIR}/cpu{cpu}/topology"
    package_file = first(root, f"{topo}/package_cpus_list", f"{topo}/core_siblings_list")
    if package_file:
        return read_list(root, package_file, source)
    if (root / topo / "physical_package_id").exists() or not (root / topo).is_dir():
        return int(read(root, f"{topo}/physical_package_id", source))
    return None


def _redundant(raw: RawTopology, kind: str) -> bool:
    others = {b for k, blocks in raw.partitions.items() if k in ("core", "l2", "l3", "package")
              for b in blocks}
    return set(raw.partitions[kind]) <= others


def _cpuinfo(root: Path) -> dict[str, str]:
    """The fields of the first processor in proc/cpuinfo ({} when there is none)."""
    info = root / "proc" / "cpuinfo"
    out: dict[str, str] = {}
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if not line.strip() and out:
                break
            key, _, value = line.partition(":")
            out.setdefault(key.strip(), value.strip())
    return out


def _amd_with_compute_units(root: Path) -> bool:
    info = _cpuinfo(root)
    return info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") in ("21", "22")


def _own_core_id(root: Path, cpu: int, siblings: frozenset[int], source: str) -> bool:
    """A thread sibling has another core_id than `cpu` (rule amd-compute-unit)."""
    others = siblings - {cpu}
    if not others:
        return False
    mine = read(root, f"{CPU_DIR}/cpu{cpu}/topology/core_id", source)
    return read(root, f"{CPU_DIR}/cpu{min(others)}/topology/core_id", source) != mine


def _online(root: Path, source: str) -> frozenset[int]:
    for name in ("online", "present"):
        if (root / CPU_DIR / name).exists():
            cpus = read_list(root, f"{CPU_DIR}/{name}", source)
            if cpus:
                return cpus  # else rule empty-online-list: try the next source
    dirs = [p.name for p in (root / CPU_DIR).iterdir() if re.fullmatch(r"cpu\d+", p.name)]
    if not dirs:
        raise TopologyError(f"{source}: missing {CPU_DIR}/online and no cpuN directories; {HINT}")
    return frozenset(int(d[3:]) for d in dirs if _is_online(root / CPU_DIR / d))


def _is_online(cpu_path: Path) -> bool:
    flag = cpu_path / "online"
    if not flag.exists():
        return True
    value = flag.read_text(errors="replace").strip(PADDING)
    return value in ("1", "")  # rule empty-online-list: an empty flag, like a missing one


def _caches(root: Path, cpu: int, core: frozenset[int], source: str) -> list[tuple[int, frozenset[int], int]]:
    """(level, shared cpus, bytes) of the unified or data caches of levels 2 and 3."""
    cache_dir = root / CPU_DIR / f"cpu{cpu}" / "cache"
    if not cache_dir.is_dir():
        return []
    out = []
    for index in sorted(cache_dir.glob("index*")):
        rel = index.relative_to(root)
        level = int(read(root, f"{rel}/level", source))
        kind = read(root, f"{rel}/type", source)
        if level not in (2, 3) or kind == "Instruction":
            continue
        shared = read_list(root, f"{rel}/shared_cpu_list", source) or core  # rule empty-shared-map
        size_file = index / "size"
        size = _size(read(root, f"{rel}/size", source), f"{source}: {rel}/size") if size_file.exists() else 0
        out.append((level, shared, size))
    return out


def _model_name(root: Path) -> str:
    info = root / "proc" / "cpuinfo"
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model name", "cpu model") and value.strip():
                return value.strip()
    return "unknown cpu"


def _size(text: str, source: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(i?B)?", text)
    if not m:
        raise TopologyError(f"{source}: bad cache size {text!r}; expected e.g. '32768K'")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
