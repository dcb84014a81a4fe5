"""`sandwichc compare`: sandwich-kernel against MetaSchedule, DietCode-, Roller-, MikPoly-style and vendor GEMMs.

Every number comes from this run, on this machine, with the same threads (Sandwich §8.2, Fig. 8).
Each finished (method, op, M) result is appended to a JSON-lines store in the cache directory
as soon as it is measured, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError
from sandwich.tuner.timing import gflops, time_callable
from sandwich.types import GemmOp

METHODS = ("metaschedule", "dietcode", "roller", "mikpoly", "vendor")
TIMING = {"warmup": 2, "repeat": 7, "min_repeat_s": 0.02}
SETTLE_S = 0.2  # lets the previous library's spinning threads sleep before the next one runs


@dataclass(frozen=True)
class CompareConfig:
    """One comparison run: what to compare, on which shapes, with which budgets."""

    model: str
    shapes: int
    baselines: tuple[str, ...]
    trials: int
    threads: int
    seq_max: int
    ops: tuple[str, ...]
    budget: str
    cache_dir: Path
    out_dir: Path
    peers: tuple[str, ...] = ("numpy", "torch", "openvino")


def sample_ms(shapes: int, seq_max: int) -> list[int]:
    """`shapes` values of M spread log-uniformly over [1, seq_max], both ends included."""
    if shapes < 1 or seq_max < 1:
        raise ConfigError(f"--shapes and --seq-max must be >= 1, got {shapes} and {seq_max}")
    if shapes == 1:
        return [seq_max]
    ms = sorted({round(seq_max ** (i / (shapes - 1))) for i in range(shapes)})
    rest = iter(m for m in range(1, seq_max + 1) if m not in ms)
    while len(ms) < min(shapes, seq_max):  # small seq_max: fill the gaps with the smallest M
        ms.append(next(rest))
    return sorted(ms)


def parse_baselines(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in names if x not in METHODS]
    if bad:
        raise ConfigError(f"unknown --baselines {bad}; choose from {', '.join(METHODS)}")
    return names


class Store:
    """Finished results, one JSON line each, keyed by (kind, op, M); rewritten never, appended only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: dict[str, dict] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    d = json.loads(line)
                    self.rows[d["key"]] = d

    @staticmethod
    def key(kind: str, op: GemmOp, m: int = 0) -> str:
        return f"{kind}|{op.n}x{op.k}|{m}"

    def get(self, kind: str, op: GemmOp, m: int = 0) -> dict | None:
        return self.rows.get(self.key(kind, op, m))

    def put(self, kind: str, op: GemmOp, m: int = 0, **values) -> dict:
        d = {"key": self.key(kind, op, m), "kind": kind, "n": op.n, "k": op.k, "m": m, **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(d) + "\n")
        self.rows[d["key"]] = d
        return d


def _settle() -> None:
    time.sleep(SETTLE_S)


def time_template(measure, schedule, m: int, func=None) -> float:
    """GFLOPS of one template kernel at M (median of TIMING), after checking it against numpy."""
    from sandwich.compiler.gemm_runner import gemm_args, workspace_view
    from sandwich.errors import BuildError
    from sandwich.tuner.tvm_measure import check_against_numpy

    if func is None:
        func = measure.kernel(schedule)["main"]  # compiles and verifies once
    else:
        err = check_against_numpy(func, schedule, measure.a[:m], measure.wp, measure.w)
        if err:
            raise BuildError(err)
    t_k = schedule.polymerization.t_k
    ws = workspace_view(np.empty(t_k * m * measure.n, np.float32), t_k, m, measure.n) \
        if t_k > 1 else None
    args = gemm_args(measure.a[:m], measure.wp, measure.c[:m], schedule, ws)
    _settle()
    t = time_callable(lambda: func(*args), **TIMING)
    return gflops(2.0 * m * measure.n * measure.k, t.median_s)


@dataclass
class Context:
    """What every method of one op needs."""

    cfg: CompareConfig
    names: list[str]
    op: GemmOp
    ms: list[int]
    store: Store
    cache: object  # KernelCache
    step: Callable[[str], None]

    def measure(self):
        from sandwich.tuner.budget import get_budget
        from sandwich.tuner.tune import weight_pack
        from sandwich.tuner.tvm_measure import TvmMeasure

        cpu = self.cache.cpu  # the baselines run on the weight layout sandwich tunes
        pack_n = weight_pack(self.cache, self.op.n, get_budget(self.cfg.budget))
        if not pack_n:
            raise ConfigError(f"GEMM {self.op.name}: N={self.op.n} is not a multiple of the vector width")
        return TvmMeasure(cpu, self.cfg.threads, self.op.n, self.op.k, pack_n, max(self.ms))


