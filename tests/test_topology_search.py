"""Issue 4: group/remove on hand-made trees, explored-tree counts, Proposition 2, latent clusters."""

from __future__ import annotations

import dataclasses

import pytest

from sandwich.errors import TopologyError
from sandwich.topology import fixtures as F
from sandwich.topology.search import Explored, group_variants, remove_search
from sandwich.topology.transforms import group, remove, remove_hash
from sandwich.topology.tree import (
    build_tree,
    depth_levels,
    fanouts,
    leaf_cpus,
    level_kinds,
    tree_hash,
)


def tree_of(packages=1, clusters=1, cores=8, smt=1, cluster="core"):
    spec = F.MachineSpec("t", packages, 1, 1, clusters, cores, smt=smt, cluster=cluster)
    return build_tree(F.raw_from_spec(spec))


def groups_at(tree, depth):
    return [leaf_cpus(tree, n) for n in depth_levels(tree)[depth]]


def test_group_stride_one_and_two():
    t = tree_of(cores=8)  # machine > package > numa > l3 > 8 x (l2 > core > pu)
    assert fanouts(t) == [1, 1, 1, 8, 1, 1]
    g1 = group(t, 2, 1, 4)
    assert groups_at(g1, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert level_kinds(g1)[4] == "group" and fanouts(g1) == [1, 1, 1, 4, 2, 1, 1]
    g2 = group(t, 2, 2, 4)
    assert groups_at(g2, 4) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    g4 = group(t, 4, 2, 4)
    assert groups_at(g4, 4) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_remove_drops_rightmost_children_everywhere():
    t = tree_of(packages=2, cores=4, smt=2)  # cpus 0-3 | 4-7, siblings +8
    r = remove(t, 1, 4)  # each L3 keeps its 3 left-most cores
    assert leaf_cpus(r, "machine") == [0, 8, 1, 9, 2, 10, 4, 12, 5, 13, 6, 14]
    r2 = remove(t, 1, 6)  # drop SMT siblings
    assert sorted(leaf_cpus(r2, "machine")) == list(range(8))


def test_transforms_are_pure_and_hash_is_structural():
    t = tree_of(cores=8)
    before = (tree_hash(t), len(t), dict(t.nodes["machine"]))
    a = remove(t, 2, 4)
    assert (tree_hash(t), len(t), dict(t.nodes["machine"])) == before
    assert remove_hash(t, 2, 4, depth_levels(t)) == tree_hash(a)
    # two paths to the same tree give the same hash
    assert tree_hash(remove(remove(t, 1, 4), 1, 4)) == tree_hash(a)
    # group transforms commute
    t2 = tree_of(packages=4, cores=4)
    ab = group(group(t2, 2, 1, 1), 2, 1, 5)
    ba = group(group(t2, 2, 1, 4), 2, 1, 1)
    assert tree_hash(ab) == tree_hash(ba)


@pytest.mark.parametrize("call", [
    lambda t: group(t, 1, 1, 4), lambda t: group(t, 8, 1, 4), lambda t: group(t, 3, 1, 4),
    lambda t: group(t, 2, 3, 4), lambda t: remove(t, 8, 4), lambda t: remove(t, 0, 4), lambda t: remove(t, 1, 9),
])
def test_invalid_transform_arguments(call):
    with pytest.raises(TopologyError):
        call(tree_of(cores=8))


# Without pruning the remove search reaches every fanout vector f' <= f once, so it explores
# prod(f) trees and applies sum over those trees of sum_i (f'_i - 1) removes (hand counts below).
@pytest.mark.parametrize("shape, explored, generated", [
    (dict(cores=8), 8, 28),  # 1..8 cores: 0+1+...+7
    (dict(packages=2, cores=8), 16, 64),  # 8*(2-1) + 2*28
    (dict(cores=8, smt=2), 16, 64),  # 2*28 + 8*(2-1)
    (dict(packages=2, clusters=3, cores=4, cluster="cluster"), 24, 72),  # 12*1 + 8*(1+2) + 6*(1+2+3)
])
def test_remove_counts_equal_hand_counts(shape, explored, generated):
    _, stats = remove_search(Explored(tree_of(**shape), ()))
    assert (stats.explored, stats.generated) == (explored, generated)
    assert stats.duplicates == generated - (explored - 1)


def test_group_variant_counts_on_8_cores():
    t = tree_of(cores=8)
    # one level: (n, t) in (2,1) (2,2) (2,4) (4,1) (4,2) + the fundamental tree
    assert len(group_variants(t, max_new_levels=1)) == 6
    # two levels add 6 more: {0123|4567}/{01,23}, {0145|2367}, {0123|4567}/{02,13}, {0246|1357}/{02,46},
    # {0415|2637}, {0426|1537}; the other orders are duplicates, and a third level adds none
    assert len(group_variants(t, max_new_levels=2)) == 12
    assert len(group_variants(t, max_new_levels=3)) == 12


@pytest.mark.parametrize("n", [8, 16, 32, 64, 128, 256])
def test_remove_search_is_quadratic(n):
    """Proposition 2: O(n^2) trees generated, for flat, two-socket and binary trees of n cores."""
    shapes = [dict(cores=n), dict(packages=2, cores=n // 2), dict(packages=2, clusters=n // 8, cores=4, cluster="cluster")]
    generated = []
    for shape in shapes:
        _, stats = remove_search(Explored(tree_of(**shape), ()))
        assert stats.explored == n
        assert stats.generated <= n * n
        generated.append(stats.generated)
    assert generated[0] == n * (n - 1) // 2  # the flat tree is the worst case


def test_pruning_with_a_fake_score():
    t = tree_of(cores=8)
    # fewer cores always worse: only the root's 7 children are produced, none expanded
    out, stats = remove_search(Explored(t, ()), score=lambda e: -len(e.tree))
    assert (len(out), stats.pruned, stats.generated) == (7, 7, 7)
    # best at 5 cores (score |cores - 5|): the root (score 3) yields 7..1; those scoring < 3
    # (7, 6, 5, 4, 3 cores) are expanded, 2 and 1 are pruned; expanding k cores applies k-1 removes
    def score(e):
        return abs(len(leaf_cpus(e.tree, "machine")) - 5)
    out, stats = remove_search(Explored(t, ()), score=score)
    assert sorted(len(leaf_cpus(e.tree, "machine")) for e in out) == [1, 2, 3, 4, 5, 6, 7]
    assert (stats.generated, stats.pruned) == (7 + 6 + 5 + 4 + 3 + 2, 2)


def test_kunpeng_without_cluster_cpus_still_finds_4_core_groups():
    with_cl = build_tree(F.raw_from_spec(F.KUNPENG_4S))
    clusters = [leaf_cpus(with_cl, n) for n, k in with_cl.nodes(data="kind") if k == "cluster"]
    no_cl = build_tree(F.raw_from_spec(F.KUNPENG_NO_CLUSTER))
    assert "cluster" not in level_kinds(no_cl)
    found = []
    for v in group_variants(no_cl, max_new_levels=1):
        groups = [leaf_cpus(v.tree, n) for n, k in v.tree.nodes(data="kind") if k == "group"]
        if sorted(groups) == sorted(clusters):
            found.append(v.ops)
    assert found == [("group(n=4,t=1,d=4)",)]
    assert len(clusters) == 48 and clusters[0] == [0, 1, 2, 3]


def test_shared_seen_set_dedups_across_variants():
    t = tree_of(cores=8)
    seen: set[str] = set()
    _, a = remove_search(Explored(t, ()), seen=seen)
    _, b = remove_search(Explored(t, ()), seen=seen)
    assert a.explored == 8 and b.explored == 1 and b.duplicates == b.generated


def test_hash_differs_for_different_cpu_sets():
    t = tree_of(cores=8)
    assert tree_hash(group(t, 2, 1, 4)) != tree_hash(group(t, 2, 2, 4))
    assert tree_hash(t) == tree_hash(build_tree(F.raw_from_spec(dataclasses.replace(F.MachineSpec("x", 1, 1, 1, 1, 8)))))
