"""Splitwise (004 §III-IV): prefill and decode on two pools of cores at once. The prompt
pool's process prefills new prompts while this process, the token pool, keeps decoding;
each prompt's K/V cross through shared memory and its sequence joins the decode batch."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from sandwich.errors import SandwichError
from sandwich.runtime.executor import Executor
from sandwich.runtime.loader import load_model
from sandwich.runtime.phases import PhasePlan, PhaseSwitcher
from sandwich.runtime.prompt_pool import PoolError, PromptPool
from sandwich.runtime.schedule.base import Schedule
from sandwich.tuner.kernel_cache import KernelCache

if TYPE_CHECKING:
    from sandwich.runtime.engine import Engine, _Seq

IDLE_WAIT_S = 0.02  # how long an iteration with nothing to decode waits for the prompt pool


class SplitwiseSchedule(Schedule):
    """`splitwise:P,D`: new prompts go to the prompt pool while a decode slot and a hand-off
    sequence are free; finished prefills are adopted between decode steps."""

    def __init__(self, pool: PromptPool, prompt_cores: int, token_cores: int) -> None:
        self.pool = pool
        self.name = f"splitwise:{prompt_cores},{token_cores}"
        self._inflight: dict[int, _Seq | None] = {}  # ticket -> request (None: cancelled)
        self._broken = ""

    @property
    def busy(self) -> bool:
        return bool(self._inflight)

    def cancel(self, ticket: int) -> bool:
        if self._inflight.get(ticket) is None:
            return False
        self._inflight[ticket] = None  # its prefill finishes; the result is dropped
        return True

    def step(self, engine: Engine) -> None:
        self._send(engine)
        if self._inflight:
            self._collect(engine, IDLE_WAIT_S if not engine.running else 0.0)
        if engine.running:
            engine.decode()

    def _send(self, engine: Engine) -> None:
        while (engine.waiting and self.pool.free
               and engine.free_slots > len(self._inflight)):
            seq = engine.waiting.popleft()
            if self._broken:
                engine.fail(seq, self._broken)
                continue
            try:
                self.pool.submit(seq.ticket, seq.req.prompt)
            except PoolError as e:
                self._fail_all(engine, str(e))
                engine.fail(seq, str(e))
                continue
            self._inflight[seq.ticket] = seq

    def _collect(self, engine: Engine, timeout: float) -> None:
        try:
            done = self.pool.poll(timeout)
        except PoolError as e:
            self._fail_all(engine, str(e))
            return
        for p in done:
            seq = self._inflight.pop(p.ticket, None)
            try:
                if seq is None:
                    continue
                if p.error is not None or p.logits is None:
                    engine.fail(seq, f"prefill failed: {p.error}")
                    continue
                self.pool.handoff.index = p.buffer
                try:
                    slot = engine.ex.adopt(len(seq.req.prompt))
                except SandwichError as e:
                    engine.fail(seq, str(e))
                    continue
                engine.begin(seq, slot, p.logits)
            finally:
                self.pool.release(p.buffer)

    def _fail_all(self, engine: Engine, why: str) -> None:
        self._broken = why
        for seq in self._inflight.values():
            if seq is not None:
                engine.fail(seq, why)
        self._inflight.clear()

    def close(self) -> None:
        self.pool.close()


def pool_cpus(cpus: list[int], prompt_cores: int, token_cores: int) -> tuple[list[int], list[int]]:
    """The prompt pool on the first P cores, the token pool on the last D (disjoint)."""
    if prompt_cores < 1 or token_cores < 1 or prompt_cores + token_cores > len(cpus):
        raise SandwichError(f"splitwise:{prompt_cores},{token_cores} needs {prompt_cores} + "
                            f"{token_cores} <= {len(cpus)} cores and both >= 1")
    return cpus[:prompt_cores], cpus[len(cpus) - token_cores:]


def splitwise_engine_parts(model: str | Path, cache: KernelCache, *, cpus: list[int],
                           prompt_cores: int, token_cores: int, max_batch: int, max_seq: int,
                           ops: str = "dsl", weights: str = "fp32", kv_dtype: str = "f32"
                           ) -> tuple[Executor, SplitwiseSchedule, PhaseSwitcher]:
    """The token pool's executor (this process, on its cores), the schedule that owns the
    prompt pool, and the phase plan that pins this process to the token pool's cores. `cpus`
    are the machine's cores in topology order, one PU each (topology/pools.py). Both pools
    read the weights in the format `weights` and keep K/V as `kv_dtype`."""
    pre, tok = pool_cpus(cpus, prompt_cores, token_cores)
    model_w = load_model(model, cache, threads=len(tok), weights=weights)
    cfg = model_w.config
    pool = PromptPool(model, cache.dir, cpus=pre, layers=cfg.num_hidden_layers,
                      kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, max_seq=max_seq,
                      ops=ops, weights=weights, kv_dtype=kv_dtype)
    try:
        ex = Executor(model_w, max_batch=max_batch, max_seq=max_seq, ops=ops, threads=len(tok),
                      kv_source=functools.partial(pool.handoff.read_into, rank=0, tp=1),
                      kv_dtype=kv_dtype)
        plan = PhasePlan(tuple(tok), len(tok))
        phases = PhaseSwitcher(plan, plan)
    except BaseException:
        pool.close()
        raise
    return ex, SplitwiseSchedule(pool, prompt_cores, token_cores), phases
