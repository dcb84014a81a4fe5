"""results/scheduling.{md,json,png}: the policy tables, the TTFT-TBT trade-off over C and G
(002 Fig. 6 style), and expert traffic at the same TBT SLO next to 002's reductions."""

from __future__ import annotations

import json
from pathlib import Path

from sandwich.bench.scheduling import PolicyRow, SchedulingRun

PAPER_REDUCTION = {"arxiv": 0.39, "sharegpt": 0.12}  # 002: expert traffic, layered vs chunked


def _p(p) -> str:
    return f"{p.p50:.0f} / {p.p90:.0f} / {p.p99:.0f}"


def _good(row: PolicyRow) -> str:
    if not row.goodput:
        return "-"
    g = row.goodput
    return f"{'>= ' if g['capped'] else ''}{g['rate']:.3g}"


def _kind(policy: str) -> str:
    return policy.partition(":")[0]


def same_tbt_slo(rows: list[PolicyRow], tbt_ms: float) -> dict[str, PolicyRow | None]:
    """Per kind (chunked, layered): the point with the least expert traffic among those whose
    TBT P99 meets the SLO."""
    out: dict[str, PolicyRow | None] = {}
    for kind in ("chunked", "layered"):
        ok = [r for r in rows if _kind(r.policy) == kind and r.tbt_ms.p99 <= tbt_ms and not r.errors]
        out[kind] = min(ok, key=lambda r: r.expert_bytes_per_request, default=None)
    return out


def to_markdown(run: SchedulingRun, command: str) -> str:
    slo = run.settings["slo"]
    slos = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in slo.items() if v)
    lines = [
        "# Scheduling policies on the real engine (issue 28)", "",
        f"Machine: {run.machine}. Model: {run.model}. Every policy and every trade-off point "
        f"ran on the same requests of each trace, one after another in one run, on the same "
        f"engine and threads (splitwise: its own two pools).", "",
        f"Command: `{command}`", "",
        f"Per-request SLOs: {slos} (TBT: every gap of the request). Attainment: the share of "
        f"requests meeting all of them. Goodput: the highest rate (req/s) with >= 90% "
        f"attainment, bisected over replays of the same requests at rescaled arrivals"
        + (f" (each probe on the first {run.settings['goodput_duration_s']:g} s of the trace)"
           if run.settings.get("goodput_duration_s") else "") + ".", "",
        "TBT P99 is the stall a prefill puts between two decode tokens; TTFT P50 what a new "
        "request waits. Chunked (smaller C) and layered (larger G) trade the first for the "
        "second; splitwise removes the stall by giving each phase its own cores (on 2 cores: "
        "one each, so each phase runs at half the threads).", "",
        "| trace | requests | mean prompt | mean output | rate (req/s) |", "|---|---|---|---|---|",
    ]
    for name, t in run.traces.items():
        lines.append(f"| {name} | {t['requests']} | {t['mean_prompt']:.0f} | {t['mean_output']:.0f} "
                     f"| {t['rate']:.2f} |")
    for name in run.traces:
        rows = [r for r in run.rows if r.trace == name]
        ref = next((r.ids_digest for r in rows if r.policy == "sandwich"), None)
        moe = any(r.expert_bytes_per_request for r in rows)
        lines += ["", f"## {name}", "",
                  "| policy | TTFT ms P50/P90/P99 | TBT ms P50/P90/P99 | E2E ms P50/P90/P99 | "
                  "attainment | goodput req/s | tokens/s |" + (" expert MB/request |" if moe else "")
                  + " same tokens as sandwich |",
                  "|---|---|---|---|---|---|---|" + ("---|" if moe else "") + "---|"]
        for r in rows:
            same = "-" if ref is None else ("yes" if r.ids_digest == ref else "NO")
            lines.append(f"| {r.policy}{' (sweep)' if r.sweep else ''} | {_p(r.ttft_ms)} | "
                         f"{_p(r.tbt_ms)} | {_p(r.e2e_ms)} | {r.attainment:.0%} | {_good(r)} | "
                         f"{r.tokens_per_s:.1f} |"
                         + (f" {r.expert_bytes_per_request / 1e6:.1f} |" if moe else "")
                         + f" {same}{' (' + str(r.errors) + ' errors)' if r.errors else ''} |")
        lines += ["", *_best(rows)]
        if moe and slo.get("tbt_ms"):
            lines += ["", *_expert_section(name, rows, slo["tbt_ms"])]
    return "\n".join(lines) + "\n"


