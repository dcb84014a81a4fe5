"""Latent groups in the simulator: a `group` node is a shared resource, so removing one core per
hidden 4-core cluster (the paper's SC-RM, Fig. 3a) can win decode on a machine whose OS hides the
clusters (issue: the contention model read only the fundamental tree)."""

from __future__ import annotations

import dataclasses

import pytest

from sandwich.bench.plan_fixtures import FIXTURES, fixture_plans_markdown
from sandwich.models import load_model_config
from sandwich.topology import fixtures as F
from sandwich.topology.calibrate import Calibration
from sandwich.topology.load import load_tree
from sandwich.topology.pipeline import search_service_configs
from sandwich.topology.sandwich_config import cross_sections
from sandwich.topology.simulator import SimParams, hardware_map, simulate
from sandwich.topology.trace import Trace
from sandwich.topology.transforms import group, remove
from sandwich.topology.tree import build_tree, level_kinds, summary

MODEL = load_model_config("llama-3-8b")  # TP in {1, 2, 4, 8}
TRACE = Trace(((128, 16), (512, 32)), "test")
# 2.5 GB/s per core, 100 GB/s per NUMA node: 32 cores never fill a node, only the clusters matter
BASE = SimParams(core_bw_gbs=2.5, numa_bw_gbs=100.0)
SC_RM = ("group(n=4,t=1,d=4)", "remove(n=1,d=5)")


def calibration(gbs_2: float) -> Calibration:
    """Two workers on cpus 0 and 1 (one hidden cluster) streaming 2.5 GB/s alone, gbs_2 each together."""
    return Calibration(cpus=(0, 1), gflops_1=40.0, gflops_2=40.0, gbs_1=2.5, gbs_2=gbs_2, gemm_size=256,
                       stream_floats=1 << 24, duration_s=0.3, date="test")


# the cluster's port carries three cores' streaming; calibrated loss 2.5 -> 2.0 GB/s is gamma 0.25
STRONG = calibration(2.0).apply(dataclasses.replace(BASE, group_bw_gbs=7.5), latent_cores=4)
NONE = calibration(2.5).apply(BASE, latent_cores=4)


@pytest.fixture(scope="module")
def fund():
    return build_tree(F.raw_from_spec(F.KUNPENG_2X64))


def search(tree, params, levels=1):
    return search_service_configs(tree=tree, model=MODEL, trace=TRACE, params=params, top_k=500, max_new_levels=levels)


def tp4(tree):
    return next(c for c in cross_sections(tree, "decode") if c.tp == 4)


def tpot(config, tree, params):
    return simulate(config, hw=hardware_map(tree), model=MODEL, trace=TRACE, params=params).tpot_s


def test_128_core_fixture_hides_its_clusters(tmp_path):
    root = F.write_sysfs(F.KUNPENG_2X64, tmp_path / "root")
    F.write_hwloc_xml(F.KUNPENG_2X64, tmp_path / "lstopo.xml")
    F.write_lscpu(F.KUNPENG_2X64, tmp_path / "lscpu.txt")
    want = [("package", 2), ("numa", 4), ("l3", 4), ("l2", 128), ("core", 128), ("pu", 128)]
    for tree in (load_tree(sysfs_root=root), load_tree(hwloc_xml=tmp_path / "lstopo.xml"),
                 load_tree(lscpu=tmp_path / "lscpu.txt")):
        assert [(lv["kind"], lv["count"]) for lv in summary(tree)["levels"]] == want
    assert "kunpeng-2x64" in F.MACHINES and "cluster" not in level_kinds(build_tree(F.raw_from_spec(F.KUNPENG_2X64)))


