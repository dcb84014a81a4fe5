"""What every parser produces: online PUs and, per level kind, the partition of PUs it shares."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from sandwich.errors import TopologyError
from sandwich.topology.cpulist import format_cpulist

# Shared-resource levels, outermost first; PUs are the leaves below "core".
LEVEL_KINDS = ("package", "numa", "l3", "cluster", "l2", "core")


@dataclass(frozen=True)
class RawTopology:
    """Parser output, independent of the input format; `build_tree` turns it into a TopoTree."""

    source: str
    name: str
    cpus: tuple[int, ...]
    partitions: Mapping[str, tuple[frozenset[int], ...]]
    numa_index: Mapping[frozenset[int], int] = field(default_factory=dict)
    cache_bytes: Mapping[str, int] = field(default_factory=dict)
    offline: tuple[int, ...] = ()
    memory_only_numa: tuple[int, ...] = ()
    # packages that hold memory-only nodes and no usable cpu (each as those nodes' cpus)
    memory_only_packages: tuple[frozenset[int], ...] = ()
    # Per kind, the blocks no input file reports as an object of that kind (a cpu with no L2
    # entry, cpus whose NUMA node is offline or has no usable memory): kept so that every level
    # covers every cpu, but not counted as that kind's objects (hwloc shows none there).
    filled: Mapping[str, tuple[frozenset[int], ...]] = field(default_factory=dict)


def make_raw(
    *,
    source: str,
    name: str,
    cpus: set[int] | frozenset[int],
    keys: Mapping[str, Mapping[int, Hashable]],
    numa_of: Mapping[int, int] | None = None,
    cache_bytes: Mapping[str, int] | None = None,
    offline: set[int] | frozenset[int] = frozenset(),
    memory_only_numa: tuple[int, ...] = (),
    memory_only_packages: tuple[frozenset[int], ...] = (),
    filled: Mapping[str, frozenset[int]] | None = None,
) -> RawTopology:
    """Validate per-cpu level keys and turn them into partitions.

    A key is any hashable id of the shared resource; when it is a frozenset it is the sibling
    list the OS reported, and must contain the cpu and agree with its siblings' lists.
    """
    if not cpus:
        raise TopologyError(f"{source}: no online cpus found; check the cpu 'online' list")
    partitions: dict[str, tuple[frozenset[int], ...]] = {}
    for kind, key_of in keys.items():
        if kind not in LEVEL_KINDS:
            raise TopologyError(f"{source}: unknown level kind {kind!r}")
        partitions[kind] = _partition(source, kind, cpus, key_of)
    numa_index: dict[frozenset[int], int] = {}
    if numa_of is not None:
        partitions["numa"] = _partition(source, "numa", cpus, numa_of)
        for block in partitions["numa"]:
            numa_index[block] = numa_of[min(block)]
    if "package" not in partitions:
        partitions["package"] = (frozenset(cpus),)
    if "numa" not in partitions:
        partitions["numa"] = (frozenset(cpus),)
        numa_index[frozenset(cpus)] = 0
    if "core" not in partitions:
        partitions["core"] = tuple(frozenset([c]) for c in sorted(cpus))
    return RawTopology(
        source=source,
        name=name,
        cpus=tuple(sorted(cpus)),
        partitions=partitions,
        numa_index=numa_index,
        cache_bytes=dict(cache_bytes or {}),
        offline=tuple(sorted(offline)),
        memory_only_numa=tuple(memory_only_numa),
        memory_only_packages=tuple(memory_only_packages),
        filled={kind: tuple(b for b in partitions[kind] if b <= made_up)
                for kind, made_up in (filled or {}).items() if made_up and kind in partitions},
    )


def _partition(
    source: str, kind: str, cpus: set[int] | frozenset[int], key_of: Mapping[int, Hashable]
) -> tuple[frozenset[int], ...]:
    groups: dict[Hashable, set[int]] = {}
    for cpu in sorted(cpus):
        if cpu not in key_of:
            raise TopologyError(f"{source}: no {kind} information for online cpu {cpu}; the input is incomplete")
        key = key_of[cpu]
        if isinstance(key, frozenset):
            if not key:
                raise TopologyError(f"{source}: cpu {cpu} has an empty {kind} sibling list")
            if cpu not in key:
                raise TopologyError(
                    f"{source}: cpu {cpu} is not in its own {kind} sibling list {format_cpulist(key)}; inconsistent ids"
                )
            key = key & frozenset(cpus)  # siblings that are offline do not count
        groups.setdefault(key, set()).add(cpu)
    for key, members in groups.items():
        if isinstance(key, frozenset) and key != frozenset(members):
            other = min(key - members) if key - members else min(members - key)
            raise TopologyError(
                f"{source}: {kind} sibling lists disagree: cpu {min(members)} lists {format_cpulist(key)} "
                f"but cpu {other} does not; inconsistent ids"
            )
    return tuple(sorted((frozenset(m) for m in groups.values()), key=min))
