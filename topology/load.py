"""Pick the topology source (live sysfs, snapshot, hwloc XML, lscpu) and build the TopoTree."""

from __future__ import annotations

import re
from pathlib import Path

import networkx as nx

from sandwich.errors import ConfigError
from sandwich.topology.parse_hwloc import parse_hwloc_xml
from sandwich.topology.parse_lscpu import parse_lscpu
from sandwich.topology.parse_sysfs import parse_sysfs
from sandwich.topology.symmetric import largest_symmetric_subtree
from sandwich.topology.tree import asymmetry, build_tree, summary


def load_tree(
    *,
    sysfs_root: str | Path | None = None,
    hwloc_xml: str | Path | None = None,
    lscpu: str | Path | None = None,
    trim_asymmetric: bool = False,
) -> nx.DiGraph:
    """At most one source; none means the live machine (`/`)."""
    given = [x for x in (sysfs_root, hwloc_xml, lscpu) if x is not None]
    if len(given) > 1:
        raise ConfigError("give at most one of --sysfs-root, --hwloc-xml, --lscpu")
    if hwloc_xml is not None:
        raw = parse_hwloc_xml(hwloc_xml)
    elif lscpu is not None:
        raw = parse_lscpu(lscpu)
    else:
        raw = parse_sysfs(sysfs_root if sysfs_root is not None else "/")
    tree = build_tree(raw)
    if trim_asymmetric and asymmetry(tree):
        tree = largest_symmetric_subtree(tree)
        tree.graph["trimmed"] = True
    return tree


def machine_slug(tree: nx.DiGraph) -> str:
    """A file-name-safe machine id: CPU model words plus the PU count."""
    name = re.sub(r"\(.*?\)|@.*|cpu|processor", " ", str(tree.graph.get("name", "machine")), flags=re.I)
    words = re.findall(r"[a-z0-9]+", name.lower())[:4]
    return "_".join([*words, f"{summary(tree)['pus']}pu"])
