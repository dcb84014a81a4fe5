"""Issue 27, item 3: `topo search` on hwloc's snapshots (bench/topology_hwloc.py), on a few of
them: the 128-core ARM server, multi-socket x86 (one behind a cgroup cpuset), a 2-core ARM."""

from __future__ import annotations

import json
import shutil

import pytest

from sandwich.bench.topology_hwloc import (
    HWLOC_DATA,
    TIME_LIMIT_S,
    SnapshotRow,
    run_snapshots,
    search_root,
    write_report,
)
from sandwich.models import load_model_config
from sandwich.topology.parse_sysfs import parse_sysfs
from sandwich.topology.simulator import SimParams
from sandwich.topology.snapshot import extract_snapshot
from sandwich.topology.trace import load_trace

MODEL = load_model_config("llama-3-8b")
TRACE = load_trace("synthetic")

# snapshot: (arch, levels of the searched tree, group variants); these come from the parse
# and the group transform alone, not from the simulator's rankings
CASES = {
    "128arm-2pa2n8cluster4co": ("aarch64", "package 2 > numa 4 > l3 4 > cluster 32 > l2 128 > core 128 > pu 128", 8),
    "64amd64-4s2n4ca2co": ("x86_64", "package 4 > numa 8 > l3 8 > l2 32 > core 64 > pu 64", 5),
    "2arm-2c": ("arm", "package 1 > numa 1 > core 2 > pu 2", 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_search_runs_within_the_limit_on_allowed_cpus(tmp_path, name):
    root = extract_snapshot(HWLOC_DATA / f"{name}.tar.bz2", tmp_path)
    row = search_root(root, name=name, model=MODEL, trace=TRACE, params=SimParams())
    arch, levels, variants = CASES[name]
    assert row.error == ""
    assert (row.arch, row.levels, row.group_variants) == (arch, levels, variants)
    assert 0 < row.trees_explored <= variants * row.searched_pus ** 2  # Proposition 2, per variant
    assert row.configs_simulated > 0 and row.seconds < TIME_LIMIT_S
    # the decode winner pins each cpu once, and only cpus this process may use
    allowed = parse_sysfs(root).cpus
    assert row.decode_cpus and len(set(row.decode_cpus)) == len(row.decode_cpus)
    assert set(row.decode_cpus) <= set(allowed)
    assert row.prefill.startswith("TP=") and row.decode.startswith("TP=")


def test_the_cpuset_snapshot_searches_only_allowed_cpus(tmp_path):
    """16amd64-8n2c-cpusets: 16 cpus online, the cgroup cpuset allows 10; two of its 6 NUMA
    nodes keep one core, so the tree is trimmed to 8 PUs and the note names the asymmetry."""
    root = extract_snapshot(HWLOC_DATA / "16amd64-8n2c-cpusets.tar.bz2", tmp_path)
    row = search_root(root, name="16amd64-8n2c-cpusets", model=MODEL, trace=TRACE, params=SimParams())
    assert len(list((root / "sys/devices/system/cpu").glob("cpu[0-9]*"))) == 16
    assert (row.pus, row.numa, row.searched_pus) == (len(parse_sysfs(root).cpus), 6, 8) == (10, 6, 8)
    assert "2 of 6 numa nodes have 1 l2 children" in row.trimmed
    assert row.error == "" and row.levels == "package 4 > numa 4 > l2 8 > core 8 > pu 8"
    assert row.trees_explored > 0 and row.seconds < TIME_LIMIT_S
    assert set(row.decode_cpus) <= set(parse_sysfs(root).cpus)


def test_report_has_a_row_per_snapshot_and_says_why_one_fails(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("2arm-2c", "8em64t-2s2ca2c"):
        shutil.copy(HWLOC_DATA / f"{name}.tar.bz2", data)
    (data / "broken.tar.bz2").write_bytes(b"not a tarball")
    names = ["2arm-2c", "8em64t-2s2ca2c", "broken"]
    seen: list[str] = []
    rows = run_snapshots(names=names, data=data, model=MODEL, trace=TRACE, params=SimParams(),
                         progress=seen.append)
    assert seen == names and [r.name for r in rows] == names
    assert [bool(r.error) for r in rows] == [False, False, True]
    assert "broken.tar.bz2: cannot unpack the snapshot" in rows[2].error
    md, js = tmp_path / "out" / "t.md", tmp_path / "out" / "t.json"
    write_report(rows, md=md, json_path=js, command="sandwichc topo hwloc-report", machine="test box",
                 model="llama-3-8b", trace=TRACE)
    text = md.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| snapshot")]
    assert [line.split(" | ")[0][2:] for line in table] == names
    assert "test box" in text and "## Not searchable" in text and "- broken: " in text
    payload = json.loads(js.read_text())
    assert [SnapshotRow.from_dict(r) for r in payload["rows"]] == rows
    assert payload["time_limit_s"] == TIME_LIMIT_S


def test_cli_names_an_unknown_snapshot(capsys):
    from sandwich.cli import main

    assert main(["topo", "hwloc-report", "--only", "no-such-machine"]) == 1
    assert "--only no-such-machine: not a snapshot" in capsys.readouterr().err
