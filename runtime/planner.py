"""Sandwich end to end (§3, Fig. 4): the TopoTree search proposes service configurations per
phase, every distinct payload (TP degree x threads per process) gets its own kernels, the real
engine measures each candidate, and the chosen prefill/decode pair is stored as the model's plan.

Each candidate placement is measured for both phases (TTFT ranks prefill candidates, TPOT
decode ones); then the pair runs against every single placement in one interleaved run, so
the plan's gain over "one configuration for both phases" is measured, not assumed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sandwich.errors import ConfigError, SandwichError
from sandwich.gguf_config import is_gguf
from sandwich.models import ModelConfig, load_model_config
from sandwich.payload import make_payload
from sandwich.runtime.plan import (
    Candidate,
    Plan,
    current_stamp,
    describe,
    find_plan,
    placement,
    plan_threads,
    plan_weights,
    save_plan,
    staleness,
    stamp_time,
)
from sandwich.runtime.plan_measure import (
    Runner,
    RunnerFactory,
    Samples,
    measure,
    trace_prompt,
)
from sandwich.topology.tree import tree_hash
from sandwich.tuner.budget import get_budget
from sandwich.tuner.guide import Guides, GuideSettings
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.tuner.shared_tuning import tune_shapes
from sandwich.tuner.tune import unique_shapes
from sandwich.types import ServiceConfig


@dataclass(frozen=True)
class PlanSettings:
    """How hard to plan. top_k follows the paper's early-stop rule of thumb (k = 3)."""

    top_k: int = 3
    seq_max: int = 2048  # prefill kernels cover M in [1, seq_max]
    budget: str = "quick"
    prompt_len: int = 128  # the measurement request: this many prompt tokens ...
    new_tokens: int = 32  # ... then this many greedy tokens
    rounds: int = 7
    calibrate: bool = True  # measure the simulator's per-core rates first
    max_group_levels: int = 1
    patience: int = 8
    measure_share: float | None = None  # the cost model's share of each search round (None: the budget's)
    explore: float = 0.1
    weights: str = "fp32"  # the weight format the plan's kernels read


def machine_tree():
    """This machine's TopoTree (the CPUs this process may use, largest symmetric part)."""
    from sandwich.topology.load import load_tree

    return load_tree(trim_asymmetric=True)


def search_candidates(cfg: ModelConfig, tree, s: PlanSettings, log: Callable[[str], None]):
    """The top-k prefill and top-k decode configurations of the simulated search, each
    placement once (Ranked objects, prefill's first)."""
    import dataclasses

    from sandwich.topology.calibrate import calibrate
    from sandwich.topology.pipeline import search_service_configs
    from sandwich.topology.simulator import SimParams
    from sandwich.topology.trace import synthetic_trace

    params = dataclasses.replace(SimParams(), batch=1)
    if s.calibrate:
        params = calibrate().apply(params, tree=tree)
    res = search_service_configs(tree=tree, model=cfg, trace=synthetic_trace(), params=params,
                                 top_k=s.top_k, max_new_levels=s.max_group_levels,
                                 patience=s.patience)
    log(f"topology search: {res.stats.configs_simulated} configurations simulated; top "
        f"{len(res.prefill)} prefill, top {len(res.decode)} decode")
    seen, out = set(), []
    for r in [*res.prefill, *res.decode]:
        if placement(r.config) not in seen:
            seen.add(placement(r.config))
            out.append(r)
    return out, params


