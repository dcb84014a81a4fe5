"""The two TopoTree transforms of Sandwich §5.2, as pure functions: a tree in, a new tree out."""

from __future__ import annotations

from collections.abc import Iterator

import networkx as nx

from sandwich.errors import TopologyError
from sandwich.topology.tree import depth_levels, finalize, node_hash, root


def _uniform_fanout(tree: nx.DiGraph, levels: list[list[str]], depth: int, what: str) -> int:
    if not 1 <= depth < len(levels):
        raise TopologyError(f"{what}: depth {depth} is outside 1..{len(levels) - 1} of this tree")
    fan = {tree.out_degree(p) for p in levels[depth - 1]}
    if len(fan) != 1:
        raise TopologyError(f"{what}: nodes at depth {depth - 1} have {sorted(fan)} children; the tree is not symmetric")
    return fan.pop()


def group(tree: nx.DiGraph, n: int, t: int, depth: int, levels: list[list[str]] | None = None) -> nx.DiGraph:
    """Insert L(depth)/n new nodes, each grouping n siblings at `depth` taken with stride t.

    Siblings are ordered by cpu id; in each run of n*t siblings, group j holds positions
    j, j+t, ..., j+(n-1)t. The grouped nodes move one level down.
    """
    levels = levels or depth_levels(tree)
    what = f"group(n={n}, t={t}, depth={depth})"
    m = _uniform_fanout(tree, levels, depth, what)
    if n < 2 or n >= m or t < 1 or m % (n * t):
        raise TopologyError(f"{what}: needs 2 <= n < {m} and n*t dividing {m}, the fanout at depth {depth - 1}")
    parents = set(levels[depth - 1])
    tag = len(tree)  # grows with every group, so new node ids never clash with earlier groups
    new = nx.DiGraph(**tree.graph)
    stack = [root(tree)]
    new.add_node(stack[0], **_attrs(tree, stack[0]))
    while stack:
        node = stack.pop()
        kids = list(tree.successors(node))
        if node in parents:
            for b in range(0, m, n * t):
                for j in range(t):
                    g = f"{node}/g{tag}.{len(new.adj[node])}"
                    new.add_node(g, kind="group", n=n, t=t)
                    new.add_edge(node, g)
                    for i in range(n):
                        c = kids[b + j + i * t]
                        new.add_node(c, **_attrs(tree, c))
                        new.add_edge(g, c)
        else:
            for c in kids:
                new.add_node(c, **_attrs(tree, c))
                new.add_edge(node, c)
        stack.extend(kids)
    return finalize(new)


def remove(tree: nx.DiGraph, n: int, depth: int, levels: list[list[str]] | None = None) -> nx.DiGraph:
    """Drop the n right-most children (with their sub-trees) of every node at depth-1."""
    levels = levels or depth_levels(tree)
    m = _uniform_fanout(tree, levels, depth, f"remove(n={n}, depth={depth})")
    if not 1 <= n < m:
        raise TopologyError(f"remove(n={n}, depth={depth}): needs 1 <= n < {m}, the fanout at depth {depth - 1}")
    drop: set[str] = set()
    for p in levels[depth - 1]:
        for c in list(tree.successors(p))[m - n :]:
            drop.add(c)
            drop.update(nx.descendants(tree, c))
    new = nx.DiGraph(**tree.graph)
    new.add_nodes_from((v, dict(d)) for v, d in tree.nodes(data=True) if v not in drop)
    new.add_edges_from((u, v) for u, v in tree.edges if v not in drop)
    # Only nodes above `depth` change, so reuse every other Merkle hash.
    for v, h in _new_hashes(tree, n, depth, levels).items():
        new.nodes[v]["h"] = h
    new.graph["hash"] = new.nodes[levels[0][0]]["h"].hex()
    return new


def remove_hash(tree: nx.DiGraph, n: int, depth: int, levels: list[list[str]]) -> str:
    """The Merkle hash remove(tree, n, depth) would have, without building that tree."""
    return _new_hashes(tree, n, depth, levels)[levels[0][0]].hex()


def _new_hashes(tree: nx.DiGraph, n: int, depth: int, levels: list[list[str]]) -> dict[str, bytes]:
    h: dict[str, bytes] = {}
    for p in levels[depth - 1]:
        kids = list(tree.successors(p))
        h[p] = node_hash(tree.nodes[p], (tree.nodes[c]["h"] for c in kids[: len(kids) - n]))
    for d in range(depth - 2, -1, -1):
        for node in levels[d]:
            h[node] = node_hash(tree.nodes[node], (h[c] for c in tree.successors(node)))
    return h


def group_candidates(tree: nx.DiGraph, levels: list[list[str]]) -> Iterator[tuple[int, int, int]]:
    """Every valid (n, t, depth) for group on a symmetric tree."""
    for depth in range(1, len(levels)):
        m = tree.out_degree(levels[depth - 1][0])
        for n in range(2, m):
            if m % n == 0:
                for t in range(1, m // n + 1):
                    if (m // n) % t == 0:
                        yield n, t, depth


def remove_candidates(tree: nx.DiGraph, levels: list[list[str]]) -> Iterator[tuple[int, int]]:
    """Every valid (n, depth) for remove on a symmetric tree."""
    for depth in range(1, len(levels)):
        m = tree.out_degree(levels[depth - 1][0])
        for n in range(1, m):
            yield n, depth


def _attrs(tree: nx.DiGraph, node: str) -> dict:
    return {k: v for k, v in tree.nodes[node].items() if k != "h"}