def _best(rows: list[PolicyRow]) -> list[str]:
    """The policies that did best on this trace, by the run's own figures."""
    def names(key) -> str:
        top = max(key(r) for r in rows)
        return ", ".join(r.policy for r in rows if key(r) == top)

    out = [f"- highest attainment: {names(lambda r: r.attainment)} "
           f"({max(r.attainment for r in rows):.0%})",
           f"- lowest TBT P99: {min(rows, key=lambda r: r.tbt_ms.p99).policy}; lowest TTFT P50: "
           f"{min(rows, key=lambda r: r.ttft_ms.p50).policy}"]
    good = [r for r in rows if r.goodput]
    if good:
        out.append(f"- highest goodput: {names(lambda r: r.goodput['rate'] if r.goodput else -1)} "
                   f"({max(r.goodput['rate'] for r in good):.3g} req/s)")
    return out


def _expert_section(trace: str, rows: list[PolicyRow], tbt_ms: float) -> list[str]:
    pick = same_tbt_slo(rows, tbt_ms)
    c, g = pick["chunked"], pick["layered"]
    head = f"Expert traffic at the same TBT SLO (P99 TBT <= {tbt_ms:g} ms), least traffic of each kind:"
    if c is None or g is None:
        return [head, "", f"not comparable: {'no chunked' if c is None else 'no layered'} point "
                          f"meets the TBT SLO on this trace"]
    red = 1 - g.expert_bytes_per_request / c.expert_bytes_per_request
    paper = next((v for k, v in PAPER_REDUCTION.items() if k in trace), None)
    return [head, "",
            f"- {c.policy}: {c.expert_bytes_per_request / 1e6:.1f} MB/request (TBT P99 "
            f"{c.tbt_ms.p99:.0f} ms); {g.policy}: {g.expert_bytes_per_request / 1e6:.1f} MB/request "
            f"(TBT P99 {g.tbt_ms.p99:.0f} ms)",
            f"- layered reads {f'{red:.0%} less' if red >= 0 else f'{-red:.0%} more'} expert "
            f"weight than chunked"
            + (f"; 002 reports {paper:.0%} on its {trace.split(':')[-1]}-like workload"
               if paper is not None else "")]


def write_png(run: SchedulingRun, path: Path) -> None:
    """TTFT P50 against TBT P99 for every chunked C and layered G, one panel per trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(run.traces)
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for kind, marker in (("chunked", "o"), ("layered", "s")):
            pts = sorted((r for r in run.rows if r.trace == name and _kind(r.policy) == kind
                          and ":" in r.policy), key=lambda r: int(r.policy.split(":")[1]))
            if not pts:
                continue
            ax.plot([r.tbt_ms.p99 for r in pts], [r.ttft_ms.p50 for r in pts], marker=marker,
                    label=kind)
            for r in pts:
                ax.annotate(r.policy.split(":")[1], (r.tbt_ms.p99, r.ttft_ms.p50), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        for r in run.rows:
            if r.trace == name and (r.policy == "sandwich" or _kind(r.policy) == "splitwise"):
                ax.scatter([r.tbt_ms.p99], [r.ttft_ms.p50], marker="x", label=r.policy)
        ax.set_title(name)
        ax.set_xlabel("TBT P99 (ms)")
        ax.set_ylabel("TTFT P50 (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"TTFT-TBT trade-off over chunk size C and layer groups G ({run.machine})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(run: SchedulingRun, path: Path) -> None:
    doc = {"machine": run.machine, "model": run.model, "settings": run.settings,
           "traces": run.traces, "rows": [r.to_dict() for r in run.rows]}
    path.write_text(json.dumps(doc, indent=1, default=str))

