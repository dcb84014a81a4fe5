"""Issue 27: each tolerance of parse_sysfs (a named rule in RULES) on a small hand-edited
snapshot; hwloc's own snapshots exercise them again in test_topology_hwloc.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sandwich.errors import TopologyError
from sandwich.topology import fixtures as F
from sandwich.topology.parse_sysfs import RULES, parse_sysfs
from sandwich.topology.tree import build_tree, summary

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"


def counts(raw) -> dict[str, int]:
    """Blocks per level that are real objects (filled ones left out), as the hwloc test counts."""
    return {k: len(v) - len(raw.filled.get(k, ())) for k, v in raw.partitions.items()}


@pytest.fixture()
def desktop(tmp_path):
    """1 package, 8 cores of 2 threads (cpu c and c+8), one NUMA node, one L3."""
    return F.write_sysfs(F.DESKTOP_8C, tmp_path / "d")


@pytest.fixture()
def xeon(tmp_path):
    """2 packages of 24 two-thread cores, one NUMA node each."""
    return F.write_sysfs(F.XEON_2S, tmp_path / "x")


def test_every_rule_has_a_test():
    text = "".join(p.read_text() for p in Path(__file__).parent.glob("test_topology_*.py"))
    untested = [name for name in RULES
                if not re.search(rf"[Rr]ule[ _]{name.replace('-', '[-_]')}\b", text)]
    assert not untested


def test_rule_mask_over_list(desktop):
    """Rule mask-over-list (hwloc's 64amd64-4s2n4ca2co: shared_cpu_list "0" beside
    shared_cpu_map 0x3): the mask is read, as hwloc does."""
    for c in range(16):
        d = desktop / CPU / f"cpu{c}/cache/index3"
        (d / "shared_cpu_list").write_text(f"{c}\n")  # wrong, as the old kernel wrote it
        (d / "shared_cpu_map").write_text("0000ffff\n")
    assert counts(parse_sysfs(desktop))["l3"] == 1


def _cpuset(root: Path, cpus: str, mems: str) -> None:
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/self/cpuset").write_text("/jail\n")
    (root / "proc/mounts").write_text("none /dev/cpuset cpuset rw 0 0\n")
    (root / "dev/cpuset/jail").mkdir(parents=True, exist_ok=True)
    (root / "dev/cpuset/jail/cpus").write_text(cpus + "\n")
    (root / "dev/cpuset/jail/mems").write_text(mems + "\n")


def test_rule_cgroup_cpuset_mems(tmp_path):
    """Rule cgroup-cpuset-mems (hwloc's 16amd64-8n2c-cpusets): a node outside `mems` is no
    NUMA node; its allowed cpus keep a filled block so the tree still covers them."""
    spec = F.MachineSpec("4 nodes", 4, 1, 1, 1, 2)  # cpus 2n, 2n+1 in node n
    root = F.write_sysfs(spec, tmp_path / "r")
    _cpuset(root, "0-5", "1-3")
    raw = parse_sysfs(root)
    assert raw.cpus == (0, 1, 2, 3, 4, 5)
    assert raw.filled["numa"] == (frozenset({0, 1}),)  # node 0: cpus allowed, memory not
    assert raw.memory_only_numa == (3,)  # node 3: memory allowed, cpus not
    assert counts(raw)["numa"] + len(raw.memory_only_numa) == 3
    assert summary(build_tree(raw))["pus"] == 6


def test_rule_memory_only_package(tmp_path):
    """Rule memory-only-package (hwloc's 16amd64-8n2c-cpusets keeps package P#4 for node 4):
    a package whose cpus are all outside the cpuset but whose node's memory is allowed is
    counted as a package with memory and no PU; the tree holds only the usable PUs."""
    spec = F.MachineSpec("4 nodes", 4, 1, 1, 1, 2)  # package n = node n = cpus 2n, 2n+1
    root = F.write_sysfs(spec, tmp_path / "r")
    _cpuset(root, "0-3,6", "0,1,3")  # node 2: neither; node 3: memory, and cpu 6 allowed
    assert parse_sysfs(root).memory_only_packages == ()  # package 3 still has a usable cpu
    _cpuset(root, "0-3", "0,1,3")
    raw = parse_sysfs(root)
    assert raw.memory_only_numa == (3,)
    assert raw.memory_only_packages == (frozenset({6, 7}),)
    assert counts(raw)["package"] + len(raw.memory_only_packages) == 3  # as hwloc counts
    assert summary(build_tree(raw))["pus"] == 4
    (root / CPU / "cpu6/topology").rename(root / CPU / "cpu6/gone")  # offline cpus lose it
    assert parse_sysfs(root).memory_only_packages == (frozenset({7}),)


def test_rule_amd_compute_unit(desktop):
    """Rule amd-compute-unit (hwloc's 64amd64-4s2n4ca2co, an Opteron 6276): the two cores of a
    module are thread siblings with their own core_id: two cores sharing the module's L2."""
    info = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 21\nmodel name\t: Opteron 6276\n"
    (desktop / "proc/cpuinfo").write_text(info)
    for c in range(16):
        (desktop / CPU / f"cpu{c}/topology/core_id").write_text(f"{c}\n")
    raw = parse_sysfs(desktop)
    assert counts(raw)["core"] == 16 and counts(raw)["l2"] == 8
    for c in range(16):  # same core_id within a pair: hyper-threads after all
        (desktop / CPU / f"cpu{c}/topology/core_id").write_text(f"{c % 8}\n")
    assert counts(parse_sysfs(desktop))["core"] == 8
    (desktop / "proc/cpuinfo").write_text(info.replace("21", "23"))  # Zen: real SMT
    for c in range(16):
        (desktop / CPU / f"cpu{c}/topology/core_id").write_text(f"{c}\n")
    assert counts(parse_sysfs(desktop))["core"] == 8


def test_rule_missing_cache(desktop):
    """Rule missing-cache (hwloc's 8em64t-2s4c-asymcaches): cpus without an L2 entry get a
    private filled L2; the tree is then asymmetric, which check_symmetric reports."""
    for c in (0, 8):
        for index in (desktop / CPU / f"cpu{c}/cache").glob("index2"):
            for f in index.iterdir():
                f.unlink()
            index.rmdir()
    raw = parse_sysfs(desktop)
    assert raw.filled["l2"] == (frozenset({0}), frozenset({8}))
    assert counts(raw)["l2"] == 7 and counts(raw)["l3"] == 1
    assert len(raw.partitions["l2"]) == 9


def test_rule_redundant_cluster(desktop):
    """Rule redundant-cluster (hwloc's 20em64t-hybrid: cluster_cpus is the core on P-cores and
    the L2 on E-cores): a cluster level that repeats other levels block by block is dropped."""
    for c in range(4, 8):  # make cores 4-7 (cpus 4-7, 12-15) E-cores sharing one L2
        (desktop / CPU / f"cpu{c}/topology/core_cpus_list").write_text(f"{c}\n")
        (desktop / CPU / f"cpu{c}/topology/thread_siblings_list").write_text(f"{c}\n")
        (desktop / CPU / f"cpu{c}/topology/cluster_cpus_list").write_text("4-7\n")
        (desktop / CPU / f"cpu{c}/cache/index2/shared_cpu_list").write_text("4-7\n")
    (desktop / CPU / "online").write_text("0-11\n")  # cpus 12-15, the E-cores' old siblings, gone
    raw = parse_sysfs(desktop)
    assert "cluster" not in raw.partitions
    (desktop / CPU / "cpu4/cache/index2/shared_cpu_list").write_text("4\n")
    for c in (5, 6, 7):
        (desktop / CPU / f"cpu{c}/cache/index2/shared_cpu_list").write_text(f"{c}\n")
    assert len(parse_sysfs(desktop).partitions["cluster"]) == 5  # now the 4-7 cluster is new


def test_rule_cpu_without_node(xeon):
    """Rule cpu-without-node (hwloc's offline-cpu0-node0): node 0 is offline and gone from
    sysfs; its package's cpus form one filled NUMA block."""
    for f in (xeon / NODE / "node0").iterdir():
        f.unlink()
    (xeon / NODE / "node0").rmdir()
    (xeon / NODE / "online").write_text("1\n")
    raw = parse_sysfs(xeon)
    assert raw.filled["numa"] == (frozenset(range(24)) | frozenset(range(48, 72)),)
    assert counts(raw)["numa"] == 1 and counts(raw)["package"] == 2


def test_rule_numa_without_memory(xeon):
    """Rule numa-without-memory (hwloc's fakememinitiators): nodes with cpus but no memory
    are filled blocks; a node with neither cpus nor memory is dropped; memory-only ones count."""
    for n in (2, 3):
        (xeon / NODE / f"node{n}").mkdir()
        (xeon / NODE / f"node{n}/cpulist").write_text("\n")
    (xeon / NODE / "has_memory").write_text("1-2\n")
    raw = parse_sysfs(xeon)
    assert raw.filled["numa"] == (frozenset(range(24)) | frozenset(range(48, 72)),)
    assert raw.memory_only_numa == (2,)
    assert counts(raw)["numa"] + len(raw.memory_only_numa) == 2


def test_rule_nvidia_gpu_memory(xeon):
    """Rule nvidia-gpu-memory (hwloc's nvidiagpunumanodes, a POWER9 with 6 GPUs): the
    GPUs' memory nodes are not memory-only NUMA nodes of the CPU tree."""
    for n in (2, 3):
        (xeon / NODE / f"node{n}").mkdir()
        (xeon / NODE / f"node{n}/cpulist").write_text("\n")
    assert parse_sysfs(xeon).memory_only_numa == (2, 3)
    gpu = xeon / "proc/driver/nvidia/gpus/0004:05:00.0"
    gpu.mkdir(parents=True)
    (gpu / "numa_status").write_text("Node:                          3\nStatus:   online\n")
    assert parse_sysfs(xeon).memory_only_numa == (2,)


def test_rule_package_by_siblings(desktop):
    """Rule package-by-siblings (hwloc's 16ia64-8n2s: ids repeat across nodes; 256ppc: -1):
    the package is the sibling mask; physical_package_id only without one."""
    for c in range(16):
        t = desktop / CPU / f"cpu{c}/topology"
        (t / "physical_package_id").write_text("-1\n")
        (t / "package_cpus_list").unlink()
        (t / "core_siblings").write_text("00000f0f\n" if c % 8 < 4 else "0000f0f0\n")
    assert counts(parse_sysfs(desktop))["package"] == 2
    for c in range(16):
        (desktop / CPU / f"cpu{c}/topology/core_siblings").unlink()
    assert counts(parse_sysfs(desktop))["package"] == 1  # from the ids, as before


def test_rule_missing_package_and_missing_core(desktop):
    """Rule missing-package (hwloc's 2ps3-2t) and rule missing-core (hwloc's 4fake-4gr1nu1pu):
    a level the kernel says nothing of is one filled block (package) or one per cpu (core)."""
    for c in range(16):
        t = desktop / CPU / f"cpu{c}/topology"
        (t / "physical_package_id").unlink()
        (t / "package_cpus_list").unlink()
    raw = parse_sysfs(desktop)
    assert len(raw.partitions["package"]) == 1 and counts(raw)["package"] == 0
    assert counts(raw)["core"] == 8
    for c in range(16):
        t = desktop / CPU / f"cpu{c}/topology"
        (t / "package_cpus_list").write_text("0-15\n")
        (t / "core_cpus_list").unlink()
        (t / "thread_siblings_list").unlink()
    raw = parse_sysfs(desktop)
    assert counts(raw)["package"] == 1 and counts(raw)["core"] == 0
    assert len(raw.partitions["core"]) == 16
    (desktop / CPU / "cpu3/topology/core_cpus_list").write_text("3,11\n")  # one cpu says: no rule
    with pytest.raises(TopologyError, match="cpu0/topology/thread_siblings_list"):
        parse_sysfs(desktop)


def test_rule_empty_shared_map(desktop):
    """Rule empty-shared-map (hwloc's 8ia64-2s2c2t): an all-zero shared mask is the core's."""
    for c in range(16):
        d = desktop / CPU / f"cpu{c}/cache/index3"
        (d / "shared_cpu_list").unlink()
        (d / "shared_cpu_map").write_text("00000000\n")
    assert counts(parse_sysfs(desktop))["l3"] == 8
