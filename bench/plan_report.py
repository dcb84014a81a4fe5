"""results/sandwich_plan.md: per model, the plan made on this machine (simulated and measured
candidates, the chosen pair, the pair against every single configuration in one run), then
the simulated plans of the project's large synthetic machines next to the paper's choices."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from sandwich.runtime.plan import Plan, describe, placement, plan_weights


def request_ms(f: dict, new_tokens: int) -> float:
    """Latency of the measurement request: the first token, then new_tokens - 1 more."""
    return f["ttft_ms"] + (new_tokens - 1) * f["tpot_ms"]


def _rank(values: dict[str, float]) -> list[str]:
    return sorted(values, key=values.get)


def paired(a: dict, b: dict, new_tokens: int) -> dict:
    """Per-round ratios a / b (the engines ran back to back in each round, so the machine's
    drifting memory bandwidth cancels): medians, and the range of the request-latency ratio."""
    req = [(t + (new_tokens - 1) * p) / (u + (new_tokens - 1) * q) for t, p, u, q in
           zip(a["ttft_all"], a["tpot_all"], b["ttft_all"], b["tpot_all"], strict=True)]
    return {"ttft": statistics.median(x / y for x, y in zip(a["ttft_all"], b["ttft_all"], strict=True)),
            "tpot": statistics.median(x / y for x, y in zip(a["tpot_all"], b["tpot_all"], strict=True)),
            "request": statistics.median(req), "request_min": min(req), "request_max": max(req)}


def verdict(plan: Plan) -> dict:
    """The issue's checks, from the one-run comparison (stage 2) of the plan, as paired ratios."""
    m, new = plan.measured, int(plan.setup["new_tokens"])
    singles, pair = m["singles"], m["pair"]
    # the best candidate of each phase in this same run (which may not be the one chosen)
    best_pre = min(singles, key=lambda k: singles[k]["ttft_ms"])
    best_dec = min(singles, key=lambda k: singles[k]["tpot_ms"])
    best_single = min(singles, key=lambda k: request_ms(singles[k], new))
    ratios = {k: paired(pair, f, new) for k, f in singles.items()}
    best = ratios[best_single]
    cands = [c for c in plan.candidates if not c.runnable]
    sim_pre = _rank({describe(c.config): c.sim_ttft_ms for c in cands})
    sim_dec = _rank({describe(c.config): c.sim_tpot_ms for c in cands})
    meas_pre = _rank({describe(c.config): c.ttft_ms for c in cands})
    meas_dec = _rank({describe(c.config): c.tpot_ms for c in cands})
    return {
        "best_prefill": best_pre, "best_decode": best_dec, "paired": ratios,
        "ttft_vs_best_prefill": ratios[best_pre]["ttft"],
        "ttft_within_3pct": ratios[best_pre]["ttft"] <= 1.03,
        "tpot_vs_best_decode": ratios[best_dec]["tpot"],
        "tpot_within_3pct": ratios[best_dec]["tpot"] <= 1.03,
        "best_single": best_single, "gain_over_best_single": 1 / best["request"] - 1,
        "gain_range": (1 / best["request_max"] - 1, 1 / best["request_min"] - 1),
        "pair_at_least_as_good": all(r["request"] <= 1.03 for r in ratios.values()),
        # the pair is faster than the best single in every round, not just in the median
        "gain_exceeds_spread": best["request_max"] < 1.0,
        "split": placement(plan.prefill) != placement(plan.decode),
        "sim_rank_prefill": sim_pre, "measured_rank_prefill": meas_pre,
        "sim_rank_decode": sim_dec, "measured_rank_decode": meas_dec,
    }


