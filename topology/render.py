"""Text and PNG pictures of a TopoTree: symmetric siblings are folded so 192 cores stay readable."""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from sandwich.errors import ConfigError
from sandwich.topology.cpulist import format_cpulist
from sandwich.topology.tree import depth_levels, leaf_cpus, root, summary

_LABEL = {"machine": "Machine", "package": "Package", "numa": "NUMA", "l3": "L3", "cluster": "Cluster",
          "l2": "L2", "core": "Core", "pu": "PU", "group": "Group"}


def node_label(tree: nx.DiGraph, node: str) -> str:
    d = tree.nodes[node]
    kind = d["kind"]
    if kind == "pu":
        return f"PU {d['cpu']}"
    parts = [_LABEL[kind]]
    if kind == "numa":
        parts.append(f"#{d.get('os_index', 0)}")
    if "size" in d:
        parts.append(f"{d['size'] >> 10} KiB")
    if kind == "group":
        parts.append(f"n={d['n']} t={d['t']}")
    return " ".join(parts)


def render_text(tree: nx.DiGraph, *, full: bool = False) -> str:
    """Indented tree; unless `full`, only the first child of each node is expanded."""
    s = summary(tree)
    head = f"{tree.graph.get('name', 'machine')}: {s['pus']} PUs, {s['cores']} cores; levels " + ", ".join(
        f"{lv['kind']} x{lv['count']}" for lv in s["levels"]
    )
    lines = [head]

    def walk(node: str, indent: int) -> None:
        kids = list(tree.successors(node))
        cpus = leaf_cpus(tree, node)
        if kids and all(tree.nodes[k]["kind"] == "pu" for k in kids):
            lines.append("  " * indent + f"{node_label(tree, node)}: PU {format_cpulist(cpus)}")
            return
        lines.append("  " * indent + f"{node_label(tree, node)} (cpus {format_cpulist(cpus)})")
        shown = kids if full else kids[:1]
        for k in shown:
            walk(k, indent + 1)
        if len(kids) > len(shown):
            rest = [c for k in kids[1:] for c in leaf_cpus(tree, k)]
            kind = _LABEL[tree.nodes[kids[0]]["kind"]]
            lines.append("  " * (indent + 1) + f"... {len(kids) - 1} more {kind} alike (cpus {format_cpulist(rest)})")

    walk(root(tree), 0)
    return "\n".join(lines)


def render_png(tree: nx.DiGraph, path: str | Path, *, title: str = "") -> Path:
    """Draw the levels as rows of boxes (first 16 nodes of a row, with the count), edges between."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("drawing the tree PNG needs matplotlib: pip install matplotlib, or pass --no-png") from None
    levels = depth_levels(tree)
    cap = 16
    fig, ax = plt.subplots(figsize=(14, 1.1 * len(levels) + 1))
    pos: dict[str, tuple[float, float]] = {}
    for d, level in enumerate(levels):
        shown = level[:cap]
        for i, node in enumerate(shown):
            x = (i + 0.5) / len(shown)
            y = -d
            pos[node] = (x, y)
            label = node_label(tree, node)
            ax.text(x, y, label, ha="center", va="center", fontsize=6,
                    bbox={"boxstyle": "round", "fc": "#dde8f5", "ec": "#4a6fa5", "lw": 0.6})
        kind = _LABEL[tree.nodes[level[0]]["kind"]]
        more = f" (first {cap} shown)" if len(level) > cap else ""
        ax.text(-0.02, -d, f"{kind} x{len(level)}{more}", ha="right", va="center", fontsize=7)
    for u, v in tree.edges:
        if u in pos and v in pos:
            ax.plot([pos[u][0], pos[v][0]], [pos[u][1] - 0.2, pos[v][1] + 0.2], color="#999999", lw=0.4)
    ax.set_xlim(-0.25, 1.02)
    ax.set_ylim(-len(levels) + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(title or tree.graph.get("name", "TopoTree"), fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
