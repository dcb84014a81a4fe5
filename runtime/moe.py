"""MoE feed-forward (Mixtral, Qwen2-MoE, Qwen3-MoE): a router picks top-k SwiGLU experts per
token, and each expert runs its tokens as one group through its own packed gate/up and down
GEMMs. Qwen2-MoE adds a shared expert that every token runs, scaled by a sigmoid gate whose
weights ride in the router GEMM as one more column.

The router is a tuned GEMM like every projection, its weights fp32 in every format (N = experts
is padded to one vector: the kernel cache runs an N that is not whole vectors on the padded
kernel with zero weight columns), so routing needs no second matmul library. Softmax, top-k
and the scatter-add are numpy on (tokens, experts)-sized arrays. Under tensor parallelism each
rank holds every expert's share of the intermediate columns (runtime/shard.py) and the same
router, so all ranks route alike and the executor's all-reduce after `down` sums the expert
outputs too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from sandwich.compiler.buffers import aligned_zeros
from sandwich.errors import ConfigError
from sandwich.models import ModelConfig
from sandwich.runtime.moe_names import SHARED_EXPERT, SHARED_EXPERT_GATE, moe_names
from sandwich.tuner.kernel_cache import GemmKernel, PackedWeight

if TYPE_CHECKING:  # the loader imports this module
    from sandwich.runtime.loader import ModelGemms, WeightReader

# the executor's `_call(layer, site, rows, bind)`: an op bound once on permanent buffers
Call = Callable[[int, str, int, Callable[[], Callable]], Callable]


@dataclass(frozen=True)
class ExpertWeights:
    gate_up: PackedWeight  # K=hidden, N=2 inter: [w1 (gate) | w3 (up)]
    down: PackedWeight  # K=inter, N=hidden: w2

    @cached_property
    def nbytes(self) -> int:
        """Packed bytes one use of the expert reads (its zero padding columns included)."""
        return self.gate_up.nbytes + self.down.nbytes


@dataclass(frozen=True)
class MoeWeights:
    router: PackedWeight  # K=hidden, N=experts (+ 1: the shared expert's gate)
    experts: tuple[ExpertWeights, ...]
    top_k: int
    normalize: bool = True  # renormalize the top-k probabilities (cfg.norm_topk_prob)
    shared: ExpertWeights | None = None  # Qwen2-MoE's shared expert

    @cached_property
    def gate_ups(self) -> tuple[PackedWeight, ...]:
        """Every expert's gate/up weight, by expert id (what `bind_each` picks from)."""
        return tuple(e.gate_up for e in self.experts)

    @cached_property
    def downs(self) -> tuple[PackedWeight, ...]:
        return tuple(e.down for e in self.experts)


def pack_moe(read: WeightReader, prefix: str, cfg: ModelConfig, gemms: ModelGemms, *,
             cols: slice, shared_cols: slice) -> MoeWeights:
    """Read one layer's router and experts (HF names under `prefix`) and pack each once, in
    the GEMMs' weight format as the dense MLP is (`WeightReader.projection`); `cols` selects
    a TP rank's intermediate columns of each expert, `shared_cols` of the shared expert."""
    names = moe_names(cfg.model_type)
    whole = slice(None)

    def expert(gate: str, up: str, down: str, gate_up_k: GemmKernel, down_k: GemmKernel,
               c: slice) -> ExpertWeights:
        return ExpertWeights(gate_up=read.pack(gate_up_k, [(prefix + gate, c), (prefix + up, c)]),
                             down=read.pack(down_k, [(prefix + down, whole)], c))

    # experts pack independently, in numpy that releases the GIL: one thread per CPU
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        experts = tuple(pool.map(lambda e: expert(*names.expert(e), gemms.gate_up, gemms.down, cols),
                                 range(cfg.num_local_experts)))
    router, shared = [(prefix + names.router, whole)], None
    if cfg.shared_expert_intermediate_size:
        if gemms.shared_gate_up is None or gemms.shared_down is None:
            raise ConfigError(f"{cfg.name}: the shared expert needs its GEMMs; tune the "
                              f"model's payload")
        shared = expert(*SHARED_EXPERT, gemms.shared_gate_up, gemms.shared_down, shared_cols)
        router.append((prefix + SHARED_EXPERT_GATE, whole))
    return MoeWeights(router=read.pack(gemms.router, router), experts=experts,  # fp32: FP32_OPS
                      top_k=cfg.num_experts_per_tok, normalize=cfg.norm_topk_prob, shared=shared)


