"""The sandwich-kernel search (Sandwich §3.2, §6): fast start, finetune, sliding window, reuse.

One `SandwichSearch` tunes one GEMM op (fixed N, K) over increasing M. It only sees an
injected `measure(schedule, m)`, so tests drive it with fake timings, and an optional `guide`
(tuner/guide.py, the cost model) that picks which candidates of each round are measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field, replace
from typing import Protocol

from sandwich.tuner.measure import Measure
from sandwich.tuner.space import (
    K_UNIT,
    align,
    cache_blocked_slice,
    clamp,
    polymerizations,
    slice_caps,
    stream_pause_share,
    unrolled_in_prefill,
    useful,
    weight_imbalance,
)
from sandwich.types import ComputeSlice, KernelSchedule, MicroKernel, Polymerization


@dataclass(frozen=True)
class SearchSettings:
    """Knobs of the search; budgets (tuner/budget.py) are presets of these."""

    sigma: int = 16  # sliding window: first sigma Ms try every micro-kernel
    mk_keep: int = 3  # micro-kernels that go on to fast start after one probe each
    finetune_steps: int = 4  # greedy slice growths per polymerization
    min_gain: float = 0.02  # a growth must gain this much to be kept
    reuse_threshold: float = 0.15  # slice within this of the running average counts as stable
    reuse_gain: float = 0.03  # ... and so does a search that beats the last winner by less
    reuse_patience: int = 3  # stable Ms in a row before the schedule is frozen
    reuse_drop: float = 0.08  # a frozen schedule is searched around once it loses this much
    split_k: bool = True
    probe_k: int = 256  # b_k of the probe slice that ranks micro-kernels
    start_k: int = 256  # fast start's first b_k (see SandwichSearch.fast_start)
    confirm_top: int = 3  # the best this many are measured again before one wins
    skinny_m: int = 8  # up to this M only full-panel micro-kernels (mu_n == pack_n) are tried
    skinny_rounds: int = 1  # up to skinny_m, finalists are re-timed in this many interleaved rounds
    skinny_tie: float = 0.03  # median shares this close are a tie, broken by traffic shape
    skinny_cut: float = 0.9  # after two rounds, a finalist never within this share of a round's best is out
    max_seconds_per_m: float | None = None  # past this, candidates count as no gain ...
    min_trials_per_m: int = 0  # ... once this many were measured at the M (long calls need them)
    refine_from: int | None = None  # from this M on, a search refines the last winner
    # from this M on, fp32 searches also time the winner's tile at the slice the caches ask
    # for (space.cache_blocked_slice), and so does a frozen schedule's reuse
    blocked_from: int | None = None
    # a candidate whose bound (tuner/search_bound.py), this much higher, is below the best
    # measured at its M is dropped: Zen 4's int rows reach up to 107% of their MTX bound
    # (the scaling ops overlap the dot products), and a timing can land in fast DRAM
    bound_margin: float = 0.25


def _shares_panels(s: KernelSchedule) -> bool:
    """Whether threads read the same weight panels (split-K or split-M), not panels of their own."""
    return s.polymerization.t_k > 1 or s.polymerization.t_m > 1


@dataclass(frozen=True)
class Trial:
    """One measured candidate, for the per-step log."""

    m: int
    phase: str  # "probe" | "fast_start" | "finetune" | "reuse" | "confirm" | "round" | "blocked"
    schedule: KernelSchedule
    gflops: float


@dataclass(frozen=True)
class MResult:
    """The winner at one M and what finding it cost."""

    m: int
    schedule: KernelSchedule
    gflops: float
    trials: int
    seconds: float
    reused: bool = False
    stable: bool = False  # the previous winner came within reuse_gain of this one


class Guide(Protocol):
    """Ranks a round's candidates before they are measured (tuner/guide.py: the cost model)."""

    def choose(self, schedules: Sequence[KernelSchedule], m: int, n: int, k: int,
               keep: int = 1) -> list[bool]:
        """Which of `schedules` to measure at M x N x K; at least `keep` of them."""
        ...


@dataclass
class SearchState:
    """What carries over from one M to the next (and can be rebuilt from stored results)."""

    history: list[MResult] = field(default_factory=list)
    frozen: KernelSchedule | None = None
    frozen_gflops: float = 0.0  # what the frozen schedule reached when it was frozen


