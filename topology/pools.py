"""Cores in the TopoTree's left-to-right order, for placing disjoint process pools (Splitwise's
prompt and token pools): neighbours in the order share the most (cache, die, package), so
the first P cores and the last D sit as far apart as the tree allows."""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from sandwich.topology.tree import depth_levels, leaf_cpus


def core_cpus(tree: nx.DiGraph, allowed: Iterable[int] | None = None) -> list[int]:
    """One PU per core (its first allowed one), cores left to right; a tree without core
    nodes gives every allowed PU."""
    ok = None if allowed is None else set(allowed)
    cores = [n for level in depth_levels(tree) for n in level if tree.nodes[n]["kind"] == "core"]
    groups = [leaf_cpus(tree, c) for c in cores] or [[c] for c in leaf_cpus(tree, tree.graph["root"])]
    out = []
    for pus in groups:
        mine = [c for c in pus if ok is None or c in ok]
        if mine:
            out.append(mine[0])
    return out