def test_calibration_sets_the_innermost_shared_domain(fund):
    cal = calibration(2.0)  # gamma 0.25
    assert (STRONG.gamma_group, STRONG.group_cores, STRONG.gamma_l3) == (0.25, 4, BASE.gamma_l3)
    assert (NONE.gamma_group, NONE.group_cores, NONE.latent) == (0.0, 4, False)
    on_l3 = cal.apply(BASE, tree=fund)  # cpus 0 and 1 share only the (visible) L3: as before
    assert (on_l3.gamma_l3, on_l3.gamma_numa, on_l3.gamma_group) == (0.25, 0.25, 0.0)
    assert cal.apply(BASE) == on_l3
    on_group = cal.apply(BASE, tree=group(fund, 4, 1, 4))
    assert (on_group.gamma_group, on_group.group_cores, on_group.gamma_l3) == (0.25, 4, BASE.gamma_l3)
    on_cluster = cal.apply(BASE, tree=build_tree(F.raw_from_spec(F.KUNPENG_4S)))
    assert (on_cluster.gamma_cluster, on_cluster.gamma_l3, on_cluster.gamma_group) == (0.25, BASE.gamma_l3, 0.0)
    assert SimParams.from_json(STRONG.to_json()) == STRONG


def test_strong_group_contention_removes_one_core_per_hidden_cluster(fund):
    res = search(fund, STRONG)
    best = res.decode[0]
    assert best.ops == SC_RM and best.config.tp == 4
    for i, proc in enumerate(best.config.processes):  # 3 of every 4 consecutive cores of each NUMA node
        assert proc.cpus == tuple(c for c in range(32 * i, 32 * (i + 1)) if c % 4 != 3)
        assert proc.numa_node == i
    assert res.stats.latent_groups == 32
    assert len(res.prefill[0].config.processes[0].cpus) * res.prefill[0].config.tp == 128  # prefill keeps all


def test_no_group_contention_keeps_every_core(fund):
    res = search(fund, NONE)
    best = res.decode[0]
    assert not any(op.startswith("remove") for op in best.ops)
    assert sum(len(p.cpus) for p in best.config.processes) == 128
    assert res.stats.latent_groups == 0


@pytest.mark.parametrize("gamma, cap", [(0.0, 0.0), (0.25, 0.0), (0.25, 7.5)])
def test_remove_inside_a_group_is_charged_only_with_group_contention(fund, gamma, cap):
    params = dataclasses.replace(BASE, gamma_group=gamma, group_bw_gbs=cap)
    grouped = group(fund, 4, 1, 4)
    removed = remove(grouped, 1, 5)  # each 4-core group keeps its first 3 cores
    full, sc_rm = tp4(grouped), tp4(removed)
    assert sc_rm.threads_per_process == 24
    flat = tpot(sc_rm, fund, params) - tpot(full, fund, params)  # the remove seen without groups
    latent = tpot(sc_rm, removed, params) - tpot(full, grouped, params)  # each on its own tree
    assert flat > 0  # on the un-grouped tree fewer cores only lose bandwidth
    if gamma == 0:
        assert latent == pytest.approx(flat, rel=1e-12)
    else:
        assert latent < flat
    if cap:  # the port saturates at three cores: the fourth adds only contention
        assert latent < 0


def test_group_itself_changes_a_score(fund):
    full = tp4(fund)
    grouped = group(fund, 4, 1, 4)
    assert tpot(full, grouped, BASE) == tpot(full, fund, BASE)  # defaults: a group costs nothing
    assert tpot(full, grouped, STRONG) > tpot(full, fund, STRONG) * 1.2
    # in the search: without a group level the full config is simulated uncontended and wins
    flat, latent = search(fund, STRONG, levels=0), search(fund, STRONG, levels=1)
    assert flat.decode[0].config == full and latent.decode[0].ops == SC_RM

    def full_tpot(res):
        return next(r.result.tpot_s for r in res.decode if r.config == full)

    assert full_tpot(latent) > full_tpot(flat) * 1.2


def test_fixture_plans_markdown_has_a_row_per_fixture_and_calibration():
    md = fixture_plans_markdown()
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| fixture")]
    assert [tuple(c.strip() for c in r.split("|")[1:3]) for r in rows] == [
        (f, cal) for f in FIXTURES for cal in ("strong", "none")]
    sc_rm = next(r for r in rows if r.startswith("| kunpeng-2x64 | strong"))
    assert "TP=4, 24 threads/proc, 96/128 cores" in sc_rm and "remove(n=1,d=5)" in sc_rm
    assert "removing one core from every 4 cores" in sc_rm and "a TP size of 8" in md