def model_section(plan: Plan) -> list[str]:
    v, s, m = verdict(plan), plan.setup, plan.measured
    new = int(s["new_tokens"])
    out = [f"## {plan.model}, {plan_weights(plan)} weights", "",
           f"Plan made {plan.created}; candidates: the simulated search's top {s['top_k']} per "
           f"phase (search calibrated on this host: {bool(s['calibrate'])}); kernels tuned per "
           f"payload at the `{s['budget']}` budget over M in [1, {s['seq_max']}]. Measured in "
           f"{s['rounds']} rounds, engines in a new order each round: TTFT of a "
           f"{s['prompt_len']}-token prompt on one engine after another, then TPOT over "
           f"{new} greedy tokens with the engines' decode steps interleaved one step at a time; "
           f"median over rounds (spread = (max - min) / median).",
           "", "| placement | from | transforms | sim TTFT ms | TTFT ms | spread | sim TPOT ms "
           "| TPOT ms | spread |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in plan.candidates:
        if c.runnable:
            out.append(f"| {describe(c.config)} | {c.config.phase} | {' '.join(c.ops) or '-'} | "
                       f"{c.sim_ttft_ms:.2f} | not run: {c.runnable} | | {c.sim_tpot_ms:.3f} | | |")
            continue
        out.append(f"| {describe(c.config)} | {c.config.phase} | {' '.join(c.ops) or '-'} | "
                   f"{c.sim_ttft_ms:.2f} | {c.ttft_ms:.2f} | {c.ttft_spread:.1%} | "
                   f"{c.sim_tpot_ms:.3f} | {c.tpot_ms:.3f} | {c.tpot_spread:.1%} |")
    out += ["", f"Ranking, simulated vs measured: prefill {v['sim_rank_prefill']} vs "
            f"{v['measured_rank_prefill']} ({'same' if v['sim_rank_prefill'] == v['measured_rank_prefill'] else 'differs'}); "
            f"decode {v['sim_rank_decode']} vs {v['measured_rank_decode']} "
            f"({'same' if v['sim_rank_decode'] == v['measured_rank_decode'] else 'differs'}).", "",
            f"**Chosen pair**: prefill {describe(plan.prefill)}, decode {describe(plan.decode)}"
            + (" (a process-layout change between phases: the KV cache crosses through shared "
               "memory)" if v["split"] and plan.prefill.tp != plan.decode.tp else "") + ".", "",
            "The pair against every single placement used for both phases, one run (medians; "
            "the ratios are the pair's over the engine's within each round, median over rounds):",
            "", "| engine | TTFT ms | spread | TPOT ms | spread | request ms | pair/it TTFT | "
            "pair/it TPOT | pair/it request (range) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, f in [("pair (the plan)", m["pair"]), *m["singles"].items()]:
        r = v["paired"].get(name)
        tail = (f"{r['ttft']:.3f} | {r['tpot']:.3f} | {r['request']:.3f} ({r['request_min']:.3f}-"
                f"{r['request_max']:.3f})" if r else "| |")
        out.append(f"| {name} | {f['ttft_ms']:.2f} | {f['ttft_spread']:.1%} | {f['tpot_ms']:.3f} | "
                   f"{f['tpot_spread']:.1%} | {request_ms(f, new):.1f} | {tail} |")
    lo, hi = v["gain_range"]
    out += ["", f"- plan TTFT / best prefill candidate's ({v['best_prefill']}), same run, paired: "
            f"{v['ttft_vs_best_prefill']:.3f} ({'within' if v['ttft_within_3pct'] else 'NOT within'} 3%)",
            f"- plan TPOT / best decode candidate's ({v['best_decode']}), same run, paired: "
            f"{v['tpot_vs_best_decode']:.3f} "
            f"({'within' if v['tpot_within_3pct'] else 'NOT within'} 3%)",
            f"- gain of the pair over the best single ({v['best_single']}) in request latency: "
            f"{v['gain_over_best_single']:+.1%} (per round {lo:+.1%} to {hi:+.1%}): "
            + ("faster in every round" if v["gain_exceeds_spread"] else
               "within the round-to-round spread"),
            f"- the pair is at least as good as every single (request latency, paired, 3% "
            f"tolerance): {v['pair_at_least_as_good']}",
            f"- greedy tokens identical across every engine: {m['greedy_ids_agree']}", ""]
    return out


def write_report(plans: list[Plan], *, command: str, machine: str, md: Path, json_out: Path,
                 fixtures_md: str = "") -> None:
    lines = ["# Sandwich plans: each phase its own service configuration and kernels", "",
             f"Command: `{command}`", "", f"Machine: {machine}. Every figure below was measured in "
             f"the run that wrote this file, on the real engine, all candidates in the same "
             f"process with the same threads.", ""]
    for plan in plans:
        lines += model_section(plan)
    if fixtures_md:
        lines += [fixtures_md.rstrip(), ""]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines))
    json_out.write_text(json.dumps({"command": command, "machine": machine,
                                    "plans": [json.loads(p.to_json()) | {"verdict": verdict(p)}
                                              for p in plans]}, indent=1))
