"""Read the CPU topology from hwloc XML (`lstopo --of xml`), format v2 (v1 also parses)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from sandwich.errors import TopologyError
from sandwich.topology.cpulist import parse_hwloc_cpuset
from sandwich.topology.raw import RawTopology, make_raw

_KIND = {"Package": "package", "L3Cache": "l3", "L2Cache": "l2", "Core": "core"}


def parse_hwloc_xml(path: str | Path) -> RawTopology:
    """PUs from the `PU` objects; levels from the cpusets of Package, NUMANode, caches, Core."""
    path = Path(path)
    source = f"hwloc XML {path}"
    if not path.is_file():
        raise TopologyError(f"{source}: file not found; write one with `lstopo --of xml > FILE`")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise TopologyError(f"{source}: not valid XML ({e}); write one with `lstopo --of xml`") from None
    if root.tag != "topology":
        raise TopologyError(f"{source}: root element is <{root.tag}>, expected <topology> from lstopo --of xml")
    keys: dict[str, dict[int, object]] = {}
    sizes: dict[str, int] = {}
    numa_of: dict[int, int] = {}
    memory_only: list[int] = []
    cpus: set[int] = set()
    name = "unknown cpu"
    machine_cpus: frozenset[int] = frozenset()
    for obj in root.iter("object"):
        typ = obj.get("type", "")
        cpuset = parse_hwloc_cpuset(obj.get("cpuset", ""), source=source)
        for info in obj.findall("info"):
            if info.get("name") == "CPUModel" and info.get("value"):
                name = info.get("value", "").strip()
        if typ == "Machine":
            machine_cpus = parse_hwloc_cpuset(obj.get("complete_cpuset", obj.get("cpuset", "")), source=source)
        elif typ == "PU":
            if obj.get("os_index") is None:
                raise TopologyError(f"{source}: a PU object has no os_index; re-export with lstopo --of xml")
            cpus.add(int(obj.get("os_index", "0")))
        elif typ == "NUMANode":
            node = int(obj.get("os_index", "0"))
            if not cpuset:
                memory_only.append(node)
            for c in cpuset:
                numa_of[c] = node
        kind = _KIND.get(typ) or ("cluster" if typ == "Group" and obj.get("subtype") == "Cluster" else None)
        if kind is None:
            continue
        if not cpuset:
            raise TopologyError(f"{source}: a {typ} object has an empty cpuset; inconsistent topology")
        if obj.get("cache_size"):
            sizes.setdefault(kind, int(obj.get("cache_size", "0")))
        for c in cpuset:
            keys.setdefault(kind, {})[c] = cpuset
    if not cpus:
        raise TopologyError(f"{source}: no PU objects; export the full topology with lstopo --of xml")
    return make_raw(
        source=source,
        name=name,
        cpus=frozenset(cpus),
        keys=keys,
        numa_of={c: n for c, n in numa_of.items() if c in cpus} or None,
        cache_bytes=sizes,
        offline=machine_cpus - cpus,
        memory_only_numa=tuple(memory_only),
    )