def route(logits: np.ndarray, top_k: int, normalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Routing of router logits (tokens, experts): softmax over every expert in float32, the
    top_k most probable, their probabilities renormalized to sum to 1 when `normalize`
    (Mixtral always; Qwen's norm_topk_prob). Returns (expert ids, weights), both (tokens, top_k)."""
    if not 1 <= top_k <= logits.shape[1]:
        raise ConfigError(f"top-{top_k} routing over {logits.shape[1]} experts")
    z = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(z, dtype=np.float32)
    probs /= probs.sum(axis=1, keepdims=True)
    ids = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    top = np.take_along_axis(probs, ids, axis=1)
    if normalize:
        top /= top.sum(axis=1, keepdims=True)
    return ids, top


class MoeFfn:
    """The MoE feed-forward of every layer on the executor's permanent buffers; counts the
    packed bytes of the experts it runs (each expert with >= 1 token, once per layer call)."""

    def __init__(self, cfg: ModelConfig, *, max_tokens: int, ops, call: Call,
                 gate_up: np.ndarray, act: np.ndarray) -> None:
        """`gate_up` (max_tokens, 2 inter) and `act` (max_tokens, inter) are the executor's
        dense-MLP buffers: one expert's group never has more rows than the forward has.
        `cfg` is the config this process runs (a TP rank's widths)."""
        self.ops, self.call = ops, call
        self.gate_up, self.act = gate_up, act
        t, h, s = max_tokens, cfg.hidden_size, cfg.shared_expert_intermediate_size
        k, inter = cfg.num_experts_per_tok, cfg.intermediate_size
        self.buffers = {
            "moe_logits": aligned_zeros((t, cfg.router_outputs)),
            "moe_in": aligned_zeros((t, h)),  # one expert's gathered rows
            "moe_out": aligned_zeros((t, h)),  # its output rows
            # one token's k experts, a row each (`_one_token`)
            "moe_k_gate_up": aligned_zeros((k, 2 * inter)),
            "moe_k_act": aligned_zeros((k, inter)),
            "moe_k_out": aligned_zeros((k, h)),
        }
        if s:  # the shared expert runs every row at its own width
            self.buffers.update(moe_shared_gate_up=aligned_zeros((t, 2 * s)),
                                moe_shared_act=aligned_zeros((t, s)))
        # an expert's gate_up, SiLU-mul and down on c rows, bound once per (kernels, c, input
        # buffer) and run on any expert's weights (`_expert`)
        self._expert_calls: dict[tuple, tuple[Callable, Callable, Callable]] = {}

    def __call__(self, layer: int, w: MoeWeights, h: np.ndarray, out: np.ndarray,
                 gemms: ModelGemms) -> int:
        """out = sum over each token's top-k experts of weight * down(silu(gate) * up)(h);
        returns the expert bytes read. `gemms` holds router, gate_up and down kernels."""
        n, router = h.shape[0], gemms.router
        if router is None:
            raise ConfigError("an MoE layer needs the router GEMM; load the model's MoE payload")
        logits = self.buffers["moe_logits"][:n]
        self.run(layer, "router", n, lambda: router.bind(h, w.router, logits))
        ids, weights = route(logits[:, :len(w.experts)], w.top_k, w.normalize)
        if n == 1:
            read = self._one_token(layer, w, h, out, ids[0], weights[0], gemms)
        else:
            read = self._grouped(layer, w, h, out, ids, weights, gemms)
        if w.shared is not None:
            self._shared(layer, w.shared, h, out, logits[:, -1], gemms)
            read += w.shared.nbytes
        return read

    def run(self, layer: int, site: str, rows: int, bind: Callable[[], Callable]) -> None:
        self.call(layer, site, rows, bind)()

    def _one_token(self, layer: int, w: MoeWeights, h: np.ndarray, out: np.ndarray,
                   ids: np.ndarray, scales: np.ndarray, gemms: ModelGemms) -> int:
        """A decode step of one sequence: each of its k experts on the one row, into row i of
        k-row buffers, so the SiLU-mul runs once on all k and the weighted sum is one product.
        The call at row i is bound once and runs whichever expert is chosen there
        (GemmKernel.bind_each): 2 k + 2 calls a layer, where a group per expert takes 5 k."""
        b = self.buffers
        k = len(ids)
        gu, act, y = b["moe_k_gate_up"][:k], b["moe_k_act"][:k], b["moe_k_out"][:k]
        experts = ids.tolist()
        for i, e in enumerate(experts):
            self.call(layer, f"expert.gate_up@{i}", 1,
                      lambda i=i: gemms.gate_up.bind_each(h, w.gate_ups, gu[i: i + 1]))(e)
        self.run(layer, "expert.silu@k", 1, lambda: self.ops.bind("silu_mul", gu, out=act))
        for i, e in enumerate(experts):
            self.call(layer, f"expert.down@{i}", 1,
                      lambda i=i: gemms.down.bind_each(act[i: i + 1], w.downs, y[i: i + 1]))(e)
        np.einsum("k,kh->h", scales, y, out=out[0])  # numpy's own loop: no BLAS threads
        return sum(w.experts[e].nbytes for e in experts)

    def _grouped(self, layer: int, w: MoeWeights, h: np.ndarray, out: np.ndarray,
                 ids: np.ndarray, weights: np.ndarray, gemms: ModelGemms) -> int:
        """Several tokens: each chosen expert once, on the group of its tokens."""
        flat = ids.ravel()
        order = np.argsort(flat, kind="stable")  # (token, choice) pairs grouped by expert
        counts = np.bincount(flat, minlength=len(w.experts))
        tokens, scales = order // w.top_k, weights.ravel()[order]
        out[...] = 0
        read, start = 0, 0
        for e in np.flatnonzero(counts).tolist():
            c = int(counts[e])
            self._expert(w.experts[e], h, out, tokens[start: start + c], scales[start: start + c],
                         gemms)
            read += w.experts[e].nbytes
            start += c
        return read

    def _shared(self, layer: int, ws: ExpertWeights, h: np.ndarray, out: np.ndarray,
                gate_logit: np.ndarray, gemms: ModelGemms) -> None:
        """Qwen2-MoE's shared expert on every row, scaled by sigmoid of its gate logit."""
        n, run, b = h.shape[0], self.run, self.buffers
        gu, act, y = b["moe_shared_gate_up"][:n], b["moe_shared_act"][:n], b["moe_out"][:n]
        run(layer, "shared.gate_up", n, lambda: gemms.shared_gate_up.bind(h, ws.gate_up, gu))
        run(layer, "shared.silu", n, lambda: self.ops.bind("silu_mul", gu, out=act))
        run(layer, "shared.down", n, lambda: gemms.shared_down.bind(act, ws.down, y))
        y *= (1.0 / (1.0 + np.exp(-gate_logit)))[:, None]
        out += y

    def _expert(self, ew: ExpertWeights, h: np.ndarray, out: np.ndarray, rows: np.ndarray,
                scales: np.ndarray, gemms: ModelGemms) -> None:
        """One expert on its c tokens: gather, gate_up, SiLU-mul, down, scale, scatter-add
        (each token appears once per expert, so a fancy-indexed add is exact). An expert
        every row chose (each of one sequence's decode step) reads h and adds in place."""
        c = len(rows)
        every = c == h.shape[0]  # then rows are 0..c-1 in order
        x = h if every else self.buffers["moe_in"][:c]
        y, gu, act = self.buffers["moe_out"][:c], self.gate_up[:c], self.act[:c]
        if not every:
            np.take(h, rows, axis=0, out=x)
        # binding checks and wraps every buffer, ~25 us a GEMM (a prefill of 128 tokens runs
        # ~80 experts a layer); the bound calls only swap in the expert's weights
        key = (id(gemms.gate_up), id(gemms.down), c, x.ctypes.data)
        calls = self._expert_calls.get(key)
        if calls is None:
            calls = self._expert_calls[key] = (gemms.gate_up.bind_any(x, gu, ew.gate_up),
                                               self.ops.bind("silu_mul", gu, out=act),
                                               gemms.down.bind_any(act, y, ew.down))
        gate_up, silu, down = calls
        gate_up(ew.gate_up)
        silu()
        down(ew.down)
        np.multiply(y, scales[:, None], out=y)
        if every:
            out += y
        else:
            out[rows] += y
