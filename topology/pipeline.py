"""From a fundamental TopoTree to the top-k ServiceConfigs for prefill and for decode."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import networkx as nx

from sandwich.models import ModelConfig
from sandwich.topology.sandwich_config import EarlyStopper, cross_sections, group_key, tp_allowed
from sandwich.topology.search import Explored, group_variants, remove_search
from sandwich.topology.simulator import HardwareMap, SimParams, SimResult, hardware_map, simulate
from sandwich.topology.trace import Trace
from sandwich.topology.tree import check_symmetric, leaf_cpus
from sandwich.types import ServiceConfig


@dataclass(frozen=True)
class Ranked:
    """One service configuration with its simulated latencies and the transforms behind it."""

    config: ServiceConfig
    result: SimResult
    ops: tuple[str, ...]


@dataclass
class SearchStats:
    group_variants: int = 0
    remove_generated: int = 0
    remove_explored: int = 0
    remove_duplicates: int = 0
    remove_pruned: int = 0
    configs_seen: int = 0
    configs_tp_rejected: int = 0
    configs_early_stopped: int = 0
    configs_simulated: int = 0
    latent_groups: int = 0
    seconds: float = 0.0


@dataclass
class Evaluator:
    """Simulates each distinct config once, honouring the TP limits and the early stopping."""

    phase: str
    hw: HardwareMap
    model: ModelConfig
    trace: Trace
    params: SimParams
    stats: SearchStats
    patience: int = 8
    results: dict[ServiceConfig, Ranked] = field(default_factory=dict)
    stopper: EarlyStopper | None = None

    def __post_init__(self) -> None:
        self.stopper = EarlyStopper(self.patience)
        self._skipped: set[ServiceConfig] = set()

    def metric(self, r: SimResult) -> float:
        return r.ttft_s if self.phase == "prefill" else r.tpot_s

    def offer(self, config: ServiceConfig, ops: tuple[str, ...]) -> float:
        """The config's metric in seconds, or inf when it is rejected or skipped."""
        if config in self.results:
            known = self.results[config]
            if len(ops) < len(known.ops):  # name a config by its shortest path from the fundamental tree
                self.results[config] = Ranked(config, known.result, ops)
            return self.metric(known.result)
        if config in self._skipped:
            return float("inf")
        self.stats.configs_seen += 1
        key = group_key(config)
        if not tp_allowed(self.model, config.tp):
            self.stats.configs_tp_rejected += 1
            self._skipped.add(config)
            return float("inf")
        assert self.stopper is not None
        if self.stopper.closed(key):
            self.stats.configs_early_stopped += 1
            self._skipped.add(config)
            return float("inf")
        res = simulate(config, hw=self.hw, model=self.model, trace=self.trace, params=self.params)
        self.stats.configs_simulated += 1
        self.results[config] = Ranked(config, res, ops)
        self.stopper.record(key, self.metric(res))
        return self.metric(res)

    def score_tree(self, tree: nx.DiGraph, ops: tuple[str, ...] = ()) -> float:
        return min(self.offer(c, ops) for c in cross_sections(tree, self.phase))

    def top(self, k: int) -> list[Ranked]:
        return sorted(self.results.values(), key=lambda r: self.metric(r.result))[:k]


def latent_levels(variants: list[Explored], hw: HardwareMap, params: SimParams) -> tuple[list[frozenset[int]], list[Explored]]:
    """The group nodes the parameters take for hardware, as cpu sets, and the variants holding them.

    Only runs of consecutive siblings (t=1) of `params.group_cores` cores qualify: vendors number
    the cores of an L3-tag cluster or a CCX consecutively, strided groups stay placement options,
    and every group size is an equally good guess without the calibrated one (the smallest guess
    would always simulate fastest).
    """
    if not params.latent:
        return [], []
    groups: dict[frozenset[int], None] = {}
    holders = []
    for v in variants:
        found = [frozenset(leaf_cpus(v.tree, g)) for g, d in v.tree.nodes(data=True) if d["kind"] == "group" and d["t"] == 1]
        found = [g for g in found if params.group_cores in (0, len({hw.core_of[c] for c in g}))]
        if found:
            holders.append(v)
            groups.update(dict.fromkeys(found))
    return list(groups), holders


@dataclass(frozen=True)
class SearchResult:
    prefill: list[Ranked]
    decode: list[Ranked]
    stats: SearchStats


def search_service_configs(
    *,
    tree: nx.DiGraph,
    model: ModelConfig,
    trace: Trace,
    params: SimParams,
    top_k: int = 10,
    max_new_levels: int = 1,
    patience: int = 8,
    prune: bool = True,
) -> SearchResult:
    """Prefill keeps every core (group variants only); decode also searches removals.

    Decode candidates are the trees produced by remove plus each remove search's start tree
    (all cores), so removing cores is chosen only when the simulator says it pays.

    Every config is simulated on one map: the fundamental tree plus the latent groups that group
    variants expose (`latent_levels`), so a config pays a latent group whichever tree it came
    from; simulated on its own tree alone, the un-grouped tree would always win (a group node
    only adds a limit). The variants holding latent groups are searched first, so early stopping
    cannot close their (TP, NUMA) groups on the strength of trees blind to those groups.
    """
    t0 = time.perf_counter()
    check_symmetric(tree)
    stats = SearchStats()
    hw = hardware_map(tree)
    variants = group_variants(tree, max_new_levels=max_new_levels)
    stats.group_variants = len(variants)
    groups, holders = latent_levels(variants, hw, params)
    if groups:
        hw = hw.with_groups(groups)
        variants = holders + [v for v in variants if not any(v is h for h in holders)]
    stats.latent_groups = len(groups)
    common = dict(hw=hw, model=model, trace=trace, params=params, stats=stats, patience=patience)
    prefill = Evaluator("prefill", **common)
    decode = Evaluator("decode", **common)
    seen: set[str] = set()
    for v in variants:
        prefill.score_tree(v.tree, v.ops)
    for v in variants:
        decode.score_tree(v.tree, v.ops)

        def score(item: Explored) -> float:
            return decode.score_tree(item.tree, item.ops)

        trees, rs = remove_search(Explored(v.tree, v.ops), score=score if prune else None, seen=seen)
        if not prune:
            for item in trees:
                decode.score_tree(item.tree, item.ops)
        stats.remove_generated += rs.generated
        stats.remove_explored += rs.explored
        stats.remove_duplicates += rs.duplicates
        stats.remove_pruned += rs.pruned
    stats.seconds = time.perf_counter() - t0
    return SearchResult(prefill=prefill.top(top_k), decode=decode.top(top_k), stats=stats)
