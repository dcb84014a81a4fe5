"""Issue 4: missing files, empty cpu lists, inconsistent ids and asymmetric trees give one-line
TopologyErrors (the CLI prints them without a traceback)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sandwich.cli.topo import register
from sandwich.errors import ConfigError, TopologyError
from sandwich.topology import fixtures as F
from sandwich.topology.parse_hwloc import parse_hwloc_xml
from sandwich.topology.parse_lscpu import parse_lscpu
from sandwich.topology.parse_sysfs import parse_sysfs
from sandwich.topology.symmetric import largest_symmetric_subtree
from sandwich.topology.tree import build_tree, check_symmetric, summary

CPU = "sys/devices/system/cpu"


@pytest.fixture()
def desktop(tmp_path):
    return F.write_sysfs(F.DESKTOP_8C, tmp_path / "root")


def _raises(fn, *words):
    with pytest.raises(TopologyError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_missing_root(tmp_path):
    _raises(lambda: parse_sysfs(tmp_path / "nope"), "missing sys/devices/system/cpu", "--sysfs-root")


def test_missing_topology_file(desktop):
    (desktop / CPU / "cpu3/topology/core_cpus_list").unlink()
    (desktop / CPU / "cpu3/topology/thread_siblings_list").unlink()
    _raises(lambda: parse_sysfs(desktop), "cpu3/topology/thread_siblings_list")


def test_empty_online_list(desktop):
    """Rule empty-online-list (issue 27: hwloc's 128-cpu ia64 snapshot has a 0-byte
    `online`): the next source is read; with no cpu online anywhere, one clear error."""
    want = parse_sysfs(desktop).cpus
    (desktop / CPU / "online").write_text("\n")
    assert parse_sysfs(desktop).cpus == want  # from `present`
    (desktop / CPU / "present").write_text("")
    assert parse_sysfs(desktop).cpus == want  # from the cpuN directories
    for flag in (desktop / CPU).glob("cpu*/online"):
        flag.write_text("0\n")
    _raises(lambda: parse_sysfs(desktop), "no online cpus")


def test_empty_sibling_list(desktop):
    (desktop / CPU / "cpu2/topology/core_cpus_list").write_text("\n")
    _raises(lambda: parse_sysfs(desktop), "cpu 2", "empty core sibling list")


def test_bad_cpu_list_syntax(desktop):
    (desktop / CPU / "cpu2/topology/core_cpus_list").write_text("2-a\n")
    _raises(lambda: parse_sysfs(desktop), "bad cpu list '2-a'")


def test_cpu_not_in_its_own_siblings(desktop):
    (desktop / CPU / "cpu2/topology/core_cpus_list").write_text("3,11\n")
    _raises(lambda: parse_sysfs(desktop), "cpu 2 is not in its own core sibling list", "inconsistent ids")


def test_sibling_lists_disagree(desktop):
    (desktop / CPU / "cpu2/topology/core_cpus_list").write_text("2-3\n")
    _raises(lambda: parse_sysfs(desktop), "core sibling lists disagree", "inconsistent ids")


def test_cpu_in_two_numa_nodes(tmp_path):
    root = F.write_sysfs(F.XEON_2S, tmp_path / "r")
    (root / "sys/devices/system/node/node1/cpulist").write_text("0,24-47,72-95\n")
    _raises(lambda: parse_sysfs(root), "cpu 0 is listed in NUMA nodes 0 and 1")


def test_rule_numa_overlap_every_node_the_same_cpus(tmp_path):
    """Issue 27, rule numa-overlap (hwloc's 8em64t-2s2ca2c-buggynuma): every node lists every
    cpu: one node."""
    root = F.write_sysfs(F.XEON_2S, tmp_path / "r")
    for node in (root / "sys/devices/system/node").glob("node*/cpulist"):
        node.write_text("0-95\n")
    raw = parse_sysfs(root)
    assert len(raw.partitions["numa"]) == 1


def test_l3_crossing_numa_nodes(tmp_path):
    root = F.write_sysfs(F.XEON_2S, tmp_path / "r")
    (root / "sys/devices/system/node/node0/cpulist").write_text("0-11,48-59\n")
    (root / "sys/devices/system/node/node1/cpulist").write_text("12-47,60-95\n")
    _raises(lambda: parse_sysfs(root) and build_tree(parse_sysfs(root)), "span several", "inconsistent ids")


def test_hwloc_missing_and_malformed(tmp_path):
    _raises(lambda: parse_hwloc_xml(tmp_path / "none.xml"), "file not found", "lstopo")
    (tmp_path / "bad.xml").write_text("<topology><object")
    _raises(lambda: parse_hwloc_xml(tmp_path / "bad.xml"), "not valid XML")
    (tmp_path / "nopu.xml").write_text('<topology version="2.0"><object type="Machine" cpuset="0x1"/></topology>')
    _raises(lambda: parse_hwloc_xml(tmp_path / "nopu.xml"), "no PU objects")


def test_lscpu_missing_header_and_bad_rows(tmp_path):
    _raises(lambda: parse_lscpu(tmp_path / "none"), "file not found")
    (tmp_path / "a").write_text("0,0,0,0\n")
    _raises(lambda: parse_lscpu(tmp_path / "a"), "no '# CPU,Core,Socket,...' header")
    (tmp_path / "b").write_text("# CPU,Core,Socket,Node\n0,0,0,0\n0,1,0,0\n")
    _raises(lambda: parse_lscpu(tmp_path / "b"), "cpu 0 appears twice")
    (tmp_path / "c").write_text("# CPU,Core,Socket,Node\n0,x,0,0\n")
    _raises(lambda: parse_lscpu(tmp_path / "c"), "row 1", "'x' is not an integer")
    (tmp_path / "d").write_text("# CPU,Core,Socket,Node\n")
    _raises(lambda: parse_lscpu(tmp_path / "d"), "cpu list is empty")


def test_asymmetric_names_the_asymmetry_and_offers_subtree():
    # two cores of package 1 lost their first hardware thread (cpus 30, 31 offline)
    spec = dataclasses.replace(F.XEON_2S, offline=(30, 31))
    tree = build_tree(F.raw_from_spec(spec))
    msg = _raises(lambda: check_symmetric(tree), "asymmetric machine", "2 of 48 core nodes have 1 pu children instead of 2",
                  "88 PUs", "--trim-asymmetric")
    assert "cpus 0-21,24-29,32-69,72-77,80-95" in msg
    sub = largest_symmetric_subtree(tree)
    # 2 packages x 22 full cores x 2 threads beats 48 cores x 1 thread
    assert summary(sub)["pus"] == 88
    check_symmetric(sub)


def test_uneven_numa_nodes_drop_a_node_when_that_is_larger():
    # NUMA node 1 has only 4 of its 24 cores online: keeping 1x24 beats 2x4
    spec = dataclasses.replace(F.KUNPENG_4S, packages=1, offline=tuple(range(28, 48)))
    sub = largest_symmetric_subtree(build_tree(F.raw_from_spec(spec)))
    assert summary(sub)["pus"] == 24


def _cli(*argv):
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(["topo", *argv])
    return args.func(args)


def test_cli_errors_are_sandwich_errors(tmp_path):
    with pytest.raises(TopologyError):
        _cli("show", "--sysfs-root", str(tmp_path))
    with pytest.raises(ConfigError, match="--top-k"):
        _cli("search", "--top-k", "0", "--sysfs-root", str(tmp_path))
    root = F.write_sysfs(dataclasses.replace(F.DESKTOP_8C, offline=(3,)), tmp_path / "r")
    with pytest.raises(TopologyError, match="asymmetric"):
        _cli("search", "--sysfs-root", str(root), "--out-dir", str(tmp_path / "out"), "--no-png")
    with pytest.raises(ConfigError, match="trace"):
        _cli("search", "--sysfs-root", str(root), "--trim-asymmetric", "--trace", str(tmp_path / "missing.json"),
             "--out-dir", str(tmp_path / "out"), "--no-png")


def _sibling_cycle(root):
    """cpu 0 lists 0-1, cpu 1 lists 1-2, cpu 2 lists 0,2: each contains itself, none agree."""
    for c, text in ((0, "0-1"), (1, "1-2"), (2, "0,2")):
        (root / CPU / f"cpu{c}/topology/core_cpus_list").write_text(text + "\n")


def _empty_tree(root):
    """The cpu directory is there but holds nothing."""
    import shutil

    shutil.rmtree(root / CPU)
    (root / CPU).mkdir()


# issue 27: malformed snapshots, each one line naming the file (or the directory) at fault
MALFORMED = [
    ("truncated cpu list", lambda r: (r / CPU / "cpu2/topology/core_cpus_list").write_text("2,"),
     ("cpu2/topology/core_cpus_list", "bad cpu list")),
    ("truncated range", lambda r: (r / CPU / "online").write_text("0-\n"), ("cpu/online", "bad cpu list '0-'")),
    ("truncated mask", lambda r: (r / "sys/devices/system/node/node0/cpumap").write_text("0000ff,\n"),
     ("node0/cpumap", "bad cpu mask")),
    ("cycle of siblings", _sibling_cycle, ("core sibling lists disagree", "core_cpus_list")),
    ("empty tree", _empty_tree, ("missing sys/devices/system/cpu/online and no cpuN directories",)),
]


@pytest.mark.parametrize("name, damage, words", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_snapshot_is_one_error_naming_the_file(desktop, name, damage, words):
    damage(desktop)
    _raises(lambda: parse_sysfs(desktop), *words)
    with pytest.raises(TopologyError):  # the CLI lets it through as is, for main() to print
        _cli("show", "--sysfs-root", str(desktop))


@pytest.mark.parametrize("bad", ["absolute", "dotdot", "link-out", "device"])
def test_a_snapshot_member_outside_its_root_is_refused_and_nothing_lands_outside(tmp_path, bad):
    """extract_snapshot checks each member's name and link target itself (no realpath calls):
    a member that would land or point outside the archive's root, or a device, is one line."""
    import io
    import tarfile

    from sandwich.topology.snapshot import extract_snapshot

    archive = tmp_path / "snap.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tf:
        ok = tarfile.TarInfo("snap/sys/devices/system/cpu/online")
        ok.size = 2
        tf.addfile(ok, io.BytesIO(b"0\n"))
        member = tarfile.TarInfo({"absolute": "/tmp/evil", "dotdot": "snap/../../evil"}.get(bad, "snap/x"))
        if bad == "link-out":
            member.type, member.linkname = tarfile.SYMTYPE, "../../evil"
        elif bad == "device":
            member.type = tarfile.CHRTYPE
        tf.addfile(member, io.BytesIO(b""))
    into = tmp_path / "into"
    into.mkdir()
    _raises(lambda: extract_snapshot(archive, into), "cannot unpack the snapshot")
    assert not (tmp_path / "evil").exists() and not (into / "snap" / "x").exists()
    good = tmp_path / "good.tar.bz2"
    with tarfile.open(good, "w:bz2") as tf:
        link = tarfile.TarInfo("snap/sys/devices/system/node/node0/cpu0")
        link.type, link.linkname = tarfile.SYMTYPE, "../../cpu/cpu0"  # as sysfs links: inside
        tf.addfile(link)
    root = extract_snapshot(good, tmp_path / "ok")
    assert (root / "sys/devices/system/node/node0/cpu0").is_symlink()
