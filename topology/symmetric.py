"""The largest symmetric sub-tree of an asymmetric TopoTree (offline cores, uneven NUMA nodes)."""

from __future__ import annotations

import math

import networkx as nx

from sandwich.errors import TopologyError
from sandwich.topology.tree import depth_levels, finalize


def largest_symmetric_subtree(tree: nx.DiGraph) -> nx.DiGraph:
    """Choose a fanout per depth, bottom-up: at each depth the candidates are the numbers of
    children that can carry the sub-shape chosen below; keep the feasible vector with the most
    PUs, taking the left-most children that can carry it."""
    levels = depth_levels(tree)
    if any(tree.out_degree(n) == 0 for lv in levels[:-1] for n in lv):
        raise TopologyError(f"{tree.graph.get('source')}: PUs at different depths; cannot make the tree symmetric")
    best: list = [0, None, None]  # size, fanout vector (top-down), good set

    def search(d: int, good: set[str], suffix: tuple[int, ...]) -> None:
        if d < 0:
            if levels[0][0] in good and math.prod(suffix) > best[0]:
                best[:] = [math.prod(suffix), suffix, good]
            return
        counts = {n: sum(1 for c in tree.successors(n) if c in good) for n in levels[d]}
        for f in sorted({c for c in counts.values() if c > 0}, reverse=True):
            search(d - 1, good | {n for n, c in counts.items() if c >= f}, (f, *suffix))

    search(len(levels) - 2, set(levels[-1]), ())
    vec, good = best[1], best[2]
    keep: set[str] = set()
    stack = [(levels[0][0], 0)]
    while stack:
        node, d = stack.pop()
        keep.add(node)
        if d < len(vec):
            stack.extend((c, d + 1) for c in [c for c in tree.successors(node) if c in good][: vec[d]])
    return finalize(tree.subgraph(keep).copy())