def run_sandwich(ctx: Context) -> None:
    """Tune the op over the whole M range once (resumable in the kernel cache), time each M."""
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.tune import tune_op

    cfg, op = ctx.cfg, ctx.op
    budget = get_budget(cfg.budget)
    ctx.step("sandwich tune")
    rep = tune_op(names=ctx.names, op=op, seq_max=cfg.seq_max, threads=cfg.threads,
                  budget=budget, cache=ctx.cache)
    samples = set(budget.m_samples(cfg.seq_max))
    recs = [r.record for r in ctx.cache.records(op.n, op.k, op.dtype, cfg.threads)
            if r.record.m_lo in samples]
    # the search time of every stored M (kept in the records, so a resumed tune still counts it)
    total = sum(r.seconds for r in recs)
    ctx.store.put("sandwich_tune", op, total_s=total, covers_m=cfg.seq_max, searched_ms=len(recs),
                  trials=sum(r.trials for r in recs), wall_s_this_run=rep.seconds)
    gemm = ctx.cache.gemm(n=op.n, k=op.k, dtype=op.dtype, threads=cfg.threads)
    measure = ctx.measure()
    for m in ctx.ms:
        ctx.step(f"sandwich M={m}")
        if ctx.store.get("sandwich", op, m):
            continue
        sched = gemm.schedule_for(m)
        func = ctx.cache.load_kernel(op.n, op.k, op.dtype, sched.family())
        ctx.store.put("sandwich", op, m, gflops=time_template(measure, sched, m, func),
                      tune_s=total / cfg.seq_max, schedule=sched.key())


def run_dynamic(ctx: Context, name: str) -> None:
    """A DietCode-, Roller- or MikPoly-style tuner over the same micro-kernels as sandwich."""
    from sandwich.bench.baselines.dietcode import DietCode
    from sandwich.bench.baselines.dynamic import Problem
    from sandwich.bench.baselines.mikpoly import MikPoly
    from sandwich.bench.baselines.roller import Roller
    from sandwich.tuner.budget import get_budget
    from sandwich.tuner.space import Isa, micro_kernels

    todo = [m for m in ctx.ms if not ctx.store.get(name, ctx.op, m)]
    if not todo:
        for what in ["offline"] + [f"M={m}" for m in ctx.ms]:
            ctx.step(f"{name} {what}")
        return
    cpu, cfg = ctx.cache.cpu, ctx.cfg
    measure = ctx.measure()
    mks = micro_kernels(Isa(cpu.lanes_f32, cpu.vector_registers), measure.pack_n,
                        widths=get_budget(cfg.budget).mk_widths)
    problem = Problem(ctx.op.n, ctx.op.k, measure.pack_n, cfg.threads, tuple(mks),
                      l1_bytes=cpu.l1d_bytes, l2_bytes=cpu.l2_bytes)
    tuner = {"dietcode": DietCode, "roller": Roller, "mikpoly": MikPoly}[name](problem, measure)
    ctx.step(f"{name} offline")
    tuner.prepare()
    offline = ctx.store.get(f"{name}_offline", ctx.op) or ctx.store.put(
        f"{name}_offline", ctx.op, seconds=tuner.offline_seconds, trials=tuner.offline_trials)
    for m in ctx.ms:
        ctx.step(f"{name} M={m}")
        if m not in todo:
            continue
        c = tuner.choose(m)
        # offline work serves every M in [1, seq_max]: amortised over them, as sandwich's is
        tune_s = offline["seconds"] / cfg.seq_max + c.seconds
        ctx.store.put(name, ctx.op, m, gflops=time_template(measure, c.schedule, m), tune_s=tune_s,
                      trials=c.trials, schedule=c.schedule.key())


def run_metaschedule(ctx: Context) -> None:
    from sandwich.bench.baselines import metaschedule as msb

    settings = msb.MsSettings(trials=ctx.cfg.trials)
    root = ctx.cfg.cache_dir / "metaschedule"
    for m in ctx.ms:
        ctx.step(f"metaschedule M={m}")
        done = ctx.store.get("metaschedule", ctx.op, m)
        if done and done["trials"] >= ctx.cfg.trials:
            continue
        _settle()
        r = msb.tune_and_time(m=m, n=ctx.op.n, k=ctx.op.k, cpu=ctx.cache.cpu,
                              threads=ctx.cfg.threads, work_root=root, settings=settings,
                              timing=TIMING)
        ctx.store.put("metaschedule", ctx.op, m, gflops=r.gflops, tune_s=r.tune_s, trials=r.trials)


