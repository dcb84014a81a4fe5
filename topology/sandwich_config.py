"""sandwich-config (§5.3): cross-sections of a TopoTree as ServiceConfigs, with the three heuristics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import networkx as nx

from sandwich.errors import ConfigError
from sandwich.models import ModelConfig
from sandwich.payload import make_payload
from sandwich.topology.tree import depth_levels
from sandwich.types import ProcessPlan, ServiceConfig

SPANS_NUMA = -1  # ProcessPlan.numa_node of a process whose cpus lie in several NUMA nodes


def cross_sections(tree: nx.DiGraph, phase: str) -> Iterator[ServiceConfig]:
    """One ServiceConfig per depth, root to leaves: the nodes a horizontal cut meets are the
    processes (tensor-parallel ranks), the PUs under each are its pinned threads."""
    levels = depth_levels(tree)
    cpus_of: dict[str, tuple[int, ...]] = {}
    for level in reversed(levels):
        for node in level:
            kids = list(tree.successors(node))
            cpus_of[node] = sum((cpus_of[c] for c in kids), ()) if kids else (tree.nodes[node]["cpu"],)
    numa = {c: tree.nodes[v].get("os_index", 0) for v, k in tree.nodes(data="kind") if k == "numa" for c in cpus_of[v]}
    for level in levels:
        procs = []
        for node in level:
            cpus = tuple(sorted(cpus_of[node]))
            nodes = {numa.get(c, 0) for c in cpus}
            procs.append(ProcessPlan(cpus=cpus, numa_node=nodes.pop() if len(nodes) == 1 else SPANS_NUMA))
        procs.sort(key=lambda pp: pp.cpus[0])  # canonical order, so equal configs hash equal
        yield ServiceConfig(phase=phase, processes=tuple(procs), threads_per_process=len(procs[0].cpus))


def tp_allowed(model: ModelConfig, tp: int) -> bool:
    """Operator limits: the TP degree must divide the query and KV heads (and the payload shards)."""
    if model.num_attention_heads % tp or model.num_key_value_heads % tp:
        return False
    try:
        make_payload(model, tp=tp)
    except ConfigError:
        return False
    return True


def group_key(config: ServiceConfig) -> tuple[int, tuple[int, ...]]:
    """Early-stopping groups: same process count and same NUMA binding."""
    return config.tp, tuple(p.numa_node for p in config.processes)


@dataclass
class EarlyStopper:
    """Patience per (process count, NUMA) group: after `patience` results in a row that do not
    improve the group's best, the group is closed and its later configurations are skipped."""

    patience: int
    best: dict[tuple, float] = field(default_factory=dict)
    strikes: dict[tuple, int] = field(default_factory=dict)

    def closed(self, key: tuple) -> bool:
        return self.patience > 0 and self.strikes.get(key, 0) >= self.patience

    def record(self, key: tuple, value: float) -> None:
        if value < self.best.get(key, float("inf")):
            self.best[key] = value
            self.strikes[key] = 0
        else:
            self.strikes[key] = self.strikes.get(key, 0) + 1
