"""Issue 4: every input format parses the fixture machines to the right levels and counts."""

from __future__ import annotations

import dataclasses

import pytest

from sandwich.topology import fixtures as F
from sandwich.topology.load import load_tree
from sandwich.topology.parse_hwloc import parse_hwloc_xml
from sandwich.topology.parse_lscpu import parse_lscpu
from sandwich.topology.parse_sysfs import parse_sysfs
from sandwich.topology.tree import asymmetry, build_tree, fanouts, leaf_cpus, summary, tree_hash


def levels(tree):
    return [(lv["kind"], lv["count"]) for lv in summary(tree)["levels"]]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("topo")
    for name, spec in F.MACHINES.items():
        F.write_sysfs(spec, root / name)
        F.write_hwloc_xml(spec, root / f"{name}.xml")
        F.write_lscpu(spec, root / f"{name}.csv")
    return root


# Hand-written expectations (not derived from the writer) for the four machines of issue 4.
EXPECTED = {
    "xeon-2s": ([("package", 2), ("numa", 2), ("l3", 2), ("l2", 48), ("core", 48), ("pu", 96)], 48),
    "epyc-2x64": ([("package", 2), ("numa", 2), ("l3", 32), ("l2", 128), ("core", 128), ("pu", 256)], 128),
    "kunpeng-4s": (
        [("package", 4), ("numa", 8), ("l3", 8), ("cluster", 48), ("l2", 192), ("core", 192), ("pu", 192)], 192),
    "desktop-8c": ([("package", 1), ("numa", 1), ("l3", 1), ("l2", 8), ("core", 8), ("pu", 16)], 8),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sysfs_fixture_levels_and_counts(written, name):
    tree = build_tree(parse_sysfs(written / name))
    want, cores = EXPECTED[name]
    assert levels(tree) == want
    assert summary(tree)["cores"] == cores
    assert summary(tree)["pus"] == want[-1][1]
    assert asymmetry(tree) is None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hwloc_and_lscpu_agree_with_sysfs(written, name):
    sysfs = build_tree(parse_sysfs(written / name))
    hwloc = build_tree(parse_hwloc_xml(written / f"{name}.xml"))
    assert tree_hash(hwloc) == tree_hash(sysfs)
    lscpu = build_tree(parse_lscpu(written / f"{name}.csv"))
    # lscpu -p has no cluster column; everything else matches
    assert levels(lscpu) == [lv for lv in EXPECTED[name][0] if lv[0] != "cluster"]


def test_cache_sizes_and_numa_ids(written):
    tree = build_tree(parse_sysfs(written / "kunpeng-4s"))
    assert tree.nodes["l2_0"]["size"] == 512 << 10
    assert sorted(d["os_index"] for _, d in tree.nodes(data=True) if d["kind"] == "numa") == list(range(8))


def test_smt_siblings_are_one_core(written):
    tree = build_tree(parse_sysfs(written / "xeon-2s"))
    core0 = next(iter(tree.predecessors("pu0")))
    assert [tree.nodes[p]["cpu"] for p in tree.successors(core0)] == [0, 48]


def test_kernel_cluster_equal_to_core_is_not_a_level(tmp_path):
    # x86 kernels write cluster_cpus = core siblings; that says nothing new
    F.write_sysfs(F.DESKTOP_8C, tmp_path)
    assert (tmp_path / "sys/devices/system/cpu/cpu0/topology/cluster_cpus_list").exists()
    assert "cluster" not in dict(levels(build_tree(parse_sysfs(tmp_path))))


def test_sparse_ids_offline_cpus_and_cpuless_numa(tmp_path):
    # offline whole cores 4 and 5 (both threads): ids become sparse, tree stays readable
    spec = dataclasses.replace(F.DESKTOP_8C, offline=(4, 5, 12, 13), memory_only_numa=1)
    F.write_sysfs(spec, tmp_path)
    raw = parse_sysfs(tmp_path)
    assert raw.offline == (4, 5, 12, 13)
    assert raw.memory_only_numa == (1,)
    tree = build_tree(raw)
    assert summary(tree)["pus"] == 12 and summary(tree)["cores"] == 6
    assert fanouts(tree) == [1, 1, 1, 6, 1, 2]


def test_hwloc_offline_and_memory_only_numa(tmp_path):
    spec = dataclasses.replace(F.XEON_2S, offline=(95,), memory_only_numa=2)
    raw = parse_hwloc_xml(F.write_hwloc_xml(spec, tmp_path / "t.xml"))
    assert raw.offline == (95,)
    assert raw.memory_only_numa == (2, 3)
    assert len(raw.cpus) == 95


HAND_HWLOC = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f">
    <info name="CPUModel" value="Hand Made 2x2"/>
    <object type="NUMANode" os_index="0" cpuset="0x0000000f" local_memory="1024"/>
    <object type="Package" os_index="0" cpuset="0x00000005">
      <object type="L3Cache" cpuset="0x00000005" cache_size="1048576" depth="3">
        <object type="L2Cache" cpuset="0x00000001" cache_size="262144"><object type="Core" os_index="0" cpuset="0x00000001">
          <object type="PU" os_index="0" cpuset="0x00000001"/></object></object>
        <object type="L2Cache" cpuset="0x00000004" cache_size="262144"><object type="Core" os_index="1" cpuset="0x00000004">
          <object type="PU" os_index="2" cpuset="0x00000004"/></object></object>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000a">
      <object type="L3Cache" cpuset="0x0000000a" cache_size="1048576" depth="3">
        <object type="L2Cache" cpuset="0x00000002" cache_size="262144"><object type="Core" os_index="0" cpuset="0x00000002">
          <object type="PU" os_index="1" cpuset="0x00000002"/></object></object>
        <object type="L2Cache" cpuset="0x00000008" cache_size="262144"><object type="Core" os_index="1" cpuset="0x00000008">
          <object type="PU" os_index="3" cpuset="0x00000008"/></object></object>
      </object>
    </object>
  </object>
</topology>
"""


def test_hand_written_hwloc_interleaved_packages_one_numa(tmp_path):
    # Like lstopo on a 2-socket box in memory-interleave mode: one NUMA node above both packages,
    # even cpus on package 0; core os_index values repeat across packages.
    (tmp_path / "t.xml").write_text(HAND_HWLOC)
    tree = build_tree(parse_hwloc_xml(tmp_path / "t.xml"))
    assert levels(tree) == [("numa", 1), ("package", 2), ("l3", 2), ("l2", 4), ("core", 4), ("pu", 4)]
    assert tree.graph["name"] == "Hand Made 2x2"
    assert leaf_cpus(tree, "package0") == [0, 2]


def test_hand_written_lscpu_with_all_columns(tmp_path):
    text = "\n".join([
        "# CPU,Core,Cluster,Socket,Node,,L1d,L1i,L2,L3,Online",
        "0,0,0,0,0,,0,0,0,0,Y", "1,1,0,0,0,,1,1,1,0,Y", "2,2,1,0,0,,2,2,2,0,Y", "3,3,1,0,0,,3,3,3,0,Y",
        "4,,,,,,,,,,N",
    ])
    (tmp_path / "l.csv").write_text(text)
    raw = parse_lscpu(tmp_path / "l.csv")
    assert raw.offline == (4,)
    assert levels(build_tree(raw)) == [("package", 1), ("numa", 1), ("l3", 1), ("cluster", 2), ("l2", 4),
                                       ("core", 4), ("pu", 4)]


def test_live_machine_parses():
    tree = load_tree()
    s = summary(tree)
    assert s["pus"] >= 1 and s["levels"][-1] == {"kind": "pu", "count": s["pus"]}


def _tree_levels(root):
    return levels(build_tree(parse_sysfs(root)))


@pytest.mark.parametrize("name", ["kunpeng-4s", "xeon-2s"])
def test_rule_trailing_padding(tmp_path, name):
    """Issue 27, rule trailing-padding: real dumps end cpu lists in NULs and spaces
    (a 128-core ARM server's read "0\\n\\x00" and was refused as a bad cpu list)."""
    root = F.write_sysfs(F.MACHINES[name], tmp_path / name)
    want = _tree_levels(root)
    for f in (root / "sys").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes() + b"\x00 \x00")
    assert _tree_levels(root) == want


@pytest.mark.parametrize("name", ["kunpeng-4s", "xeon-2s"])
def test_rule_mask_instead_of_list(tmp_path, name):
    """Issue 27, rule mask-instead-of-list: an older kernel writes only the hex masks (a
    16-thread 4-socket Xeon was refused: missing thread_siblings_list)."""
    from sandwich.topology.cpulist import parse_cpulist

    root = F.write_sysfs(F.MACHINES[name], tmp_path / name)
    want = _tree_levels(root)
    masks = {"core_cpus_list": None, "thread_siblings_list": "thread_siblings",
             "cluster_cpus_list": "cluster_cpus", "shared_cpu_list": "shared_cpu_map",
             "cpulist": "cpumap"}
    for f in list((root / "sys").rglob("*")):
        if f.name in masks:
            cpus = parse_cpulist(f.read_text(), source=str(f))
            if masks[f.name]:
                value, words = sum(1 << c for c in cpus), []
                while True:
                    words.append(f"{value & 0xFFFFFFFF:08x}")
                    value >>= 32
                    if not value:
                        break
                (f.parent / masks[f.name]).write_text(",".join(reversed(words)) + "\n")
            f.unlink()
    assert _tree_levels(root) == want


def test_a_bad_mask_names_its_file(tmp_path):
    from sandwich.errors import TopologyError

    root = F.write_sysfs(F.MACHINES["desktop-8c"], tmp_path / "d")
    f = root / "sys/devices/system/cpu/cpu0/topology/core_cpus_list"
    f.unlink()
    (f.parent / "thread_siblings_list").unlink()
    (f.parent / "thread_siblings").write_text("zz,00000003\n")
    with pytest.raises(TopologyError, match="thread_siblings: bad cpu mask"):
        parse_sysfs(root)


@pytest.mark.parametrize("mount", ["none /dev/cpuset cpuset rw 0 0",
                                   "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0"])
def test_rule_cgroup_cpuset(tmp_path, mount):
    """Issue 27, rule cgroup-cpuset: only the cpus the process may use count (hwloc's
    16em64t-4s2ca2c-cpusetreorder snapshot runs in a cpuset of 11 of its 16 PUs)."""
    root = F.write_sysfs(F.MACHINES["desktop-8c"], tmp_path / "d")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cpuset").write_text("/jail\n")
    (root / "proc/mounts").write_text(mount + "\n")
    point = root / mount.split()[1].lstrip("/") / "jail"
    point.mkdir(parents=True)
    name = "cpus" if "cpuset " in mount else "cpuset.cpus.effective"
    (point / name).write_text("2-5\n")
    assert parse_sysfs(root).cpus == (2, 3, 4, 5)
    (point / name).write_text("40-41\n")
    from sandwich.errors import TopologyError

    with pytest.raises(TopologyError, match="allowed by the cpuset"):
        parse_sysfs(root)