def run_vendor(ctx: Context, peers) -> None:
    from sandwich.bench.baselines.measure import measure_peer, random_gemm

    for m in ctx.ms:
        ctx.step(f"vendor M={m}")
        if ctx.store.get("vendor", ctx.op, m):
            continue
        a, w = random_gemm(m, ctx.op.n, ctx.op.k, seed=m)
        vals = {}
        for peer in peers.peers:
            _settle()
            vals[f"{peer.name}_gflops"] = measure_peer(peer, a, w, **TIMING).gflops
            vals[f"{peer.name}_tune_s"] = 0.0
        ctx.store.put("vendor", ctx.op, m, **vals)


def steps_per_op(cfg: CompareConfig, n_ms: int) -> int:
    per = {"metaschedule": n_ms, "dietcode": n_ms + 1, "roller": n_ms + 1, "mikpoly": n_ms + 1,
           "vendor": n_ms}
    return 1 + n_ms + sum(per[b] for b in cfg.baselines)


def run_compare(cfg: CompareConfig, *, cache, step: Callable[[str], None] = lambda _: None,
                log: Callable[[str], None] = print) -> dict:
    """Run every method on every op and sampled M (skipping stored results); returns the JSON."""
    from sandwich.bench.baselines.vendor import make_peers
    from sandwich.models import load_model_config
    from sandwich.payload import make_payload
    from sandwich.tuner.tune import unique_shapes

    mcfg = load_model_config(cfg.model)
    payload = make_payload(mcfg, seq_max=cfg.seq_max)
    shapes = unique_shapes(payload)
    known = {n for names, _ in shapes for n in names}
    if not set(cfg.ops) <= known:
        raise ConfigError(f"unknown --ops {sorted(set(cfg.ops) - known)}; this model has {', '.join(sorted(known))}")
    shapes = [(names, op) for names, op in shapes if set(cfg.ops) & set(names)]
    ms = sample_ms(cfg.shapes, cfg.seq_max)
    store = Store(cfg.cache_dir / "compare" / f"{model_slug(cfg.model)}_t{cfg.threads}.jsonl")
    peers = make_peers(cfg.peers, threads=cfg.threads) if "vendor" in cfg.baselines else None
    for msg in (peers.messages if peers else ()):
        log(msg)
    for names, op in shapes:
        ctx = Context(cfg, names, op, ms, store, cache, step)
        run_sandwich(ctx)
        for b in cfg.baselines:
            if b == "metaschedule":
                run_metaschedule(ctx)
            elif b == "vendor":
                run_vendor(ctx, peers)
            else:
                run_dynamic(ctx, b)
    return result_json(cfg, shapes, ms, store, peer_names=list(peers.names) if peers else [])


def model_slug(model: str) -> str:
    return Path(model).stem if model.endswith(".json") else Path(model).name


def result_json(cfg: CompareConfig, shapes, ms: list[int], store: Store, *, peer_names: list[str]) -> dict:
    """The issue's format: model, threads, trials_per_shape, one row per (op, M)."""
    rows, sandwich_tune = [], {}
    for names, op in shapes:
        st = store.get("sandwich_tune", op)
        sandwich_tune["+".join(names)] = {k: st[k] for k in ("total_s", "covers_m", "searched_ms", "trials")}
        for m in ms:
            row: dict = {"op": "+".join(names), "m": m, "n": op.n, "k": op.k}
            for kind in ("sandwich",) + tuple(b for b in cfg.baselines if b != "vendor"):
                d = store.get(kind, op, m)
                row[f"{kind}_gflops"], row[f"{kind}_tune_s"] = d["gflops"], d["tune_s"]
            if "vendor" in cfg.baselines:
                d = store.get("vendor", op, m)
                row.update({k: v for k, v in d.items() if k.endswith(("_gflops", "_tune_s"))})
            rows.append(row)
    return {"model": model_slug(cfg.model), "threads": cfg.threads, "trials_per_shape": cfg.trials,
            "rows": rows, "methods": ["sandwich"] + [b for b in cfg.baselines if b != "vendor"] + peer_names,
            "seq_max": cfg.seq_max, "budget": cfg.budget, "sandwich_tune": sandwich_tune,
            "tune_s_note": "sandwich, dietcode and mikpoly tune once for every M in [1, seq_max]: "
                           "their tune_s per shape is that time / seq_max (plus the per-M choice); "
                           "metaschedule and roller tune each shape on its own"}


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def summary(res: dict) -> dict:
    """Geomean speed of each method relative to MetaSchedule and to sandwich, and tuning totals."""
    rows, methods = res["rows"], res["methods"]
    out: dict = {}
    for meth in methods:
        if "metaschedule" in methods:
            out[f"{meth}_vs_metaschedule"] = geomean(
                [r[f"{meth}_gflops"] / r["metaschedule_gflops"] for r in rows if r["metaschedule_gflops"]])
        out[f"sandwich_vs_{meth}"] = geomean(
            [r["sandwich_gflops"] / r[f"{meth}_gflops"] for r in rows if r[f"{meth}_gflops"]])
    if "metaschedule" in methods:
        out["metaschedule_tune_s_per_shape"] = geomean([r["metaschedule_tune_s"] for r in rows])
    return out


