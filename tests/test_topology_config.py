"""Issue 4: sandwich-config cross-sections and heuristics, the simulator, calibration, the CLI."""

from __future__ import annotations

import argparse
import json

import pytest

from sandwich.cli.topo import register
from sandwich.models import load_model_config
from sandwich.topology import fixtures as F
from sandwich.topology.calibrate import calibrate
from sandwich.topology.pipeline import search_service_configs
from sandwich.topology.sandwich_config import SPANS_NUMA, EarlyStopper, cross_sections, tp_allowed
from sandwich.topology.simulator import HardwareMap, SimParams, simulate
from sandwich.topology.trace import Trace, load_trace, synthetic_trace
from sandwich.topology.transforms import remove
from sandwich.topology.tree import build_tree
from sandwich.types import ProcessPlan, ServiceConfig

MODEL = load_model_config("llama-3-8b")  # 32 heads, 8 KV heads: TP in {1, 2, 4, 8}
TRACE = Trace(((128, 16), (512, 32)), "test")


@pytest.fixture(scope="module")
def kunpeng():
    return build_tree(F.raw_from_spec(F.KUNPENG_4S))


def test_cross_sections_of_kunpeng(kunpeng):
    configs = list(cross_sections(kunpeng, "decode"))
    assert [c.tp for c in configs] == [1, 4, 8, 8, 48, 192, 192, 192]
    numa = configs[2]
    assert [p.numa_node for p in numa.processes] == list(range(8))
    assert numa.processes[1].cpus == tuple(range(24, 48)) and numa.threads_per_process == 24
    assert configs[0].processes[0].numa_node == SPANS_NUMA
    assert configs[1].processes[0].numa_node == SPANS_NUMA  # a package holds two NUMA nodes
    assert configs[2] == configs[3]  # L3 == NUMA here: equal configs hash equal
    assert ServiceConfig.from_json(numa.to_json()) == numa


def test_operator_limits():
    assert [tp for tp in (1, 2, 3, 4, 6, 8, 16) if tp_allowed(MODEL, tp)] == [1, 2, 4, 8]
    small = load_model_config("llama-160m")  # 12 heads
    assert [tp for tp in (1, 2, 3, 4, 6, 8, 12) if tp_allowed(small, tp)] == [1, 2, 3, 4, 6, 12]


def test_early_stopper_closes_a_group_after_patience():
    s = EarlyStopper(patience=2)
    for v in (5.0, 4.0, 4.5, 4.2):
        assert not s.closed(("g",))
        s.record(("g",), v)
    assert s.closed(("g",)) and not s.closed(("other",))
    assert not EarlyStopper(patience=0).closed(("g",))


def test_simulator_decode_is_memory_bound_and_contended(kunpeng):
    hw = HardwareMap.from_tree(kunpeng)
    p = SimParams()
    full = next(c for c in cross_sections(kunpeng, "decode") if c.tp == 8)
    fewer = next(c for c in cross_sections(remove(kunpeng, 3, 4), "decode") if c.tp == 8)  # 3 of 6 clusters
    assert fewer.threads_per_process == 12
    a = simulate(full, hw=hw, model=MODEL, trace=TRACE, params=p)
    b = simulate(fewer, hw=hw, model=MODEL, trace=TRACE, params=p)
    assert b.ttft_s > a.ttft_s * 1.5  # prefill is compute bound: half the cores, much slower
    assert b.tpot_s < a.tpot_s * 1.1  # decode saturates the NUMA node: half the cores cost little
    # with no contention and ample bandwidth, every core helps decode too
    free = SimParams(numa_bw_gbs=1e4, l3_bw_gbs=1e4, cluster_bw_gbs=1e4, gamma_numa=0, gamma_l3=0, gamma_cluster=0)
    assert simulate(fewer, hw=hw, model=MODEL, trace=TRACE, params=free).tpot_s > \
        simulate(full, hw=hw, model=MODEL, trace=TRACE, params=free).tpot_s * 1.5


def test_cross_numa_process_pays_remote_bandwidth(kunpeng):
    hw = HardwareMap.from_tree(kunpeng)
    local = ServiceConfig("decode", (ProcessPlan(tuple(range(0, 8)), 0),), 8)
    split = ServiceConfig("decode", (ProcessPlan(tuple(range(0, 4)) + tuple(range(24, 28)), SPANS_NUMA),), 8)
    r1 = simulate(local, hw=hw, model=MODEL, trace=TRACE, params=SimParams())
    r2 = simulate(split, hw=hw, model=MODEL, trace=TRACE, params=SimParams())
    assert r2.tpot_s != r1.tpot_s


