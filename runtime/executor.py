"""The forward pass over permanent max-shape buffers: prefill a prompt, then decode steps.

Every projection and lm_head runs on the tuned GEMMs of the kernel cache; the other ops go
through an `Ops` object: 'dsl' (RMSNorm, RoPE, SiLU-mul, decode and prefill attention
compiled from the DSL) or 'numpy' (the marked fallback). All
activations live in buffers allocated once at (max_tokens, ...) and are used as row
prefixes, so a decode step allocates nothing and every address stays fixed (eLLM).
A forward call takes segments (slot, first position, count): a prefill is one segment of
many tokens, a decode step one segment of one token per running sequence.
For tensor parallelism (runtime/tp.py) the model is one rank's shard (runtime/shard.py) and two
hooks join the ranks: `allreduce` sums the o and down partial outputs before each residual add,
and `gather` assembles the vocabulary-sharded logits.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from sandwich.compiler.buffers import aligned_copy, aligned_zeros
from sandwich.errors import ConfigError, ShapeError
from sandwich.runtime.kv_cache import CapacityError, KVCache
from sandwich.runtime.loader import LlamaModel
from sandwich.runtime.logprobs import TokenLogprob, token_logprob
from sandwich.runtime.moe import MoeFfn
from sandwich.runtime.ops_fallback import HeadNorms, NumpyOps, Segment
from sandwich.runtime.perplexity import next_token_logprobs
from sandwich.runtime.prefill_work import PrefillWork
from sandwich.runtime.rope_tables import cos_sin


def make_ops(kind: str | object, model: LlamaModel, *, max_tokens: int, max_batch: int,
             max_seq: int, threads: int | None = None, kv_dtype: str = "f32"):
    """'numpy' (the marked fallback), 'dsl' (compiled DSL kernels), or an object with the
    methods of NumpyOps (`bind` included). With bf16 weights (the o projection's: its GEMMs
    round activations to bf16) the DSL's prefill attention runs on AMX where the CPU has it."""
    cfg = model.config
    if kind == "numpy":
        return NumpyOps(max_tokens=max_tokens, heads=cfg.num_attention_heads,
                        head_dim=cfg.head_dim, max_seq=max_seq)
    if kind == "dsl":
        from sandwich.runtime.ops_dsl import DslOps

        return DslOps(max_tokens=max_tokens, max_batch=max_batch, heads=cfg.num_attention_heads,
                      kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                      hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, max_seq=max_seq,
                      cpu=model.gemms.lm_head.cache.cpu,
                      threads=threads or len(os.sched_getaffinity(0)), qk_norm=cfg.qk_norm,
                      kv_dtype=kv_dtype, shared_intermediate=cfg.shared_expert_intermediate_size,
                      build_dir=model.gemms.lm_head.cache.ops_dir,
                      attention="bf16" if model.gemms.o.dtype == "bf16" else "f32")
    if isinstance(kind, str):
        raise ConfigError(f"unknown ops kind {kind!r} (choose 'numpy' or 'dsl')")
    return kind


@contextmanager
def whole_prefills(*executors) -> Iterator[None]:
    """Prefix reuse off for a measurement that runs the same prompt again and again, then as
    it was; what the slots kept, before and during, is forgotten: a timed prefill must
    prefill the whole prompt, and a later one must not find the measurement's prompts."""
    kinds = [ex for ex in executors if hasattr(ex, "set_prefix_cache")]
    was = [bool(ex.kv.reuse) for ex in kinds]
    for ex in kinds:
        ex.set_prefix_cache(False)
    try:
        yield
    finally:
        for ex, on in zip(kinds, was, strict=True):
            ex.set_prefix_cache(on)