def write_markdown(res: dict, path: Path, *, command: str, machine: str, date: str) -> None:
    s, methods = res["summary"], res["methods"]
    norm = "metaschedule" if "metaschedule" in methods else "sandwich"
    lines = [f"# sandwich-kernel vs compilers and vendor GEMMs: {res['model']}", "",
             f"Regenerate: `{command}`", "",
             f"- machine: {machine}; {res['threads']} threads for every method, fp32, date {date}",
             f"- MetaSchedule: {res['trials_per_shape']} trials per shape (XGBoost cost model, "
             "evolutionary search); sandwich budget: " + res["budget"],
             "- every kernel checked against numpy, then timed in this process: warm-up, 7 repeats, median",
             f"- tuning seconds: {res['tune_s_note']}"]
    for op, t in res["sandwich_tune"].items():
        lines.append(f"- sandwich tuned {op} once for all M in [1, {t['covers_m']}]: {t['total_s']:.1f} s "
                     f"in total ({t['searched_ms']} M searched, {t['trials']} trials) = "
                     f"{t['total_s'] / t['covers_m']:.3f} s per M covered, or "
                     f"{t['total_s'] / max(1, len({r['m'] for r in res['rows']})):.1f} s per sampled shape")
    lines += [""]
    if norm == "metaschedule":
        lines.append("**Geomean kernel speed relative to MetaSchedule:** " + ", ".join(
            f"{m} {s[f'{m}_vs_metaschedule']:.2f}x" for m in methods))
    lines += ["**Geomean speedup of sandwich over:** " + ", ".join(
        f"{m} {s[f'sandwich_vs_{m}']:.2f}x" for m in methods if m != "sandwich"), "",
        f"## GFLOPS (normalized to {norm} in parentheses)", "",
        "| op | M | N x K | " + " | ".join(methods) + " |", "|---|---:|---|" + "---:|" * len(methods)]
    for r in res["rows"]:
        base = r[f"{norm}_gflops"] or float("nan")
        cells = " | ".join(f"{r[f'{m}_gflops']:.1f} ({r[f'{m}_gflops'] / base:.2f})" for m in methods)
        lines.append(f"| {r['op']} | {r['m']} | {r['n']} x {r['k']} | {cells} |")
    tuned = [m for m in methods if any(r[f"{m}_tune_s"] for r in res["rows"])]
    lines += ["", "## Tuning seconds per shape", "",
              "| op | M | " + " | ".join(tuned) + " |", "|---|---:|" + "---:|" * len(tuned)]
    for r in res["rows"]:
        lines.append(f"| {r['op']} | {r['m']} | " + " | ".join(f"{r[f'{m}_tune_s']:.3g}" for m in tuned) + " |")
    path.write_text("\n".join(lines) + "\n")


def write_png(res: dict, path: Path) -> None:
    """Fig. 8 of the paper: (a) speed normalized to MetaSchedule, (b) tuning time, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods, rows = res["methods"], res["rows"]
    norm = "metaschedule" if "metaschedule" in methods else "sandwich"
    labels = [f"{r['op']}\nM={r['m']}" for r in rows]
    x = np.arange(len(rows))
    width = 0.8 / len(methods)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(rows) * len(methods) / 3), 8))
    for i, m in enumerate(methods):
        ys = [r[f"{m}_gflops"] / r[f"{norm}_gflops"] if r[f"{norm}_gflops"] else 0 for r in rows]
        ax1.bar(x + i * width, ys, width, label=m)
    ax1.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax1.set_ylabel(f"speed / {norm}")
    ax1.set_title(f"(a) normalized kernel performance ({res['model']}, {res['threads']} threads, fp32)")
    tuned = [m for m in methods if any(r[f"{m}_tune_s"] for r in rows)]
    w2 = 0.8 / max(1, len(tuned))
    for i, m in enumerate(tuned):
        ax2.bar(x + i * w2 - 0.4 + w2 / 2, [max(r[f"{m}_tune_s"], 1e-6) for r in rows], w2, label=m)
    ax2.set_yscale("log")
    ax2.set_ylabel("tuning seconds per shape")
    ax2.set_title("(b) tuning time (log scale)")
    ax1.set_xticks(x + 0.4 - width / 2, labels, fontsize=7)
    ax2.set_xticks(x, labels, fontsize=7)
    for ax in (ax1, ax2):
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
