"""The TopoTree: a NetworkX DiGraph from the machine root down to PU leaves, children ordered."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import networkx as nx

from sandwich.errors import TopologyError
from sandwich.topology.cpulist import format_cpulist
from sandwich.topology.raw import LEVEL_KINDS, RawTopology

ROOT = "machine"


def build_tree(raw: RawTopology) -> nx.DiGraph:
    """Fundamental TopoTree: levels ordered coarse to fine, each refining the one above."""
    kinds = _level_order(raw)
    tree = nx.DiGraph(name=raw.name, source=raw.source, root=ROOT)
    tree.add_node(ROOT, kind="machine")
    parent_of_cpu = {c: ROOT for c in raw.cpus}
    for kind in kinds:
        new_parent: dict[int, str] = {}
        for i, block in enumerate(sorted(raw.partitions[kind], key=min)):
            node = f"{kind}_{i}" if kind[-1].isdigit() else f"{kind}{i}"
            attrs: dict[str, object] = {"kind": kind}
            if kind == "numa":
                attrs["os_index"] = raw.numa_index.get(block, i)
            if kind in raw.cache_bytes:
                attrs["size"] = raw.cache_bytes[kind]
            tree.add_node(node, **attrs)
            tree.add_edge(parent_of_cpu[min(block)], node)
            for c in block:
                new_parent[c] = node
        parent_of_cpu = new_parent
    for c in raw.cpus:
        tree.add_node(f"pu{c}", kind="pu", cpu=c)
        tree.add_edge(parent_of_cpu[c], f"pu{c}")
    return finalize(tree)


def _level_order(raw: RawTopology) -> list[str]:
    parts = {k: frozenset(v) for k, v in raw.partitions.items()}
    # The kernel always exposes cluster_cpus; it is a level only when it says something new.
    if "cluster" in parts and any(parts["cluster"] == parts.get(k) for k in ("core", "l2")):
        del parts["cluster"]
    kinds = sorted(parts, key=lambda k: (len(parts[k]), LEVEL_KINDS.index(k)))
    for upper, lower in zip(kinds, kinds[1:], strict=False):
        for block in parts[lower]:
            if not any(block <= b for b in parts[upper]):
                raise TopologyError(
                    f"{raw.source}: {lower} cpus {format_cpulist(block)} span several {upper} domains; "
                    f"inconsistent ids between the {lower} and {upper} lists"
                )
    return kinds


def finalize(tree: nx.DiGraph) -> nx.DiGraph:
    """Store each node's Merkle hash (kind, cpu id, children's hashes) and the tree's in graph['hash']."""
    for node in reversed(list(nx.topological_sort(tree))):
        tree.nodes[node]["h"] = node_hash(tree.nodes[node], (tree.nodes[c]["h"] for c in tree.successors(node)))
    tree.graph["hash"] = tree.nodes[tree.graph["root"]]["h"].hex()
    return tree


def node_hash(attrs: dict, child_hashes: Iterable[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{attrs['kind']}:{attrs.get('cpu', '')}|".encode())
    for ch in child_hashes:
        h.update(ch)
    return h.digest()


def tree_hash(tree: nx.DiGraph) -> str:
    return tree.graph["hash"]


def root(tree: nx.DiGraph) -> str:
    return tree.graph["root"]


def children(tree: nx.DiGraph, node: str) -> list[str]:
    """Ordered left to right (by smallest cpu id), so 'right-most' is well defined."""
    return list(tree.successors(node))


def depth_levels(tree: nx.DiGraph) -> list[list[str]]:
    """Nodes by depth, left to right; level 0 is the root."""
    levels = [[root(tree)]]
    while True:
        nxt = [c for n in levels[-1] for c in tree.successors(n)]
        if not nxt:
            return levels
        levels.append(nxt)


def leaf_cpus(tree: nx.DiGraph, node: str) -> list[int]:
    """The OS cpu ids of the PUs under `node`, left to right."""
    if tree.nodes[node]["kind"] == "pu":
        return [tree.nodes[node]["cpu"]]
    return [c for ch in tree.successors(node) for c in leaf_cpus(tree, ch)]


def fanouts(tree: nx.DiGraph) -> list[int]:
    """Children per node at each depth; valid for symmetric trees only (see check_symmetric)."""
    return [tree.out_degree(level[0]) for level in depth_levels(tree)[:-1]]


def level_kinds(tree: nx.DiGraph) -> list[str]:
    return [tree.nodes[level[0]]["kind"] for level in depth_levels(tree)]


def summary(tree: nx.DiGraph) -> dict:
    """The `topo show --json` payload: PU and core counts, then each level's kind and count."""
    levels = depth_levels(tree)[1:]
    out = [{"kind": tree.nodes[lv[0]]["kind"], "count": len(lv)} for lv in levels]
    cores = sum(1 for _, k in tree.nodes(data="kind") if k == "core")
    return {"pus": len(levels[-1]) if levels else 0, "cores": cores, "levels": out}


def asymmetry(tree: nx.DiGraph) -> str | None:
    """None when symmetric; else a sentence naming the top-most depth where fanouts differ."""
    for level in depth_levels(tree)[:-1]:
        fan: dict[int, list[str]] = {}
        for node in level:
            fan.setdefault(tree.out_degree(node), []).append(node)
        if len(fan) > 1:
            (common, many), *rest = sorted(fan.items(), key=lambda kv: -len(kv[1]))
            odd, nodes = rest[0]
            child = tree.nodes[next(iter(tree.successors(many[0])))]["kind"] if common else "child"
            return (
                f"{len(nodes)} of {len(level)} {tree.nodes[nodes[0]]['kind']} nodes have {odd} {child} children "
                f"instead of {common}, e.g. {_describe(tree, nodes[0])} vs {_describe(tree, many[0])}"
            )
    return None


def _describe(tree: nx.DiGraph, node: str) -> str:
    return f"{node} (cpus {format_cpulist(leaf_cpus(tree, node))})"


def check_symmetric(tree: nx.DiGraph) -> None:
    """Raise TopologyError naming the asymmetry and the largest symmetric sub-tree on offer."""
    why = asymmetry(tree)
    if why is None:
        return
    from sandwich.topology.symmetric import largest_symmetric_subtree  # avoid an import cycle

    sub = largest_symmetric_subtree(tree)
    cpus = leaf_cpus(sub, root(sub))
    raise TopologyError(
        f"{tree.graph.get('source', 'topology')}: asymmetric machine: {why}; the largest symmetric "
        f"sub-tree has {len(cpus)} PUs (cpus {format_cpulist(cpus)}): pass --trim-asymmetric to search it"
    )
