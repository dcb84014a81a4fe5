"""What chunked and layered prefill share: one prompt at a time is prefilled in parts, each
part in the same forward pass as every running sequence's decode token, so no decode waits
for a whole prompt (002 §2-3)."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

from sandwich.errors import SandwichError
from sandwich.runtime.prefill_work import PrefillWork
from sandwich.runtime.schedule.base import Schedule

if TYPE_CHECKING:
    from sandwich.runtime.engine import Engine, _Seq


class HybridSchedule(Schedule):
    """Holds the prompt in progress: its request, its reserved slot and how far it got."""

    scores_with = "score_rows"  # each part's rows, once through the last layer

    def __init__(self) -> None:
        self._seq: _Seq | None = None
        self._slot = -1
        self._ex = None
        self.pos = 0  # prompt tokens that went through every layer

    @property
    def busy(self) -> bool:
        return self._seq is not None

    def cancel(self, ticket: int) -> bool:
        if self._seq is None or self._seq.ticket != ticket:
            return False
        self._drop()
        return True

    def step(self, engine: Engine) -> None:
        if self._seq is None:
            self._admit(engine)
        work = None if self._seq is None else self.work(engine, self._seq.req.prompt)
        if work is None:  # no prompt in flight: a plain decode step (speculating, when on)
            if engine.running:
                engine.decode()
            return
        decodes = engine.running  # their rows come first in the forward pass
        try:
            row = engine.hybrid(work)
            if work is not None:
                self._score(engine, work, decodes)
        except SandwichError as e:
            if self._seq is not None:
                seq = self._seq
                self._drop()
                engine.fail(seq, f"prefill failed: {e}")
            return
        if work is not None and self.advance(work) and self._seq is not None:
            seq, slot = self._seq, self._slot
            self._seq, self._slot = None, -1
            if seq.req.prompt_logprobs is not None and engine.on_prompt is not None:
                engine.on_prompt(seq.ticket, tuple(seq.prompt_logprobs))
            engine.begin(seq, slot, row)  # type: ignore[arg-type]

    def _score(self, engine: Engine, work: PrefillWork, decodes: int) -> None:
        """Echo with logprobs: once a part has gone through the last layer, each of its rows
        scores the prompt token after it."""
        seq = self._seq
        done = work.layers is None or work.layers[1] == engine.ex.cfg.num_hidden_layers
        if seq is None or seq.req.prompt_logprobs is None or not done:
            return
        prompt = seq.req.prompt
        nxt = prompt[work.start + 1: work.start + len(work.tokens) + 1]
        seq.prompt_logprobs.extend(engine.ex.score_rows(decodes, nxt, seq.req.prompt_logprobs))

    def _admit(self, engine: Engine) -> None:
        """Reserve a slot for the oldest waiting prompt (the engine checked it at submit)."""
        if not engine.waiting or engine.free_slots < 1:
            return
        seq = engine.waiting.popleft()
        scored = seq.req.prompt_logprobs is not None  # every position must go through the model
        try:
            self._slot = engine.ex.reserve(() if scored else seq.req.prompt)
        except SandwichError as e:
            engine.fail(seq, str(e))
            return
        # the prefill starts where the slot's kept positions of this prompt end
        self._seq, self._ex, self.pos = seq, engine.ex, int(engine.ex.kv.lens[self._slot])
        self.started(len(seq.req.prompt))

    def _drop(self) -> None:
        if self._slot >= 0 and self._ex is not None:
            self._ex.release(self._slot)
        self._seq, self._slot = None, -1

    def room(self, engine: Engine) -> int:
        """Prompt tokens that fit one forward pass beside every decode the batch can hold."""
        return max(1, engine.ex.max_tokens - (engine.max_batch - 1))

    def started(self, prompt_len: int) -> None:
        """A new prompt is in progress (a schedule resets its own counters)."""

    @abstractmethod
    def work(self, engine: Engine, prompt: tuple[int, ...]) -> PrefillWork:
        """This iteration's part of the prompt in progress (slot `self.slot`)."""

    @abstractmethod
    def advance(self, work: PrefillWork) -> bool:
        """Account for `work` having run; True once the whole prompt went through every layer."""

    @property
    def slot(self) -> int:
        return self._slot