def tune_payloads(cfg: ModelConfig, cache: KernelCache, configs: list[ServiceConfig], *,
                  seq_max: int, budget: str, log: Callable[[str], None], progress: bool,
                  guide: GuideSettings | None = None, weights: str = "fp32") -> None:
    """Every distinct (TP degree, threads per process) gets kernels tuned for it in the
    format `weights`, except a TP degree whose shares of K the format cannot store (it is
    left unmeasured); without `guide`, the cost model takes the budget's share, as
    tune_shapes does."""
    guides = Guides(guide or GuideSettings(measure_share=get_budget(budget).measure_share),
                    cache_dir=cache.dir, fingerprint=cache.fingerprint)
    for tp, threads in plan_threads(cfg, configs):
        try:
            payload = make_payload(cfg, tp=tp, seq_max=seq_max, weights=weights)
        except ConfigError as e:
            log(f"not tuning TP={tp}: {e}")
            continue
        shapes = unique_shapes(payload)
        missing = [(n, op) for n, op in shapes if not cache.records(op.n, op.k, op.dtype, threads)]
        if missing:
            log(f"tuning {len(missing)} GEMM shape(s) for TP={tp} x {threads} thread(s)")
            tune_shapes(missing, seq_max=seq_max, threads=threads, budget=get_budget(budget),
                        cache=cache, progress=progress, guides=guides)


def _weights(model: str, tmp: Path) -> str:
    """The checkpoint to measure on: the model's own, or random weights of its shapes (an
    embedded config has none; timings do not depend on the values)."""
    if is_gguf(model) or Path(model).is_dir():
        return model
    from sandwich.runtime.checkpoint import write_checkpoint

    return str(write_checkpoint(model, tmp / "weights", seed=0))


def _figures(s: Samples) -> dict:
    return {"ttft_ms": round(s.ttft, 3), "tpot_ms": round(s.tpot, 4),
            "ttft_spread": round(s.ttft_spread, 4), "tpot_spread": round(s.tpot_spread, 4),
            "ttft_all": [round(x, 3) for x in s.ttft_ms], "tpot_all": [round(x, 4) for x in s.tpot_ms]}


def choose_pair(cands: list[Candidate]) -> tuple[Candidate, Candidate]:
    """Best measured TTFT for prefill, best measured TPOT for decode."""
    ok = [c for c in cands if not c.runnable]
    if not ok:
        raise SandwichError("no candidate configuration could be measured: "
                            + "; ".join(f"{describe(c.config)}: {c.runnable}" for c in cands))
    return min(ok, key=lambda c: c.ttft_ms), min(ok, key=lambda c: c.tpot_ms)


def make_plan(model: str, cache: KernelCache, settings: PlanSettings = PlanSettings(), *,
              log: Callable[[str], None] = print, progress: bool = True, tree=None) -> Plan:
    """Search, tune, measure, choose, store; returns the stored plan."""
    cfg = load_model_config(model)
    seq_max = min(settings.seq_max, cfg.max_position_embeddings)
    tree = tree if tree is not None else machine_tree()
    ranked, params = search_candidates(cfg, tree, settings, log)
    configs = [r.config for r in ranked]
    tune_payloads(cfg, cache, configs, seq_max=seq_max, budget=settings.budget, log=log,
                  progress=progress, weights=settings.weights,
                  guide=GuideSettings(measure_share=get_budget(settings.budget).share(settings.measure_share),
                                      explore=settings.explore))
    prompt = trace_prompt(cfg.vocab_size, settings.prompt_len)
    with tempfile.TemporaryDirectory(prefix="sandwichc-plan-") as tmp:
        factory = RunnerFactory(_weights(model, Path(tmp)), cache,
                                max_seq=settings.prompt_len + settings.new_tokens,
                                weights=settings.weights)
        runners: dict[str, Runner] = {}
        why: dict[str, str] = {}
        try:
            for c in configs:
                try:
                    runners[describe(c)] = factory.build(c, c)
                except SandwichError as e:
                    why[describe(c)] = str(e)
                    log(f"cannot measure {describe(c)}: {e}")
            log(f"measuring {len(runners)} placement(s) x {settings.rounds} rounds "
                f"({settings.prompt_len}-token prompt, {settings.new_tokens} new tokens)")
            singles = measure(runners, prompt=prompt, new_tokens=settings.new_tokens,
                              rounds=settings.rounds)
            cands = tuple(_candidate(r, singles.get(describe(r.config)), why.get(describe(r.config), ""))
                          for r in ranked)
            pre, dec = choose_pair(list(cands))
            log(f"measuring the pair (prefill {describe(pre.config)}, decode "
                f"{describe(dec.config)}) against every single placement, one run")
            final = _measure_pair(factory, runners, pre, dec, prompt, settings)
            measured = {"pair": _figures(final.pop("pair")),
                        "singles": {k: _figures(v) for k, v in final.items()},
                        "greedy_ids_agree": _agree(singles, final)}
        finally:
            for r in runners.values():
                r.close()
    prefill = ServiceConfig(phase="prefill", processes=pre.config.processes,
                            threads_per_process=pre.config.threads_per_process)
    decode = ServiceConfig(phase="decode", processes=dec.config.processes,
                           threads_per_process=dec.config.threads_per_process)
    plan = Plan(model=cfg.name, stamp=current_stamp(cache, cfg, tree_hash(tree), [prefill, decode],
                                                    settings.weights),
                prefill=prefill, decode=decode, candidates=cands, measured=measured,
                setup={**asdict(settings), "seq_max": seq_max, "machine": tree.graph.get("name", ""),
                       "sim_params": asdict(params)},
                created=stamp_time())
    path = save_plan(cache, cfg, plan)
    log(f"plan: prefill {describe(prefill)}, decode {describe(decode)}; stored in {path}")
    return plan


