"""Search the TopoTree space: group variants, then a remove transformation tree from each."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from sandwich.topology.transforms import (
    group,
    group_candidates,
    remove,
    remove_candidates,
    remove_hash,
)
from sandwich.topology.tree import depth_levels, tree_hash


@dataclass(frozen=True)
class Explored:
    """One tree met by the search, with the transforms that led to it from the fundamental tree."""

    tree: nx.DiGraph
    ops: tuple[str, ...]
    score: float = float("nan")


@dataclass(frozen=True)
class RemoveStats:
    """Counts of one remove search: `generated` remove applications, `explored` distinct trees."""

    generated: int
    explored: int
    duplicates: int
    pruned: int


def group_variants(tree: nx.DiGraph, *, max_new_levels: int = 1) -> list[Explored]:
    """The fundamental tree plus every distinct tree reachable by up to `max_new_levels` groups.

    Group transforms commute, so a breadth-first walk with hash dedup visits each variant once.
    """
    found = [Explored(tree, ())]
    seen = {tree_hash(tree)}
    frontier = list(found)
    for _ in range(max_new_levels):
        nxt = []
        for item in frontier:
            levels = depth_levels(item.tree)
            for n, t, d in group_candidates(item.tree, levels):
                child = group(item.tree, n, t, d, levels)
                if tree_hash(child) not in seen:
                    seen.add(tree_hash(child))
                    nxt.append(Explored(child, (*item.ops, f"group(n={n},t={t},d={d})")))
        found.extend(nxt)
        frontier = nxt
    return found


def remove_search(
    start: Explored,
    *,
    score: Callable[[Explored], float] | None = None,
    seen: set[str] | None = None,
) -> tuple[list[Explored], RemoveStats]:
    """Breadth-first (topological) walk of the remove transformation tree from `start`.

    A tree is new only if its Merkle hash is unseen (`seen` may be shared across group variants).
    With a `score` (lower is better), a tree no better than the parent it came from is kept but
    not expanded. Returns the trees produced by remove, then the counts.
    """
    seen = seen if seen is not None else set()
    seen.add(tree_hash(start.tree))
    start_score = score(start) if score else float("nan")
    queue = deque([(start.tree, start.ops, start_score)])
    out: list[Explored] = []
    generated = duplicates = pruned = 0
    while queue:
        tree, ops, parent_score = queue.popleft()
        levels = depth_levels(tree)
        for n, d in remove_candidates(tree, levels):
            generated += 1
            h = remove_hash(tree, n, d, levels)
            if h in seen:
                duplicates += 1
                continue
            seen.add(h)
            child = remove(tree, n, d, levels)
            child_ops = (*ops, f"remove(n={n},d={d})")
            item = Explored(child, child_ops)
            s = score(item) if score else float("nan")
            out.append(Explored(child, child_ops, s))
            if score is not None and not s < parent_score:
                pruned += 1
                continue
            queue.append((child, child_ops, s))
    stats = RemoveStats(generated=generated, explored=len(out) + 1, duplicates=duplicates, pruned=pruned)
    return out, stats
