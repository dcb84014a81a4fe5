"""results/topology_<machine>.md (+ .json, + .png): the tree, the calibration, the ranked configs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import networkx as nx

from sandwich.topology.calibrate import Calibration
from sandwich.topology.cpulist import format_cpulist
from sandwich.topology.pipeline import Ranked, SearchResult
from sandwich.topology.render import render_text
from sandwich.topology.simulator import SimParams
from sandwich.topology.trace import Trace
from sandwich.topology.tree import summary


def _table(rows: list[Ranked]) -> list[str]:
    out = ["| rank | TP | threads/proc | NUMA per proc | cpus of rank 0 | TTFT ms | TPOT ms | transforms |",
           "|---:|---:|---:|---|---|---:|---:|---|"]
    for i, r in enumerate(rows, 1):
        c = r.config
        numa = ",".join(str(p.numa_node) for p in c.processes)
        out.append(
            f"| {i} | {c.tp} | {c.threads_per_process} | {numa} | {format_cpulist(c.processes[0].cpus)} | "
            f"{r.result.ttft_s * 1e3:.2f} | {r.result.tpot_s * 1e3:.3f} | {' '.join(r.ops) or '(fundamental)'} |"
        )
    return out


def write_report(
    *,
    out_dir: str | Path,
    slug: str,
    command: str,
    tree: nx.DiGraph,
    model_name: str,
    trace: Trace,
    params: SimParams,
    result: SearchResult,
    calibration: Calibration | None,
    png: Path | None,
) -> Path:
    """Write the Markdown report and a JSON of the top-k ServiceConfigs; return the .md path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = summary(tree)
    st = result.stats
    lines = [
        f"# TopoTree search on {tree.graph.get('name')}",
        "",
        f"Command: `{command}`",
        "",
        f"- machine: {tree.graph.get('name')} ({tree.graph.get('source')}), {s['pus']} PUs, {s['cores']} cores"
        + (" (largest symmetric sub-tree)" if tree.graph.get("trimmed") else ""),
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}; the search itself runs in one thread; latencies are simulated",
        f"- model: {model_name}; trace: {trace.source}, {len(trace.requests)} requests; decode batch {params.batch}",
        "",
        "## Tree",
        "",
        "```",
        render_text(tree),
        "```",
        "",
    ]
    if png is not None:
        lines += [f"![TopoTree]({png.name})", ""]
    lines += ["## Simulator parameters", ""]
    if calibration is not None:
        c = calibration
        lines += [
            f"Calibrated on this host (cpus {','.join(map(str, c.cpus))}, {c.date}): one pinned worker alone, then two at once,",
            f"GEMM {c.gemm_size}^3 fp32 (single-thread BLAS) and a {c.stream_floats * 4 >> 20} MiB-per-array stream add, {c.duration_s} s each.",
            "",
            "| measurement | 1 worker | 2 workers (per worker) | ratio |",
            "|---|---:|---:|---:|",
            f"| GEMM GFLOP/s | {c.gflops_1:.2f} | {c.gflops_2:.2f} | {c.gflops_2 / c.gflops_1:.2f} |",
            f"| stream GB/s | {c.gbs_1:.2f} | {c.gbs_2:.2f} | {c.gbs_2 / c.gbs_1:.2f} |",
            "",
        ]
        if c.gflops_2 < 0.75 * c.gflops_1:
            lines += [
                "Caution: GEMM, which shares no memory path, also slowed with two workers, so the host was busy",
                "(or the two cpus share one physical core); the bandwidth loss, used as the contention gamma, is an upper bound.",
                "",
            ]
    else:
        lines += ["Defaults (not calibrated on this host; pass --calibrate).", ""]
    lines += ["```", json.dumps(json.loads(params.to_json()), indent=1, sort_keys=True), "```", ""]
    lines += [
        "## Search",
        "",
        f"{st.group_variants} group variants; remove: {st.remove_generated} transforms applied, {st.remove_explored} distinct trees, "
        f"{st.remove_duplicates} duplicates (Merkle hash), {st.remove_pruned} pruned; configs: {st.configs_seen} distinct, "
        f"{st.configs_tp_rejected} rejected by TP limits, {st.configs_early_stopped} early-stopped, {st.configs_simulated} simulated; "
        f"**{st.seconds:.2f} s**.",
        "",
        "## Prefill top-k (all cores, ranked by simulated TTFT)",
        "",
        *_table(result.prefill),
        "",
        "## Decode top-k (ranked by simulated TPOT)",
        "",
        *_table(result.decode),
        "",
    ]
    md = out_dir / f"topology_{slug}.md"
    md.write_text("\n".join(lines))
    payload = {
        "command": command,
        "prefill": [json.loads(r.config.to_json()) | {"ttft_s": r.result.ttft_s, "tpot_s": r.result.tpot_s} for r in result.prefill],
        "decode": [json.loads(r.config.to_json()) | {"ttft_s": r.result.ttft_s, "tpot_s": r.result.tpot_s} for r in result.decode],
    }
    (out_dir / f"topology_{slug}.json").write_text(json.dumps(payload, indent=1, sort_keys=True))
    return md
