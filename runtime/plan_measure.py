"""Measure service configurations on the real engine: one engine per (prefill, decode) pair of
placements, all alive at once, timed in interleaved rounds so every candidate sees the same
machine noise (a paired comparison, not one block after another).

TP = 1 placements share one copy of the packed weights (kernels of every thread count of a
shape pack alike); a TP > 1 placement spawns its ranks once. Each engine pins the process's
threads and resizes TVM's pool when it enters a phase, so before each run its switcher is
told that another engine may have moved them.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sandwich.errors import ConfigError, SandwichError
from sandwich.runtime.engine import Engine, Request, Result
from sandwich.runtime.executor import Executor, whole_prefills
from sandwich.runtime.kv_handoff import KVHandoff
from sandwich.runtime.loader import LlamaModel, check_same_layouts, load_model, model_gemms
from sandwich.runtime.phases import PhasePlan, PhaseSwitcher, process_cpus, unpin_process
from sandwich.runtime.plan import placement
from sandwich.tuner.kernel_cache import KernelCache
from sandwich.types import ServiceConfig


@dataclass
class Samples:
    """Per-round figures of one engine; `ids` lets a caller check the greedy tokens agree."""

    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)
    ids: list[tuple[int, ...]] = field(default_factory=list)

    @staticmethod
    def _spread(xs: list[float]) -> float:
        return (max(xs) - min(xs)) / statistics.median(xs) if xs else float("nan")

    @property
    def ttft(self) -> float:
        return statistics.median(self.ttft_ms) if self.ttft_ms else float("nan")

    @property
    def tpot(self) -> float:
        return statistics.median(self.tpot_ms) if self.tpot_ms else float("nan")

    @property
    def ttft_spread(self) -> float:
        return self._spread(self.ttft_ms)

    @property
    def tpot_spread(self) -> float:
        return self._spread(self.tpot_ms)


@dataclass
class Runner:
    """An engine and what stops it; closing also unpins the process (the engine pinned it)."""

    engine: Engine
    on_close: Callable[[], None] = lambda: None

    @property
    def phases(self) -> PhaseSwitcher:
        return self.engine.phases

    def close(self) -> None:
        try:
            self.on_close()
        finally:
            self.phases.restore()


class RunnerFactory:
    """Builds engines for pairs of placements of one model on one kernel cache."""

    def __init__(self, model: str | Path, cache: KernelCache, *, max_seq: int,
                 max_batch: int = 1, ops: str = "dsl", weights: str = "fp32",
                 kv_dtype: str = "f32") -> None:
        self.model, self.cache, self.max_seq, self.max_batch, self.ops = model, cache, max_seq, max_batch, ops
        self.weights = weights  # the GEMMs' weight format, every layout alike
        self.kv_dtype = kv_dtype  # the KV caches' element type, every layout alike
        self._base: LlamaModel | None = None  # the first TP = 1 load: its weights are shared
        self._cpus = process_cpus()  # an engine built later may find the process pinned

    def _tp1_model(self, pre: int, dec: int) -> LlamaModel:
        if self._base is not None:
            cfg = self._base.config
            g_pre = model_gemms(cfg, self.cache, threads=pre, weights=self.weights)
            g_dec = (model_gemms(cfg, self.cache, threads=dec, weights=self.weights)
                     if dec != pre else None)
            try:
                for g in (g_pre, g_dec):
                    if g is not None:
                        check_same_layouts(self._base.gemms, g)
                return replace(self._base, gemms=g_pre, decode_gemms=g_dec)
            except ConfigError:  # packed differently: this pair gets its own copy
                pass
        model = load_model(self.model, self.cache, threads=pre, decode_threads=dec,
                           weights=self.weights)
        self._base = self._base or model
        return model

    def build(self, prefill: ServiceConfig, decode: ServiceConfig, *, warm_up: bool = True,
              clock: Callable[[], float] | None = None) -> Runner:
        """An engine running prefill on `prefill`'s placement and decode on `decode`'s, with
        the kernels tuned for each one's thread count; warmed up, the process unpinned."""
        p_sets, d_sets = placement(prefill), placement(decode)
        kw = {"clock": clock} if clock else {}
        unpin_process(self._cpus)
        if len(p_sets) == len(d_sets) == 1:
            pre, dec = len(p_sets[0]), len(d_sets[0])
            ex = Executor(self._tp1_model(pre, dec), max_batch=self.max_batch, max_seq=self.max_seq,
                          ops=self.ops, threads=max(pre, dec), kv_dtype=self.kv_dtype)
            phases = PhaseSwitcher(PhasePlan(p_sets[0], pre), PhasePlan(d_sets[0], dec))
            run = Runner(Engine(ex, phases=phases, **kw))
        elif p_sets == d_sets:
            from sandwich.runtime.tp import TPExecutor

            ex = TPExecutor(self.model, self.cache, tp=len(p_sets), max_batch=self.max_batch,
                            max_seq=self.max_seq, ops=self.ops, cpu_sets=p_sets, pin_caller=False,
                            weights=self.weights, kv_dtype=self.kv_dtype)
            rank0 = PhasePlan(p_sets[0], len(p_sets[0]))  # the ranks stay where they were spawned
            run = Runner(Engine(ex, phases=PhaseSwitcher(rank0, rank0), **kw), on_close=ex.close)
        else:
            run = self._split(p_sets, d_sets, kw)
        try:
            if warm_up:
                run.engine.warm_up()
        finally:
            run.phases.restore()
        return run


    def _split(self, p_sets, d_sets, kw: dict) -> Runner:
        """Two process layouts joined by the KV hand-off (a TP change between phases)."""
        from sandwich.runtime.loader import read_config
        from sandwich.runtime.phase_split import PhaseSplitExecutor

        cfg, _ = read_config(self.model)
        handoff = KVHandoff.create(layers=cfg.num_hidden_layers, max_seq=self.max_seq,
                                   kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                                   dtype=self.kv_dtype)
        made: list = []
        try:
            made.append(self._layout(p_sets, max_batch=1, handoff=handoff, role="write"))
            made.append(self._layout(d_sets, max_batch=self.max_batch, handoff=handoff, role="read"))
        except BaseException:
            for ex in made:
                getattr(ex, "close", lambda: None)()
            handoff.close()
            raise
        ex = PhaseSplitExecutor(made[0], made[1], handoff)
        phases = PhaseSwitcher(PhasePlan(p_sets[0], len(p_sets[0])), PhasePlan(d_sets[0], len(d_sets[0])))
        return Runner(Engine(ex, phases=phases, **kw), on_close=ex.close)

    def _layout(self, sets, *, max_batch: int, handoff: KVHandoff, role: str):
        """One side of a split: an in-process executor (TP = 1) or a group of TP ranks."""
        if len(sets) == 1:
            from sandwich.runtime.phase_split import local_handoff

            t = len(sets[0])
            return Executor(self._tp1_model(t, t), max_batch=max_batch, max_seq=self.max_seq,
                            ops=self.ops, threads=t, kv_dtype=self.kv_dtype,
                            **local_handoff(handoff, role))
        from sandwich.runtime.tp import TPExecutor

        return TPExecutor(self.model, self.cache, tp=len(sets), max_batch=max_batch,
                          max_seq=self.max_seq, ops=self.ops, cpu_sets=sets, pin_caller=False,
                          handoff=handoff.spec, handoff_role=role, weights=self.weights,
                          kv_dtype=self.kv_dtype)