class Executor:
    """One model, one KV cache, one set of activation buffers."""

    def __init__(self, model: LlamaModel, *, max_batch: int, max_seq: int,
                 max_tokens: int | None = None, ops: str | object = "dsl",
                 threads: int | None = None,
                 allreduce: Callable[[np.ndarray], None] | None = None,
                 gather: Callable[[np.ndarray], np.ndarray] | None = None,
                 kv_hook: Callable[[int, KVCache, Sequence[Segment]], None] | None = None,
                 kv_source: Callable[[KVCache, int, int], None] | None = None,
                 prefix_cache: bool = True, kv_dtype: str = "f32") -> None:
        """`allreduce(x)` sums x in place across TP ranks; `gather(logits)` returns the full
        logits rows from this rank's vocabulary shard (both None: one process). For a KV
        hand-off between process layouts (runtime/kv_handoff.py), `kv_hook(layer, kv,
        segments)` runs as each layer's K/V is written, and `kv_source(kv, slot, n)` fills a
        slot that `adopt` takes. `prefix_cache`: a prompt prefills only what a freed slot
        does not already hold of it (runtime/kv_cache.py); off where K/V is handed off, as
        the hand-off sends what a forward pass writes. `kv_dtype`: the KV cache's element type
        (f32, or bf16: half the bytes a decode step reads of it)."""
        cfg = model.config
        self.allreduce, self.gather = allreduce, gather
        self.kv_hook, self.kv_source = kv_hook, kv_source
        self.model, self.cfg = model, cfg
        self.max_tokens = max(max_tokens or max_seq, max_batch)
        self.kv = KVCache(layers=cfg.num_hidden_layers, max_batch=max_batch, max_seq=max_seq,
                          kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                          reuse=prefix_cache and kv_hook is None and kv_source is None,
                          dtype=kv_dtype)
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_q, self.n_kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
        t = self.max_tokens
        self.buffers: dict[str, np.ndarray] = {
            "x": aligned_zeros((t, h)),  # residual stream
            "h": aligned_zeros((t, h)),  # normed input of a GEMM
            "qkv": aligned_zeros((t, self.n_q + 2 * self.n_kv)),
            # a layer that runs v apart (LayerWeights.v): q|k and v in buffers of their own
            **({"qk": aligned_zeros((t, self.n_q + self.n_kv)), "v": aligned_zeros((t, self.n_kv))}
               if any(w.v is not None for w in model.layers) else {}),
            "attn": aligned_zeros((t, self.n_q)),
            "proj": aligned_zeros((t, h)),  # o / down output before the residual add
            "gate_up": aligned_zeros((t, 2 * cfg.intermediate_size)),
            "act": aligned_zeros((t, cfg.intermediate_size)),
            "last": aligned_zeros((max_batch, h)),  # last token of each segment, before the norm
            "logits": aligned_zeros((max_batch, model.lm_head.n)),  # a vocab shard under TP
            "positions": aligned_zeros(t, np.int64),
            "slots": aligned_zeros(t, np.int64),
            "ids": aligned_zeros(t, np.int64),
        }
        self.cos, self.sin = (aligned_copy(tab) for tab in cos_sin(model.rope, max_seq))
        self.ops = make_ops(ops, model, max_tokens=t, max_batch=max_batch, max_seq=max_seq,
                            threads=threads, kv_dtype=kv_dtype)
        self.scale = float(d) ** -0.5
        self._bound: dict[tuple[bool, int, str, int], Callable[[], object]] = {}  # see _run
        # a plain decode layer's bound calls in order, recorded on its first step (_layer)
        self._programs: dict[tuple[int, int, int], list[Callable[[], object]]] = {}
        self._recording: list[Callable[[], object]] | None = None
        self._segments: Sequence[Segment] = ()  # the running layer's, for a replayed attention
        self._decode = False  # whether the forward pass running is a decode step
        self._residual = 0  # rows of x whose residual add (x += proj) waits for the next norm
        self._gemms = model.gemms
        # MoE layers (runtime/moe.py) and the packed expert bytes they read: in all, and in the
        # latest forward call (a dense model reads none)
        self.moe = (MoeFfn(cfg, max_tokens=t, ops=self.ops, call=self._call,
                           gate_up=self.buffers["gate_up"], act=self.buffers["act"])
                    if cfg.is_moe else None)
        if self.moe is not None:
            self.buffers.update(self.moe.buffers)
        self.expert_bytes = self.last_expert_bytes = 0

    # -- public API ----------------------------------------------------------------------
    def addresses(self) -> dict[str, int]:
        """Data addresses of every permanent buffer (the no-allocation test compares them)."""
        out = {k: v.ctypes.data for k, v in self.buffers.items()}
        out.update({f"kv{i}": t.ctypes.data for i, t in enumerate(self.kv.kv)})
        return out

    def start(self, prompt: Sequence[int]) -> tuple[int, np.ndarray]:
        """Take a batch slot and prefill the prompt (what the slot does not already hold of
        it); returns (slot, last-token logits view)."""
        self.kv.check_prompt(len(prompt))
        slot = self.kv.alloc(prompt)
        try:
            return slot, self.prefill(slot, prompt[int(self.kv.lens[slot]):])
        except BaseException:
            self.kv.free(slot)
            raise

    def release(self, slot: int) -> None:
        self.kv.free(slot)

    def set_prefix_cache(self, on: bool) -> None:
        """Turn prefix reuse on or off (never on where K/V is handed off), forgetting what
        the free slots keep either way."""
        self.kv.reuse = on and self.kv_hook is None and self.kv_source is None
        self.kv.forget()

    def adopt(self, n: int) -> int:
        """Take a slot holding the first n positions of a sequence prefilled by another
        process layout (its KV cache arrives through `kv_source`)."""
        if self.kv_source is None:
            raise ConfigError("this executor has no KV hand-off to adopt a sequence from")
        self.kv.check_prompt(n)
        slot = self.kv.alloc()
        try:
            self.kv_source(self.kv, slot, n)
        except BaseException:
            self.kv.free(slot)
            raise
        return slot

    def prefill(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to a slot in chunks of max_tokens; returns the last token's logits."""
        self.kv.check_room(slot, len(tokens))
        for c0 in range(0, len(tokens), self.max_tokens):
            chunk = tokens[c0: c0 + self.max_tokens]
            logits = self.forward([(slot, int(self.kv.lens[slot]), len(chunk))], chunk)
        return logits[0]

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One new token per slot; returns logits (B, vocab), a view of the permanent buffer."""
        return self.forward(self._decode_segments("decode", slots, tokens), tokens)

    def verify(self, slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> np.ndarray:
        """Speculative decoding's check: each slot's last token and the tokens drafted after
        it, all in one forward pass (a decode step's weight reads, more rows); returns the
        logits of every row, the slots' rows in order (a fresh array). `trim` then drops the
        positions of drafts that were not taken."""
        if len(slots) != len(tokens) or not all(tokens):
            raise ShapeError(f"verify got {len(slots)} slots and {len(tokens)} token lists "
                             f"(each holds at least the slot's last token)")
        segments = []
        for s, t in zip(slots, tokens, strict=True):
            self.kv.check_room(s, len(t))
            segments.append((int(s), int(self.kv.lens[s]), len(t)))
        flat = [int(x) for t in tokens for x in t]
        self.forward(segments, flat, head=False)
        return self._head_rows(0, len(flat))

    def trim(self, slot: int, n: int) -> None:
        """Drop a slot's last n positions (rejected drafts)."""
        self.kv.trim(slot, n)

    def reserve(self, prompt: Sequence[int] = ()) -> int:
        """Take a slot for a prompt that a hybrid schedule prefills over several `iterate`
        calls, from the slot's length on (what it already holds of the prompt)."""
        return self.kv.alloc(prompt)

    def iterate(self, slots: Sequence[int], tokens: Sequence[int],
                work: PrefillWork | None = None) -> np.ndarray:
        """One iteration of a hybrid schedule (chunked or layered prefill): a decode token for
        every slot and, beside them in the same GEMMs, a part of one prompt's prefill.
        Returns logits rows, one per slot, then the prompt's last row once `work` has gone
        through the last layer (a view of the permanent buffer)."""
        segments = self._decode_segments("iterate", slots, tokens)
        if work is None:
            return self.forward(segments, tokens)
        work.check(self.kv, self.cfg.num_hidden_layers, busy=slots)
        return self.forward([*segments, (work.slot, work.start, len(work.tokens))],
                            [*tokens, *work.tokens], span=work.layers)

    def _decode_segments(self, what: str, slots: Sequence[int],
                         tokens: Sequence[int]) -> list[Segment]:
        """One token per slot, checked before anything runs: one segment each."""
        if len(slots) != len(tokens):
            raise ShapeError(f"{what} got {len(slots)} slots and {len(tokens)} tokens")
        for s in slots:
            self.kv.check_room(s, 1)
        return [(int(s), int(self.kv.lens[s]), 1) for s in slots]

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """Log-probability of each of tokens[1:] given the tokens before it, in a fresh slot
        (perplexity). The head runs on every row of each chunk, into a fresh array: this is
        an evaluation path, not the serving one."""
        if len(tokens) < 2:
            raise ShapeError("scoring needs at least two tokens")
        self.kv.check_prompt(len(tokens))
        slot = self.kv.alloc()
        try:
            out = self._scored_prefill(slot, tokens, next_token_logprobs)[1]
        finally:
            self.kv.free(slot)
        return np.concatenate(out)

    def start_scored(self, prompt: Sequence[int], top: int) -> tuple[int, np.ndarray, list[TokenLogprob]]:
        """`start`, and the log-probability of each of prompt[1:] given the tokens before it
        with the `top` likeliest tokens at its step (OpenAI's echo with logprobs): the head
        runs on every prompt row, as `score` does."""
        self.kv.check_prompt(len(prompt))
        slot = self.kv.alloc()
        try:
            row, parts = self._scored_prefill(
                slot, prompt, lambda logits, nxt: [token_logprob(r, t, top) for r, t in zip(logits, nxt, strict=True)])
        except BaseException:
            self.kv.free(slot)
            raise
        return slot, row, [lp for part in parts for lp in part]

    def _scored_prefill(self, slot: int, tokens: Sequence[int], rows: Callable) -> tuple[np.ndarray, list]:
        """Prefill `tokens` into `slot` chunk by chunk, running the head on every row too;
        returns the last token's logits and `rows(logits, next tokens)` of each chunk."""
        self._check_scoring()
        self.kv.check_room(slot, len(tokens))
        out = []
        for c0 in range(0, len(tokens), self.max_tokens):
            chunk = tokens[c0: c0 + self.max_tokens]
            last = self.forward([(slot, int(self.kv.lens[slot]), len(chunk))], chunk)
            nxt = tokens[c0 + 1: c0 + len(chunk) + 1]
            if len(nxt):  # a last chunk of the last token alone scores nothing
                out.append(rows(self._head_rows(0, len(nxt)), nxt))
        return last[0], out  # as `prefill` returns it, so a reply is the same scored or not

    def score_rows(self, first: int, next_tokens: Sequence[int], top: int) -> list[TokenLogprob]:
        """After an `iterate` whose prefill part went through the last layer: each of
        `next_tokens` under the head on the row before it, rows [first, first + len) of that
        forward pass (the decode rows come first); with the `top` likeliest tokens."""
        self._check_scoring()
        if not len(next_tokens):
            return []
        logits = self._head_rows(first, len(next_tokens))
        return [token_logprob(r, t, top) for r, t in zip(logits, next_tokens, strict=True)]

    def _check_scoring(self) -> None:
        if self.gather is not None:
            raise ConfigError("scoring a text needs one process (--tp 1)")

    def _head_rows(self, first: int, n: int) -> np.ndarray:
        """Final norm and lm_head on rows [first, first + n) of the last forward pass's final
        hidden states, into a fresh array (an evaluation path, not the serving one)."""
        b = self.buffers
        rows, h = b["proj"][:n], b["h"][:n]  # the rows moved to the buffers' aligned start
        rows[...] = b["x"][first: first + n]
        self.ops.bind("rmsnorm", rows, self.model.norm, self.cfg.rms_norm_eps, out=h)()
        return self.model.gemms.lm_head(h, self.model.lm_head)

    # -- the forward pass ----------------------------------------------------------------
    def forward(self, segments: Sequence[Segment], tokens: Sequence[int], *,
                span: tuple[int, int] | None = None, head: bool = True) -> np.ndarray:
        """Run every layer on the segments' tokens, write K/V, return the last logits of each
        segment that went through the last layer (head=False: no head, nothing returned; the
        caller runs it on the rows it needs).

        With `span` (first, end) the last segment runs only those decoder layers (layered
        prefill): its hidden states wait in the `carry` buffer between calls, and its length
        counts only once it has passed the last layer."""
        b = self.buffers
        n_tok = sum(n for _, _, n in segments)
        if n_tok != len(tokens) or n_tok > self.max_tokens or len(segments) > self.kv.max_batch:
            raise CapacityError(f"forward of {n_tok} tokens in {len(segments)} segments exceeds "
                                f"max_tokens={self.max_tokens} / max_batch={self.kv.max_batch}")
        ids, pos = b["ids"][:n_tok], b["positions"][:n_tok]
        ids[:] = tokens
        if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
            raise ShapeError(f"token ids must be in [0, {self.cfg.vocab_size}), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        slots = b["slots"][:n_tok]
        t0 = 0
        for slot, start, n in segments:
            pos[t0: t0 + n] = np.arange(start, start + n)
            slots[t0: t0 + n] = slot
            t0 += n
        n_layers = self.cfg.num_hidden_layers
        lo, hi = span or (0, n_layers)
        self.last_expert_bytes = 0
        whole = list(segments) if span is None else list(segments[:-1])  # through every layer
        n_whole = sum(n for _, _, n in whole)
        x = b["x"][:n_tok]
        self._residual = 0  # nothing waits from a forward that raised
        if lo > 0:  # a layered prefill resumes where its previous group left its rows
            x[n_whole:] = self._carry()[: n_tok - n_whole]
            np.take(self.model.embed, ids[:n_whole], axis=0, out=x[:n_whole])
        else:
            np.take(self.model.embed, ids, axis=0, out=x)
        for layer in range(n_layers):
            if lo <= layer < hi:
                self._layer_on(layer, segments, n_tok, pos)
            elif whole:
                self._layer_on(layer, whole, n_whole, pos[:n_whole])
        self._add_residual()
        if hi < n_layers:
            self._carry()[: n_tok - n_whole] = x[n_whole:]
        finished = list(segments) if hi == n_layers else whole
        t0 = 0
        for slot, start, n in finished:  # `whole` leads `segments`: its tokens come first
            self.kv.lens[slot] = start + n
            self.kv.record(slot, start, tokens[t0: t0 + n])
            t0 += n
        return self._head(finished) if head else b["logits"][:0]

    def _layer_on(self, layer: int, segments: Sequence[Segment], n_tok: int, pos: np.ndarray) -> None:
        """One layer; a decode step (one token per sequence) runs decode's kernels when the
        model has its own for decode."""
        self._decode = all(n == 1 for _, _, n in segments)
        self._gemms = (self.model.decode_gemms if self._decode and self.model.decode_gemms
                       else self.model.gemms)
        self._segments = segments
        key = (layer, n_tok, self._residual)
        program = self._programs.get(key) if self._decode else None
        if program is not None:
            for call in program:
                call()
            self._residual = n_tok
            return
        record = self._decode and self._plain(layer) and self._residual in (0, n_tok)
        self._recording = [] if record else None
        try:
            self._layer(layer, segments, n_tok, pos)
            if record:
                self._programs[key] = self._recording
        finally:
            self._recording = None

    def _plain(self, layer: int) -> bool:
        """Whether every step of this layer is a bound call (`_run`, the decode attention):
        no KV hook, all-reduce, MoE or QKV bias between them. A decode step then replays the
        calls its first step recorded: binding and the layer's Python glue took 19 us a layer
        (SmolLM2 int4-g32 on a Zen 3: 0.58 ms of a 4.2 ms token), the replay a tenth of it."""
        w = self.model.layers[layer]
        return (self.kv_hook is None and self.allreduce is None and w.qkv_bias is None
                and (w.moe is None or self.moe is None))

    def _carry(self) -> np.ndarray:
        """The rows of a layered prefill between its layer groups (allocated on first use)."""
        if "carry" not in self.buffers:
            self.buffers["carry"] = aligned_zeros((self.max_tokens, self.cfg.hidden_size))
        return self.buffers["carry"]

    def _layer(self, layer: int, segments: Sequence[Segment], n_tok: int, pos: np.ndarray) -> None:
        b, ops, g = self.buffers, self.ops, self._gemms.at(layer)
        w = self.model.layers[layer]
        eps, d = self.cfg.rms_norm_eps, self.cfg.head_dim
        x, h = b["x"][:n_tok], b["h"][:n_tok]
        run = self._run
        if self._residual == n_tok:  # the previous layer's add, on these rows: with the norm
            self._residual = 0
            run(layer, "add_norm1", n_tok, lambda: ops.bind("add_rmsnorm", x, b["proj"][:n_tok],
                                                            w.input_norm, eps, out=h))
        else:
            self._add_residual()
            run(layer, "norm1", n_tok, lambda: ops.bind("rmsnorm", x, w.input_norm, eps, out=h))
        qk, v = self._qkv(layer, w, g, h, n_tok)
        q = qk[:, : self.n_q].reshape(n_tok, -1, d)
        k = qk[:, self.n_q: self.n_q + self.n_kv].reshape(n_tok, -1, d)
        v = v.reshape(n_tok, -1, d)
        norms = None if w.q_norm is None else HeadNorms(w.q_norm, w.k_norm, eps)
        kc, vc = self.kv.k(layer), self.kv.v(layer)
        slots = b["slots"][:n_tok]  # each token's cache column, as `pos` its row
        run(layer, "rope", n_tok, lambda: ops.bind("rope_kv", q, k, v, pos, slots, self.cos,
                                                   self.sin, norms, kc, vc))
        if self.kv_hook is not None:
            self.kv_hook(layer, self.kv, segments)
        attn, proj = b["attn"][:n_tok], b["proj"][:n_tok]
        if self._decode:  # the same buffers every step: bound once (`_call`), replayed
            att = self._call(layer, "attention", n_tok,
                             lambda: ops.bind_decode_attention(kc, vc, self.scale, attn))
            if self._recording is not None:
                self._recording.append(lambda: att(q, self._segments))
            att(q, segments)
        else:
            ops.attention(q, kc, vc, segments, self.scale, out=attn)
        run(layer, "o", n_tok, lambda: g.o.bind(attn, w.o, proj))
        if self.allreduce is not None:
            self.allreduce(proj)
        run(layer, "norm2", n_tok, lambda: ops.bind("add_rmsnorm", x, proj, w.post_norm, eps,
                                                    out=h))
        if w.moe is not None and self.moe is not None:  # router and top-k experts
            read = self.moe(layer, w.moe, h, proj, g)
            self.expert_bytes += read
            self.last_expert_bytes += read
        else:
            gu, act = b["gate_up"][:n_tok], b["act"][:n_tok]
            run(layer, "gate_up", n_tok, lambda: g.gate_up.bind(h, w.gate_up, gu))
            run(layer, "silu", n_tok, lambda: ops.bind("silu_mul", gu, out=act))
            run(layer, "down", n_tok, lambda: g.down.bind(act, w.down, proj))
        if self.allreduce is not None:
            self.allreduce(proj)
        self._residual = n_tok  # x += proj: the next layer's norm adds it (_add_residual)

    def _add_residual(self) -> None:
        """The last layer's residual add where no norm took it: x[:n] += proj[:n]."""
        n, self._residual = self._residual, 0
        if n:
            np.add(self.buffers["x"][:n], self.buffers["proj"][:n], out=self.buffers["x"][:n])

    def _qkv(self, layer: int, w, g, h: np.ndarray, n_tok: int) -> tuple[np.ndarray, np.ndarray]:
        """The QKV projection of `h`: (rows whose first columns are q then k, v's rows), from
        one fused GEMM, or a q|k GEMM and a v GEMM where the layer runs v apart (its own
        weight format: LayerWeights.v); the biases added (Qwen2)."""
        b, bias = self.buffers, w.qkv_bias
        if w.v is None:
            qkv = b["qkv"][:n_tok]
            self._run(layer, "qkv", n_tok, lambda: g.qkv.bind(h, w.qkv, qkv))
            if bias is not None:
                np.add(qkv, bias, out=qkv)
            return qkv, qkv[:, self.n_q + self.n_kv:]
        n_qk = self.n_q + self.n_kv
        qk, v = b["qk"][:n_tok], b["v"][:n_tok]
        self._run(layer, "qk", n_tok, lambda: g.qk.bind(h, w.qkv, qk))
        self._run(layer, "v", n_tok, lambda: g.v.bind(h, w.v, v))
        if bias is not None:
            np.add(qk, bias[:n_qk], out=qk)
            np.add(v, bias[n_qk:], out=v)
        return qk, v

    def _run(self, layer: int, site: str, n_tok: int, bind: Callable[[], Callable[[], object]]) -> None:
        """Run one op on permanent buffers (`_call`), recorded where a plain decode layer is."""
        call = self._call(layer, site, n_tok, bind)
        if self._recording is not None:
            self._recording.append(call)
        call()

    def _call(self, layer: int, site: str, n_tok: int, bind: Callable[[], Callable]) -> Callable:
        """One op bound on permanent buffers. A decode step repeats the same calls on the same
        buffer prefixes, so for n_tok <= max_batch each is bound once (arguments checked and
        wrapped, which costs more than a one-row kernel) and replayed; a prefill chunk's calls
        are bound afresh."""
        key = (self._decode, layer, site, n_tok)
        call = self._bound.get(key)
        if call is None:
            call = bind()
            if n_tok <= self.kv.max_batch:
                self._bound[key] = call
        return call

    def _head(self, segments: Sequence[Segment]) -> np.ndarray:
        """Final norm and lm_head on the last token of each segment only."""
        b = self.buffers
        s = len(segments)
        if s == 0:  # a layered prefill's inner group with no decodes beside it
            return b["logits"][:0]
        last, normed, logits = b["last"][:s], b["h"][:s], b["logits"][:s]
        t0 = 0
        for i, (_, _, n) in enumerate(segments):
            t0 += n
            last[i] = b["x"][t0 - 1]
        self._run(-1, "norm", s, lambda: self.ops.bind("rmsnorm", last, self.model.norm,
                                                       self.cfg.rms_norm_eps, out=normed))
        self._run(-1, "lm_head", s, lambda: self._gemms.lm_head.bind(normed, self.model.lm_head,
                                                                     logits))
        return logits if self.gather is None else self.gather(logits)