def test_pipeline_on_desktop_returns_topk_sorted():
    tree = build_tree(F.raw_from_spec(F.DESKTOP_8C))
    res = search_service_configs(tree=tree, model=MODEL, trace=TRACE, params=SimParams(), top_k=5)
    assert 1 <= len(res.prefill) <= 5 and len(res.decode) == 5
    assert all(c.config.phase == "prefill" and len(sum((p.cpus for p in c.config.processes), ())) == 16
               for c in res.prefill)  # prefill keeps every PU
    tpots = [r.result.tpot_s for r in res.decode]
    assert tpots == sorted(tpots)
    assert res.stats.configs_tp_rejected > 0 and res.stats.remove_explored > 1
    assert len({r.config for r in res.decode}) == len(res.decode)


def test_trace_loading(tmp_path):
    assert len(synthetic_trace(4).requests) == 4 and load_trace("synthetic").requests == synthetic_trace().requests
    (tmp_path / "t.csv").write_text("prompt,output\n10,2\n20,4\n")
    assert load_trace(str(tmp_path / "t.csv")).requests == ((10, 2), (20, 4))
    (tmp_path / "t.json").write_text(json.dumps([{"prompt": 5, "output": 1}, [7, 3]]))
    assert load_trace(str(tmp_path / "t.json")).requests == ((5, 1), (7, 3))


def test_calibration_tiny():
    cal = calibrate(duration_s=0.02, gemm_size=32, stream_floats=1 << 12)
    assert cal.gflops_1 > 0 and cal.gbs_1 > 0 and cal.gflops_2 > 0
    p = cal.apply(SimParams())
    assert p.core_gflops == round(cal.gflops_1, 2) and p.calibrated.startswith("cpus ")
    assert p.gamma_l3 >= 0


def _cli(*argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["topo", *argv])
    return args.func(args)


def test_cli_show_json_and_search_report(tmp_path, capsys):
    root = F.write_sysfs(F.DESKTOP_8C, tmp_path / "root")
    assert _cli("show", "--sysfs-root", str(root), "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {"pus": 16, "cores": 8, "levels": [
        {"kind": "package", "count": 1}, {"kind": "numa", "count": 1}, {"kind": "l3", "count": 1},
        {"kind": "l2", "count": 8}, {"kind": "core", "count": 8}, {"kind": "pu", "count": 16}]}
    out = tmp_path / "results"
    assert _cli("search", "--sysfs-root", str(root), "--model", "llama-3-8b", "--top-k", "3", "--out-dir", str(out)) == 0
    printed = capsys.readouterr().out
    assert "prefill top-" in printed and "decode top-3" in printed
    md = (out / "topology_desktop_8_core_16pu.md").read_text()
    assert md.startswith("# TopoTree search") and "Command: `sandwichc topo search --sysfs-root" in md
    assert (out / "topology_desktop_8_core_16pu.png").stat().st_size > 1000
    saved = json.loads((out / "topology_desktop_8_core_16pu.json").read_text())
    assert len(saved["decode"]) == 3 and ServiceConfig.from_dict(saved["decode"][0]).phase == "decode"


def test_core_cpus_take_one_pu_per_core_in_tree_order():
    """Issue 28: Splitwise's pools take the first P and last D of this order."""
    from sandwich.topology.fixtures import MACHINES, raw_from_spec
    from sandwich.topology.pools import core_cpus
    from sandwich.topology.tree import build_tree, leaf_cpus

    tree = build_tree(raw_from_spec(MACHINES["xeon-2s"]))  # 2 threads per core
    order = core_cpus(tree)
    assert len(order) == len(set(order)) == len([n for n, d in tree.nodes(data=True)
                                                 if d["kind"] == "core"])
    assert order == sorted(order, key=leaf_cpus(tree, tree.graph["root"]).index)
    assert core_cpus(tree, allowed=order[3:5]) == order[3:5]
    assert len(order) * 2 == len(leaf_cpus(tree, tree.graph["root"]))  # SMT siblings left out