class SandwichSearch:
    """Tunes one (N, K) GEMM for increasing M with an injected measure function."""

    def __init__(self, *, n: int, k: int, pack_n: int, micro_kernels: list[MicroKernel],
                 threads: int, measure: Measure, settings: SearchSettings = SearchSettings(),
                 clock: Callable[[], float] = time.perf_counter, dtype: str = "float32",
                 guide: Guide | None = None,
                 bound: Callable[[KernelSchedule, int], float] | None = None,
                 lanes: int | None = None, batch_tile: MicroKernel | None = None,
                 caches: tuple[int, int] | None = None) -> None:
        self.n, self.k, self.pack_n, self.dtype = n, k, pack_n, dtype
        self.caches = caches  # one core's L1d and L2 bytes: the cache-blocked slice's sizes
        self.batch_tile = batch_tile  # a narrower tile skinny M also tries (space.decode_batch_tile)
        self.lanes = lanes  # f32 lanes a vector: which tiles run fp32 prefill's unrolled loop
        self.all_mks = list(micro_kernels)
        if batch_tile is not None and batch_tile not in self.all_mks:
            self.all_mks.append(batch_tile)
        self.threads = threads
        self.measure = measure
        self.settings = settings
        self.clock = clock
        self.guide = guide
        self.bound = bound  # a candidate's upper bound in GFLOPS (tuner/search_bound.py)
        self.state = SearchState()
        self.trials: list[Trial] = []
        self._seen: dict[tuple[KernelSchedule, int], float] = {}
        self._deadline: float | None = None
        self._first_trial = 0  # index into self.trials where the current M's trials start
        self._pending: list[MResult] = []  # stored winners not replayed yet (see resume)
        self._skipped: set[tuple[KernelSchedule, int]] = set()  # the guide passed them over
        self._pruned: set[tuple[KernelSchedule, int]] = set()  # their bound could not win

    # -- bookkeeping -------------------------------------------------------------------
    def resume(self, results: list[MResult]) -> None:
        """Replay stored winners so the window and reuse state match a fresh run.

        Each is replayed when the search passes its M, not at once: a cache can hold winners
        past an M still to be searched (its first Ms were cleared, or a budget with other M
        samples stored them), and a fresh run would not have seen those yet there."""
        self._pending = sorted(self._pending + list(results), key=lambda r: r.m)

    def _catch_up(self, m: int) -> None:
        """Replay the stored winners below `m`, in order."""
        while self._pending and self._pending[0].m < m:
            self._record(self._pending.pop(0))

    def _record(self, r: MResult) -> None:
        st = self.state
        st.history.append(r)
        if st.frozen is None and self._stable():
            st.frozen, st.frozen_gflops = r.schedule, r.gflops

    def _eval(self, sched: KernelSchedule, m: int, phase: str) -> float:
        key = (sched, m)
        if key not in self._seen and self._time_spent():
            return 0.0  # this M's time is spent: an unmeasured candidate never wins
        if key not in self._seen and self._bounded_out(sched, m):
            return 0.0  # it cannot beat what this M has measured: never built or timed
        if key not in self._seen:
            res = self.measure(sched, m)
            self._seen[key] = res.gflops if res.ok else 0.0
            self.trials.append(Trial(m, phase, sched, self._seen[key]))
        return self._seen[key]

    def _choose(self, scheds: Sequence[KernelSchedule], m: int, keep: int = 1) -> list[bool]:
        """Which candidates of one round to measure: all of them without a guide; with one,
        those it picks, and those already measured (they cost nothing)."""
        if self.guide is None:
            return [True] * len(scheds)
        picked = self.guide.choose(scheds, m, self.n, self.k, keep=keep)
        out = [p or (s, m) in self._seen for s, p in zip(scheds, picked, strict=True)]
        self._skipped.update((s, m) for s, p in zip(scheds, out, strict=True) if not p)
        return out

    def _bounded_out(self, sched: KernelSchedule, m: int) -> bool:
        """Whether the candidate's Roof-Surface bound, `bound_margin` higher, is still below
        the best GFLOPS measured at this M (issue 26: the search drops such candidates)."""
        if self.bound is None:
            return False
        best = max((g for (_, mm), g in self._seen.items() if mm == m), default=0.0)
        if best <= 0 or self.bound(sched, m) * (1 + self.settings.bound_margin) >= best:
            return False
        self._pruned.add((sched, m))
        return True

    @property
    def pruned(self) -> int:
        """Candidates dropped by their bound and never measured."""
        return len(self._pruned - self._seen.keys())

    @property
    def measured(self) -> set[tuple[KernelSchedule, int]]:
        """Every (schedule, M) measured, however often."""
        return set(self._seen)

    @property
    def predicted_only(self) -> int:
        """Candidates the guide ranked out and that were never measured."""
        return len(self._skipped - self._seen.keys())

    def _eval_many(self, scheds: Sequence[KernelSchedule], m: int, phase: str) -> list[float]:
        """`_eval` of each; the new ones measured together where the measure can (`many`:
        RPC workers time a round's candidates on several servers at once)."""
        many = getattr(self.measure, "many", None)
        new = [s for s in dict.fromkeys(scheds)
               if (s, m) not in self._seen and not self._bounded_out(s, m)]
        if many is not None and len(new) > 1 and not self._time_spent():
            for s, res in zip(new, many([(s, m) for s in new]), strict=True):
                self._seen[(s, m)] = res.gflops if res.ok else 0.0
                self.trials.append(Trial(m, phase, s, self._seen[(s, m)]))
        return [self._eval(s, m, phase) for s in scheds]

    def _time_spent(self) -> bool:
        """Past this M's time cap, unless fewer than `min_trials_per_m` candidates were
        measured: a seconds cap alone leaves a 1 s kernel (an lm_head at M = 2048) only
        two or three candidates, too few to move its schedule at all."""
        if self._deadline is None or self.clock() <= self._deadline:
            return False
        return len(self.trials) - self._first_trial >= self.settings.min_trials_per_m

    def _schedule(self, mk: MicroKernel, s: ComputeSlice, pl: Polymerization) -> KernelSchedule:
        return KernelSchedule(mk, s, pl, self.pack_n, dtype=self.dtype)

    # -- the sliding window ------------------------------------------------------------
    def candidates(self, m: int) -> list[MicroKernel]:
        """All micro-kernels until sigma Ms past skinny_m have been searched, then the last
        sigma of those winners' and any taller than their largest M (which no M of the
        window could run). Skinny Ms do not count: their winners stream the weights from
        DRAM, where a tall tile gains nothing, so they ranked no tile for a larger M. Before,
        they did, and the quick budget (sigma 4, Ms 1-4 first) searched Llama-160M's fp32
        GEMMs with 2 x 48 tiles up to M = 2048 (Sapphire Rapids VM: gate_up at M = 512 in 24
        ms, 200 GFLOPS, where a default tune's 9 x 48 tiles ran 270).

        Skinny M streams the weights from DRAM in decode: a micro-kernel narrower than the
        packed panel walks each panel in several passes over K, so each cache line would be
        fetched more than once (measured: 8 instead of 24 GB/s at M=1). Up to `skinny_m`
        only full-panel micro-kernels are tried, and `batch_tile`, where the format converts
        its weights in the tile (space.decode_batch_tile)."""
        window = [r for r in self.state.history if r.m > self.settings.skinny_m]
        window = window[-self.settings.sigma:]
        if len(window) < self.settings.sigma:
            pool = self.all_mks
        else:
            recent = {r.schedule.micro_kernel for r in window}
            judged = max(r.m for r in window)
            pool = [mk for mk in self.all_mks if mk in recent or mk.mu_m > judged]
        fitting = [mk for mk in pool if mk.mu_m <= m]
        if m <= self.settings.skinny_m:
            fitting = [mk for mk in fitting if mk.mu_n == self.pack_n or mk == self.batch_tile] or fitting
        return fitting or [min(pool, key=lambda mk: (mk.mu_m, -mk.mu_n))]

    # -- schedule reuse ----------------------------------------------------------------
    def _stable(self) -> bool:
        """Once the sliding window has filled, freeze when the last `patience` searches
        either found nothing better than the
        previous winner (within reuse_gain), or agree on micro-kernel and polymerization
        with slices within reuse_threshold of their running average.

        Skinny Ms (up to skinny_m) never freeze it: their winners stream the weights from
        DRAM at a rate every larger M exceeds, so the fall-off test (reuse_drop of the GFLOPS
        at freezing) never fired, and the quick budget ran decode's 2 x 48 tile up to M =
        2048 (Llama-160M's qkv and down in fp32, Sapphire Rapids VM)."""
        p = self.settings.reuse_patience
        if len(self.state.history) < self.settings.sigma:
            return False  # skinny Ms are still inside the sliding window: keep searching
        hist = [r for r in self.state.history if not r.reused][-p:]
        if len(hist) < p or any(r.m <= self.settings.skinny_m for r in hist):
            return False
        if all(r.stable for r in hist):
            return True
        if len({(r.schedule.polymerization, r.schedule.micro_kernel) for r in hist}) != 1:
            return False
        for dim in ("b_m", "b_n", "b_k"):
            vals = [getattr(r.schedule.slice, dim) for r in hist]
            avg = sum(vals) / len(vals)
            if any(abs(v - avg) > self.settings.reuse_threshold * avg for v in vals):
                return False
        return True

    def _k_unit(self, m: int) -> int:
        """The step of b_k (and the scale of start_k and probe_k) at `m`: K_UNIT values, or
        twice that for bf16 weights past the skinny Ms. One vdpbf16ps adds two values of K, so
        a bf16 panel of the fp32 b_k runs half the instructions per reload of its accumulators;
        on Zen 4 (o, 2048 x 2048, M = 512 and 2048) b_k 320 reached 433 GFLOPS, 640-1024 reached
        437-443, and fast start's 2% step could not see that from 320. Decode streams its
        weights, where b_k sets the stream's stretch rather than an instruction count: the
        skinny Ms keep fp32's unit (bf16 M = 1 lost 5% at b_k 640 against 320)."""
        wide = self.dtype == "bf16" and m > self.settings.skinny_m
        return K_UNIT * (2 if wide else 1)

    # -- fast start --------------------------------------------------------------------
    def fast_start(self, mk: MicroKernel, m: int, pl: Polymerization,
                   start: ComputeSlice | None = None) -> tuple[ComputeSlice, float]:
        """Grow each dimension by 2^t tiles while it gains (t counts the dimension's gains).
        A growth that does not gain is rolled back and, as TCP does after a loss, the step
        drops to one tile; a second miss in a row stops the dimension. Growth never passes
        the point where a thread of `pl` would be left without work.

        Unlike the paper, b_k starts at `start_k`, not one cache line: this template reloads
        the accumulators from C once per K panel, so a one-line b_k spends most of its time
        on C traffic and every first step looks like a large gain whatever it grows.
        A refine starts from the frozen schedule's slice, and its first step in a dimension
        doubles it: at large M the slice that won at small M can be a doubling short (b_k
        256 -> 512 gained 5-10% on Sheared-LLaMA's lm_head at M = 1024). b_k's first step
        doubles it from start_k too: one more tile of K saves a sixteenth of the reloads,
        below min_gain, where a doubling saves half (o at M = 2048 on Zen 4: b_k 2048 against
        512 ran 1.04x in bf16, 2048 against 256 1.015x in fp32)."""
        caps = slice_caps(m, self.n, self.k, mk, pl)
        unit = self._k_unit(m)
        tiles = (mk.mu_m, mk.mu_n, unit)
        first = align(start, mk) if start else \
            ComputeSlice(mk.mu_m, mk.mu_n, max(unit, self.settings.start_k // K_UNIT * unit))
        cur = list(astuple(clamp(first, caps)))
        best = self._eval(self._schedule(mk, ComputeSlice(*cur), pl), m, "fast_start")
        steps = [max(0, (c // t).bit_length() - 1) if start or d == 2 else 0
                 for d, (c, t) in enumerate(zip(cur, tiles, strict=True))]
        misses = [0, 0, 0]
        cap_list = (caps.b_m, caps.b_n, caps.b_k)
        while any(miss < 2 for miss in misses):
            for d in range(3):
                if misses[d] >= 2:
                    continue
                cand = list(cur)
                cand[d] = min(cur[d] + (2 ** steps[d]) * tiles[d], cap_list[d])
                if cand[d] == cur[d]:
                    misses[d] = 2
                    continue
                grown = self._schedule(mk, ComputeSlice(*cand), pl)
                here = self._schedule(mk, ComputeSlice(*cur), pl)
                g = self._eval(grown, m, "fast_start") if self._choose([here, grown], m)[1] else 0.0
                if g > best * (1 + self.settings.min_gain):
                    cur, best = cand, g
                    steps[d] += 1
                    misses[d] = 0
                else:
                    steps[d] = 0
                    misses[d] += 1
        return ComputeSlice(*cur), best

    # -- finetune ----------------------------------------------------------------------
    def finetune(self, mk: MicroKernel, m: int, start: ComputeSlice,
                 pl: Polymerization) -> tuple[ComputeSlice, float]:
        """Under one polymerization, grow the slice one tile at a time along whichever
        dimension gains most, until none gains."""
        caps = slice_caps(m, self.n, self.k, mk, pl)
        cur = clamp(start, caps)
        best = self._eval(self._schedule(mk, cur, pl), m, "finetune")
        units = {"b_m": mk.mu_m, "b_n": mk.mu_n, "b_k": 4 * self._k_unit(m)}
        for _ in range(self.settings.finetune_steps):
            cands = []
            for dim, unit in units.items():
                grown = min(getattr(cur, dim) + unit, getattr(caps, dim))
                if grown != getattr(cur, dim):
                    cands.append(replace(cur, **{dim: grown}))
            picked = self._choose([self._schedule(mk, c, pl) for c in [cur, *cands]], m)[1:]
            cands = [c for c, p in zip(cands, picked, strict=True) if p]
            options = list(zip(self._eval_many([self._schedule(mk, c, pl) for c in cands], m,
                                               "finetune"), cands, strict=True))
            if not options:
                break
            g, cand = max(options, key=lambda o: o[0])
            if g <= best * (1 + self.settings.min_gain / 2):
                break
            cur, best = cand, g
        return cur, best

    # -- one M -------------------------------------------------------------------------
    def _confirm(self, m: int, best: tuple[float, KernelSchedule]) -> tuple[float, KernelSchedule]:
        """Measure the leaders at this M once more and keep each one's better run.

        A run slowed by another process (a timer tick, a page fault storm) can crown a lucky
        candidate or bury a good one; a second run of the few leaders catches most of that
        for a handful of trials. Skipped when this M's time is spent."""
        top = self._leaders(m)[: self.settings.confirm_top]
        if len(top) < 2 or self._time_spent():
            return best
        scheds = [s for _, s in top]
        self._remeasure(scheds, m, "confirm")
        rerun = [(self._seen[(s, m)], s) for s in scheds]
        return max(rerun + [best], key=lambda t: t[0])

    def _cache_blocked(self, m: int, best: tuple[float, KernelSchedule],
                       mks: Sequence[MicroKernel]) -> tuple[float, KernelSchedule]:
        """`best`, or a cache-blocked slice of one of `mks` (space.cache_blocked_slice, under
        each polymerization that splits M or N) that beats it by min_gain, both timed again
        first so that one lucky run does not decide. fp32 weights, from `blocked_from` on,
        where the search knows the caches; else `best`."""
        if (self.caches is None or self.dtype != "float32" or self.settings.blocked_from is None
                or m < self.settings.blocked_from):
            return best
        l1, l2 = self.caches
        rivals = list(dict.fromkeys(
            self._schedule(mk, cache_blocked_slice(mk, m, self.n, self.k, pl, l1_bytes=l1,
                                                   l2_bytes=l2), pl)
            for mk in mks for pl in polymerizations(self.threads, split_k=False)
            if useful(pl, m, self.n, self.k, mk)))
        rivals = [r for r in rivals if r != best[1]]
        if not rivals:
            return best
        g, rival = max(zip(self._eval_many(rivals, m, "blocked"), rivals, strict=True),
                       key=lambda t: t[0])
        if g <= best[0] * (1 + self.settings.min_gain) or self._time_spent():
            return best
        if (best[1], m) in self._seen:  # else only the rival ran at this M
            self._remeasure([best[1], rival], m, "blocked")
        g, g0 = self._seen[(rival, m)], max(best[0], self._seen.get((best[1], m), 0.0))
        return (g, rival) if g > g0 * (1 + self.settings.min_gain) else (g0, best[1])

    def _remeasure(self, scheds: Sequence[KernelSchedule], m: int, phase: str) -> list[float]:
        """Time already measured candidates again (together where the measure can); each
        keeps its better run, and the new runs are returned."""
        many = getattr(self.measure, "many", None)
        items = [(s, m) for s in scheds]
        results = many(items) if many is not None and len(items) > 1 else [self.measure(*i) for i in items]
        out = []
        for sched, res in zip(scheds, results, strict=True):
            again = res.gflops if res.ok else 0.0
            self.trials.append(Trial(m, phase, sched, again))
            self._seen[(sched, m)] = max(self._seen[(sched, m)], again)
            out.append(again)
        return out

    def _skinny_rounds(self, m: int) -> bool:
        """Skinny M is ranked in rounds (see `_rounds`), and its tallest tile always runs:
        it loads each weight vector once for the most rows, which is what streaming needs,
        yet its probe, one slice timed once, can land in a slow moment and rank it out."""
        return m <= self.settings.skinny_m and self.settings.skinny_rounds > 1

    def _leaders(self, m: int) -> list[tuple[float, KernelSchedule]]:
        """Every schedule that ran at this M, best first."""
        return sorted(((g, s) for (s, mm), g in self._seen.items() if mm == m and g > 0),
                      key=lambda t: -t[0])

    def _rounds(self, m: int, best: tuple[float, KernelSchedule]) -> tuple[float, KernelSchedule]:
        """Rank the finalists at a skinny M by interleaved rounds; the best median share wins,
        and medians within `skinny_tie` of it are a tie that `_traffic_shape` breaks.

        Skinny M streams its weights from DRAM, and a shared machine's DRAM bandwidth can
        swing by half within seconds (this VM: about 33 or 57 GB/s), so two candidates
        timed a few seconds apart are not comparable: one tune crowned a 4-row tile timed at
        42 GB/s over a 6-row tile timed at 35 GB/s, a gap the moments alone explain. Each round
        times every finalist once, back to back, and scores it as a share of that round's
        best; the order flips each round so neither end is favoured, and after two rounds those
        never near a round's best drop out (`_halve`). The finalists are the
        `confirm_top` leaders plus each micro-kernel's best within half of the leader (the
        slow moments here run at about 0.6x), so a tile whose slices all ran in a slow
        moment is still in the final, while probe-only slices far behind are not; so is the
        best schedule whose threads stream panels of their own, for the tie-break."""
        leaders = self._leaders(m)
        leaders = [(g, s) for g, s in leaders if g >= leaders[0][0] / 2]
        finalists = [s for _, s in leaders[: self.settings.confirm_top]]
        for _, s in leaders:
            if s.micro_kernel not in {f.micro_kernel for f in finalists}:
                finalists.append(s)
        own = [s for _, s in leaders if not _shares_panels(s)]
        if own and all(_shares_panels(f) for f in finalists):
            finalists.append(own[0])
        if len(finalists) < 2:
            return best
        shares: dict[KernelSchedule, list[float]] = {s: [] for s in finalists}
        for r in range(self.settings.skinny_rounds):
            if r == 2 and self.settings.skinny_rounds > 3:
                finalists = self._halve(finalists, shares)
            order = finalists if r % 2 == 0 else finalists[::-1]
            runs = dict(zip(order, self._remeasure(order, m, "round"), strict=True))
            top = max(runs.values())
            for s, g in runs.items():
                shares[s].append(g / top if top > 0 else 0.0)
        median = {s: statistics.median(shares[s]) for s in finalists}
        tied = [s for s in finalists if median[s] >= max(median.values()) - self.settings.skinny_tie]
        win = min(tied, key=lambda s: (*self._traffic_shape(s, m), -median[s], -self._seen[(s, m)]))
        return self._seen[(win, m)], win

    def _halve(self, finalists: list[KernelSchedule],
               shares: dict[KernelSchedule, list[float]]) -> list[KernelSchedule]:
        """The finalists that came within `skinny_cut` of a round's best in the first two
        rounds (at least two): a finalist 10% behind twice, each time timed back to back with
        the others in the same DRAM moment, does not win the median, and the rounds were
        half of a decode M's timings (Sheared-LLaMA-1.3B on Zen 3: 770 of 1,685 up to M = 8)."""
        kept = [s for s in finalists if max(shares[s]) >= self.settings.skinny_cut]
        return kept if len(kept) >= 2 else sorted(finalists, key=lambda s: -max(shares[s]))[:2]

    def _traffic_shape(self, s: KernelSchedule, m: int) -> tuple[bool, float, float]:
        """What breaks a tie between skinny-M finalists: first, whether threads share weight
        panels (split-K or split-M), then how long a tail pass stalls the weight stream,
        then how uneven the threads' shares are.

        In a slow-DRAM moment every candidate is capped at the same bandwidth, so a tune
        that runs in one sees ties and crowns noise; in a fast moment one thread alone
        cannot fill the bus, and the shape shows. Measured on Sheared-LLaMA's gate_up at
        M = 1, rounds paired with reads at 55-64 GB/s: each thread streaming its own panels
        reached 104% of the read, split-K with even K halves 89%, split-K with 1152 and 896
        rows 83%; in slow rounds all three were within 5%. On Llama-160M's down at M = 8,
        a 6-row tile with its 2-row tail read from L2 while DRAM idles reached 82-88% of
        the read in fast rounds, two 4-row blocks with the prefetch running 86-94%; in slow
        rounds both 103-105%."""
        return (_shares_panels(s), round(stream_pause_share(s, m), 2),
                round(weight_imbalance(s, self.n, self.k), 2))

    def _default_poly(self, m: int, mk: MicroKernel) -> Polymerization:
        """Fast start runs under the scheme that splits the dimension with the most tiles."""
        if self.n // mk.mu_n >= max(1, m // mk.mu_m):
            return Polymerization(1, self.threads, 1)
        return Polymerization(self.threads, 1, 1)

    def _probe_schedule(self, mk: MicroKernel, m: int) -> KernelSchedule:
        """The one slice that ranks a micro-kernel against the others."""
        pl = self._default_poly(m, mk)
        caps = slice_caps(m, self.n, self.k, mk, pl)
        probe_k = self.settings.probe_k * self._k_unit(m) // K_UNIT
        return self._schedule(mk, clamp(ComputeSlice(4 * mk.mu_m, 4 * mk.mu_n, probe_k), caps), pl)

    def _largest_tile(self, m: int,
                      keep: Callable[[MicroKernel], bool] = lambda mk: True) -> MicroKernel | None:
        """The micro-kernel with the most register reuse (the largest tile) that fits M, of
        those `keep` takes (None where it takes none).

        A refine at large M also takes this one (searched beside the last winner's, or ranked
        against it by a probe where the budget keeps one micro-kernel): a winner is chosen
        on noisy timings, and one crowned in a slow moment used to carry its tile through
        every larger M (Llama-160M's gate_up on Zen 3: a 3 x 24 tile from M = 181 on, at 74%
        of the peak by median where the 4 x 24 tile runs at 83%)."""
        fitting = [mk for mk in self.all_mks if mk.mu_m <= m and keep(mk)] or \
            [mk for mk in self.all_mks if keep(mk)]
        return max(fitting, key=lambda mk: (mk.mu_m * mk.mu_n, mk.mu_n), default=None)

    def _large_tiles(self, m: int) -> list[MicroKernel]:
        """The largest tile, and for fp32 the largest whose prefill loop the kernel unrolls
        (space.unrolled_in_prefill) where that is another: on a Sapphire Rapids VM (2 threads)
        8 x 48 ran Llama-160M's gate_up 3-4% faster than the 9 x 48 tile, the largest, whose
        loop takes one k an iteration, each at its best slice tried."""
        big = self._largest_tile(m)
        if self.lanes is None or self.dtype != "float32" or unrolled_in_prefill(big, self.lanes):
            return [big]
        unrolled = self._largest_tile(m, lambda mk: unrolled_in_prefill(mk, self.lanes))
        return [big] + ([unrolled] if unrolled else [])

    def _rank_micro_kernels(self, mks: list[MicroKernel], m: int) -> list[MicroKernel]:
        """Micro-kernels by their probe, fastest first; those the guide left unmeasured last."""
        probes = [self._probe_schedule(mk, m) for mk in mks]
        picked = self._choose(probes, m, keep=self.settings.mk_keep)
        gflops = iter(self._eval_many([s for s, p in zip(probes, picked, strict=True) if p], m, "probe"))
        score = {mk: next(gflops) if p else -1.0 for mk, p in zip(mks, picked, strict=True)}
        return sorted(mks, key=lambda mk: -score[mk])

    def tune_m(self, m: int) -> MResult:
        """Best schedule at this M: frozen schedule if reuse has kicked in, else the search."""
        self._catch_up(m)
        t0, n0 = self.clock(), len(self.trials)
        self._first_trial = n0
        cap = self.settings.max_seconds_per_m
        self._deadline = None if cap is None else t0 + cap
        frozen = self.state.frozen
        if frozen is not None:
            floor = (1 - self.settings.reuse_drop) * self.state.frozen_gflops
            g = self._eval(frozen, m, "reuse")
            if g < floor:
                # one slow run is not yet a fall-off: on a shared machine a busy moment costs
                # as much (a Sheared-LLaMA tune unfroze lm_head's schedule after one slow run
                # at M = 1024 and searched 310 s for nothing faster); one more timing settles it
                g = max(g, *self._remeasure([frozen], m, "reuse"))
            if g >= floor:
                g, sched = self._cache_blocked(m, (g, frozen), [frozen.micro_kernel])
                if sched != frozen:  # later Ms reuse the faster slice
                    self.state.frozen, self.state.frozen_gflops = sched, g
                res = MResult(m, sched, g, len(self.trials) - n0, self.clock() - t0,
                              reused=sched == frozen)
                self._record(res)
                return res
            # the frozen schedule fell off at this M: refine it (fast start from its slice
            # with its micro-kernel, then finetune), and let reuse re-arm
            self.state.frozen = None
            refine: KernelSchedule | None = frozen
        else:
            refine = None
        hist = self.state.history
        if refine is None and hist and self.settings.refine_from is not None \
                and m >= self.settings.refine_from:
            # large M is compute-bound and a call costs most: the last winner's micro-kernel,
            # its slice as fast start's first point (each dimension's first step a doubling),
            # every polymerization, rather than every micro-kernel probed afresh
            refine = hist[-1].schedule
        prev = self._eval(hist[-1].schedule, m, "reuse") if hist else 0.0
        mks = [refine.micro_kernel] if refine else self.candidates(m)
        if refine is not None:
            mks += [mk for mk in self._large_tiles(m) if mk not in mks]
        if len(mks) > self.settings.mk_keep:
            ranked = self._rank_micro_kernels(mks, m)
            mks = ranked[: self.settings.mk_keep]
            tallest = max(ranked, key=lambda mk: (mk.mu_m, mk.mu_n))
            if self._skinny_rounds(m) and tallest not in mks:
                mks.append(tallest)
        best: tuple[float, KernelSchedule] | None = None
        for mk in mks:
            start, _ = self.fast_start(mk, m, self._default_poly(m, mk),
                                       start=refine.slice if refine else None)
            schemes = [pl for pl in polymerizations(self.threads, split_k=self.settings.split_k)
                       if useful(pl, m, self.n, self.k, mk)] or [Polymerization(1, 1, 1)]
            starts = [self._schedule(mk, clamp(start, slice_caps(m, self.n, self.k, mk, pl)), pl)
                      for pl in schemes]
            # a refine has one micro-kernel, and its polymerizations are what large M turns on:
            # each start is measured whatever the model says (at a 25% share it ranked qkv's
            # split-M start out at M = 1024 on Sheared-LLaMA: 0.70 of the unguided winner)
            keep = len(starts) if refine else 1
            schemes = [pl for pl, p in zip(schemes, self._choose(starts, m, keep=keep), strict=True) if p]
            for pl in schemes:
                s, g = self.finetune(mk, m, start, pl)
                if best is None or g > best[0]:
                    best = (g, self._schedule(mk, s, pl))
        assert best is not None
        if hist and prev >= best[0]:
            best = (prev, hist[-1].schedule)
        best = self._cache_blocked(m, best, mks)
        best = self._rounds(m, best) if self._skinny_rounds(m) else self._confirm(m, best)
        stable = bool(hist) and prev * (1 + self.settings.reuse_gain) >= best[0]
        res = MResult(m, best[1], best[0], len(self.trials) - n0, self.clock() - t0, stable=stable)
        self._record(res)
        return res
