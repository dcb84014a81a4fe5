"""Markdown table and PNG plot of a GEMM benchmark run."""

from __future__ import annotations

from pathlib import Path

from sandwich.bench.gemm import ratio_text


def write_markdown(res, path: Path) -> None:
    js = res.to_json()
    s = js["summary"]
    lines = [
        "# Sandwich GEMM kernels vs vendor BLAS",
        "",
        f"Regenerate: `{res.command}` (after `sandwichc tune` for the same models).",
        "",
        f"- machine: {res.machine}",
        f"- threads: {res.threads} for every library (same process, same run), fp32, date {res.date}",
        f"- measured limits: FMA peak {res.peak_gflops:.1f} GFLOPS (the larger of a measurement before and one after the timings), streaming read {res.read_gbs:.1f} GB/s (the best of 1, 2 and 4 concurrent streams per thread; this VM's DRAM bandwidth drifts by tens of percent over minutes)",
        "- timings: warm-up, then 7 repeats, median; each result checked against numpy first;"
        " every runner sees the same weights repeated (same cache state)",
        f"- {res.passes} pass(es), minutes apart; each runner's figure is its best pass (the JSON"
        " keeps every pass); each pass times ours on every row, then each peer on every row"
        " (ours first in pass 1, before the peer libraries start: their idle threads keep"
        " spinning), all in the same process",
        f"- peers: {', '.join(res.peers)}" + (f" (skipped: {'; '.join(res.skipped)})" if res.skipped else ""),
        f"- other processes used {100 * res.other_load[0]:.0f}% of the CPUs at the start and "
        f"{100 * res.other_load[1]:.0f}% at the end (above 15% the figures are not trustworthy)",
        "- OpenVINO, rotated: one compiled model holds every weight copy (one model per copy would"
        " start a thread pool each); its time per call is divided by the copies",
        "",
        f"**Geomean speedup over the best peer per row: {ratio_text(s['geomean_speedup_all'])} "
        f"overall, {ratio_text(s['geomean_speedup_m_le_64'])} for M <= 64.**" + _peak_sentence(res, s),
        "",
        "| model | op | M | N x K | sandwich GFLOPS | " + " | ".join(f"{p}" for p in res.peers)
        + " | speedup vs best | % of peak | % of peak, best repeat |",
        "|---|---|---:|---|---:|" + "---:|" * len(res.peers) + "---:|---:|---:|",
    ]
    for r in res.rows:
        peers = " | ".join(f"{r[f'{p}_gflops']:.1f}" for p in res.peers)
        sp = r["speedup_vs_best_peer"]
        lines.append(f"| {r['model']} | {r['op']} | {r['m']} | {r['n']} x {r['k']} | "
                     f"{r['sandwich_gflops']:.1f} | {peers} | {sp:.2f} | "
                     f"{100 * r['sandwich_gflops'] / res.peak_gflops:.0f}% | "
                     f"{100 * r.get('sandwich_best_gflops', 0.0) / res.peak_gflops:.0f}% |")
    if res.rotated_rows:
        lines += ["", "## Skinny M with weights rotated beyond the LLC (DRAM-bound)", "",
                  "Weight GB/s and % of the streaming-read bandwidth of the same moment: the mean of"
                  " reads measured right before and right after each timing (DRAM bandwidth drifts here).",
                  "", _rotated_summary_line(js["rotated_summary"]), "",
                  "| model | op | M | N x K | copies | sandwich | " + " | ".join(res.peers) + " |",
                  "|---|---|---:|---|---:|---:|" + "---:|" * len(res.peers)]
        for r in res.rotated_rows:
            peers = " | ".join(f"{r[f'{p}_gbs']:.1f} ({r[f'{p}_pct_read']:.0f}%)" for p in res.peers)
            lines.append(f"| {r['model']} | {r['op']} | {r['m']} | {r['n']} x {r['k']} | {r['copies']} | "
                         f"{r['sandwich_gbs']:.1f} ({r['sandwich_pct_read']:.0f}%) | {peers} |")
    path.write_text("\n".join(lines) + "\n")


def write_png(res, path: Path) -> None:
    """Speedup over the best peer vs M, one line per (model, op)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in res.rows:
        if r["speedup_vs_best_peer"]:
            series.setdefault(f"{r['model']} {r['op']}", []).append((r["m"], r["speedup_vs_best_peer"]))
    for label, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over best vendor peer")
    ax.set_title(f"sandwich GEMM vs {', '.join(res.peers)} ({res.threads} threads, fp32)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _rotated_summary_line(rs: dict) -> str:
    """'sandwich 38/40 (M = 1: 10/10, ...; min 80%; each pass alone: 33/40, 35/40); numpy ...':
    rows at the target share."""
    parts = []
    for name, r in rs["runners"].items():
        per_m = ", ".join(f"M = {m}: {hit}/{total}" for m, (hit, total) in r["per_m"].items())
        alone = ", ".join(f"{n}/{r['rows']}" for n in r["at_target_each_pass"])
        parts.append(f"{name} {r['at_target']}/{r['rows']} ({per_m}; min {r['min_pct_read']:.0f}%"
                     + (f"; each pass alone: {alone}" if alone else "") + ")")
    return f"**Rows at >= {rs['target_pct_read']:.0f}% of the read:** " + "; ".join(parts) + "."


def _peak_sentence(res, s: dict) -> str:
    """The M >= 512 rows against the FMA peak, or that the run has none (an --m list of
    decode Ms): 0% of the peak would read as a measurement."""
    if not s["geomean_fraction_of_peak_m_ge_512"]:
        return " No rows with M >= 512, so no fraction of the peak."
    return (f" Rows with M >= 512 reach "
            f"{100 * s['geomean_fraction_of_peak_m_ge_512']:.0f}% of the measured peak on average "
            f"(min {100 * s['min_fraction_of_peak_m_ge_512']:.0f}%) by their median repeat, "
            f"{100 * s['geomean_best_fraction_of_peak_m_ge_512']:.0f}% (min "
            f"{100 * s['min_best_fraction_of_peak_m_ge_512']:.0f}%) by their best repeat, the "
            "statistic the peak is measured by (other processes and the hypervisor only ever slow "
            "a repeat down)." + _tile_sentence(res, s))


def _tile_sentence(res, s: dict) -> str:
    """How far the FMA peak is from a loop with a GEMM's loads on this CPU, and ours from that."""
    if not res.tile_gflops:
        return ""
    return (f" A register tile with every load an L1 hit (bench/machine.py: a GEMM's inner loop "
            f"with no cache misses) runs at {res.tile_gflops:.1f} GFLOPS, "
            f"{100 * res.tile_gflops / res.peak_gflops:.0f}% of that peak; the M >= 512 rows reach "
            f"{100 * s['geomean_fraction_of_tile_m_ge_512']:.0f}% of it on average (min "
            f"{100 * s['min_fraction_of_tile_m_ge_512']:.0f}%).")