def trace_prompt(vocab: int, length: int, seed: int = 0) -> tuple[int, ...]:
    """Token ids for the measurement prompt (timing does not depend on their values)."""
    rng = np.random.default_rng(seed)
    return tuple(int(t) for t in rng.integers(0, vocab, length))


def measure(runners: dict[str, Runner], *, prompt: tuple[int, ...], new_tokens: int, rounds: int,
            on_run: Callable[[], None] = lambda: None) -> dict[str, Samples]:
    """TTFT and TPOT of every engine, round after round, in a new seeded order each round (an
    engine's step can pay for the placement its predecessor left: no engine always follows
    the same one).

    This machine's memory bandwidth drifts by tens of percent within seconds, so the engines
    are timed as close together as they can be: each round prefills the prompt on one engine
    after another (TTFT), then interleaves their decode steps one step at a time, so every
    engine's TPOT in a round comes from the same stretch of time. Before each timed step the
    engine's decode placement is applied untimed (a real engine stays in it between steps).
    Prefix reuse is off meanwhile: every round prefills the same prompt whole.
    """
    keys = list(runners)
    out = {k: Samples() for k in keys}
    try:
        with whole_prefills(*(run.engine.ex for run in runners.values())):
            for r in range(rounds):
                order = random.Random(r).sample(keys, len(keys))
                for key in order:
                    out[key].ttft_ms.append(_result(runners[key], key, prompt, 1).ttft_ms)
                steps: dict[str, list[float]] = {k: [] for k in order}
                done: dict[str, Result] = {}
                for key in order:  # admit: the prefill and the first decode step, untimed
                    run = runners[key]
                    run.phases.invalidate()
                    run.engine.submit(Request(prompt=prompt, max_new_tokens=new_tokens))
                    done.update((key, res) for res in run.engine.step())
                live = [k for k in order if k not in done]
                while live:
                    for key in list(live):
                        run = runners[key]
                        run.phases.invalidate()
                        run.phases.enter("decode")
                        t0 = time.perf_counter()
                        finished = run.engine.step()
                        steps[key].append(time.perf_counter() - t0)
                        if finished:
                            done[key] = finished[0]
                            live.remove(key)
                for key in order:
                    if done[key].error:
                        raise SandwichError(f"measuring {key}: {done[key].error}")
                    out[key].tpot_ms.append(1e3 * statistics.mean(steps[key]) if steps[key] else 0.0)
                    out[key].ids.append(done[key].ids)
                on_run()
    finally:
        if runners:
            next(iter(runners.values())).phases.restore()
    return out


def _result(run: Runner, key: str, prompt: tuple[int, ...], new_tokens: int) -> Result:
    run.phases.invalidate()
    (res,) = run.engine.run([Request(prompt=prompt, max_new_tokens=new_tokens)])
    if res.error:
        raise SandwichError(f"measuring {key}: {res.error}")
    return res