def _candidate(r, s: Samples | None, why: str) -> Candidate:
    c = Candidate(config=r.config, ops=tuple(r.ops), sim_ttft_ms=r.result.ttft_s * 1e3,
                  sim_tpot_ms=r.result.tpot_s * 1e3, runnable=why)
    if s is None:
        return c
    return replace(c, ttft_ms=s.ttft, tpot_ms=s.tpot, ttft_spread=s.ttft_spread,
                   tpot_spread=s.tpot_spread, ttft_all=tuple(round(x, 3) for x in s.ttft_ms),
                   tpot_all=tuple(round(x, 4) for x in s.tpot_ms))


def _measure_pair(factory: RunnerFactory, runners: dict[str, Runner], pre: Candidate,
                  dec: Candidate, prompt, s: PlanSettings) -> dict[str, Samples]:
    """The pair (key "pair": its own engine, even when both phases share a placement)
    against every single placement, in one interleaved run."""
    pair = factory.build(pre.config, dec.config)
    try:
        return measure({"pair": pair, **runners}, prompt=prompt, new_tokens=s.new_tokens,
                       rounds=s.rounds)
    finally:
        pair.close()


def _agree(*runs: dict[str, Samples]) -> bool:
    """Whether every engine produced the same greedy tokens in every round."""
    return len({x for run in runs for s in run.values() for x in s.ids}) <= 1


# -- using a plan ------------------------------------------------------------------------
def stored_plan(model: str, cache: KernelCache, *, tree=None,
                weights: str = "fp32") -> tuple[Plan | None, str | None, Path]:
    """(plan, why it is stale or None, its path) of the model's plan for the weight format
    `weights`; (None, None, path) when there is none."""
    cfg = load_model_config(model)
    plan, path = find_plan(cache, cfg, weights)
    if plan is None:
        return None, None, path
    tree = tree if tree is not None else machine_tree()
    return plan, staleness(plan, cache, cfg, tree_hash(tree)), path


def settings_of(plan: Plan, **over) -> PlanSettings:
    """The settings a plan was made with (to re-plan alike), with some replaced."""
    names = PlanSettings.__dataclass_fields__
    return PlanSettings(**{k: v for k, v in plan.setup.items() if k in names} | over)


def plan_engine(plan: Plan, model: str, cache: KernelCache, *, max_batch: int, max_seq: int,
                ops: str = "dsl", warm_up: bool = True, clock=None, kv_dtype: str = "f32") -> Runner:
    """An engine that runs the plan: prefill on its configuration and kernels, decode on its,
    in the weight format it was measured with (its KV cache of `kv_dtype`)."""
    factory = RunnerFactory(model, cache, max_seq=max_seq, max_batch=max_batch, ops=ops,
                            weights=plan_weights(plan), kv_dtype=kv_dtype)
    return factory.build(plan.prefill, plan.decode, warm_up=warm_up, clock=clock)
