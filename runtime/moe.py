"""Mixtral-style MoE feed-forward: a router picks top-k SwiGLU experts per token, and each expert
runs its tokens as one group through its own packed gate/up and down GEMMs.

The router is a tuned GEMM like every projection (N = experts is padded to one vector: the
kernel cache runs an N that is not whole vectors on the padded kernel with zero weight
columns), so routing needs no second matmul library. Softmax, top-k and the scatter-add are
numpy on (tokens, experts)-sized arrays. Under tensor parallelism each rank holds every
expert's share of the intermediate columns (runtime/shard.py) and the same router, so all
ranks route alike and the executor's all-reduce after `down` sums the expert outputs too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sandwich.compiler.buffers import aligned_zeros
from sandwich.errors import ConfigError
from sandwich.tuner.kernel_cache import GemmKernel, PackedWeight
from sandwich.weight_formats import format_of

if TYPE_CHECKING:  # the loader imports this module
    from sandwich.runtime.loader import ModelGemms, WeightReader

# the executor's `_run(layer, site, rows, bind)`: binds an op on permanent buffers, replays it
Run = Callable[[int, str, int, Callable[[], Callable[[], object]]], None]


@dataclass(frozen=True)
class ExpertWeights:
    gate_up: PackedWeight  # K=hidden, N=2 inter: [w1 (gate) | w3 (up)]
    down: PackedWeight  # K=inter, N=hidden: w2

    @property
    def nbytes(self) -> int:
        """Packed bytes one use of the expert reads (its zero padding columns included)."""
        return self.gate_up.nbytes + self.down.nbytes


@dataclass(frozen=True)
class MoeWeights:
    router: PackedWeight  # K=hidden, N=experts: block_sparse_moe.gate
    experts: tuple[ExpertWeights, ...]
    top_k: int


def pack_moe(read: WeightReader, prefix: str, *, router: GemmKernel, gate_up: GemmKernel,
             down: GemmKernel, top_k: int, experts: int, cols: slice) -> MoeWeights:
    """Read one layer's router and experts (HF names under `prefix`) and pack each once, in
    the GEMMs' weight format as the dense MLP is (`WeightReader.projection`); `cols` selects
    a TP rank's intermediate columns."""
    p = prefix + "block_sparse_moe."
    fmt = format_of(gate_up.dtype)
    whole = slice(None)
    packed = []
    for e in range(experts):
        x = f"{p}experts.{e}."
        gu = read.projection([(x + "w1.weight", cols), (x + "w3.weight", cols)], fmt)
        packed.append(ExpertWeights(gate_up=gate_up.pack(gu),
                                    down=down.pack(read.projection([(x + "w2.weight", whole)],
                                                                   fmt, cols))))
    return MoeWeights(router=router.pack(read.projection([(p + "gate.weight", whole)], fmt)),
                      experts=tuple(packed), top_k=top_k)


def route(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Mixtral's routing of router logits (tokens, experts): softmax over every expert in
    float32, the top_k most probable, their probabilities renormalized to sum to 1.
    Returns (expert ids, weights), both (tokens, top_k)."""
    if not 1 <= top_k <= logits.shape[1]:
        raise ConfigError(f"top-{top_k} routing over {logits.shape[1]} experts")
    z = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(z, dtype=np.float32)
    probs /= probs.sum(axis=1, keepdims=True)
    ids = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    top = np.take_along_axis(probs, ids, axis=1)
    top /= top.sum(axis=1, keepdims=True)
    return ids, top


class MoeFfn:
    """The MoE feed-forward of every layer on the executor's permanent buffers; counts the
    packed bytes of the experts it runs (each expert with >= 1 token, once per layer call)."""

    def __init__(self, *, experts: int, hidden: int, max_tokens: int, ops, run: Run,
                 gate_up: np.ndarray, act: np.ndarray) -> None:
        """`gate_up` (max_tokens, 2 inter) and `act` (max_tokens, inter) are the executor's
        dense-MLP buffers: one expert's group never has more rows than the forward has."""
        self.ops, self.run = ops, run
        self.gate_up, self.act = gate_up, act
        self.buffers = {
            "moe_logits": aligned_zeros((max_tokens, experts)),
            "moe_in": aligned_zeros((max_tokens, hidden)),  # one expert's gathered rows
            "moe_out": aligned_zeros((max_tokens, hidden)),  # its output rows
        }

    def __call__(self, layer: int, w: MoeWeights, h: np.ndarray, out: np.ndarray,
                 gemms: ModelGemms) -> int:
        """out = sum over each token's top-k experts of weight * down(silu(gate) * up)(h);
        returns the expert bytes read. `gemms` holds router, gate_up and down kernels."""
        n, router = h.shape[0], gemms.router
        if router is None:
            raise ConfigError("an MoE layer needs the router GEMM; load the model's MoE payload")
        logits = self.buffers["moe_logits"][:n]
        self.run(layer, "router", n, lambda: router.bind(h, w.router, logits))
        ids, weights = route(logits, w.top_k)
        flat = ids.ravel()
        order = np.argsort(flat, kind="stable")  # (token, choice) pairs grouped by expert
        counts = np.bincount(flat, minlength=len(w.experts))
        tokens, scales = order // w.top_k, weights.ravel()[order]
        out[...] = 0
        read, start = 0, 0
        for e, c in enumerate(counts.tolist()):
            if c:
                self._expert(layer, e, w.experts[e], h, out, tokens[start: start + c],
                             scales[start: start + c], gemms)
                read += w.experts[e].nbytes
                start += c
        return read

    def _expert(self, layer: int, e: int, ew: ExpertWeights, h: np.ndarray, out: np.ndarray,
                rows: np.ndarray, scales: np.ndarray, gemms: ModelGemms) -> None:
        """One expert on its c tokens: gather, gate_up, SiLU-mul, down, scale, scatter-add
        (each token appears once per expert, so a fancy-indexed add is exact)."""
        c, run = len(rows), self.run
        x, y = self.buffers["moe_in"][:c], self.buffers["moe_out"][:c]
        gu, act = self.gate_up[:c], self.act[:c]
        np.take(h, rows, axis=0, out=x)
        run(layer, f"expert{e}.gate_up", c, lambda: gemms.gate_up.bind(x, ew.gate_up, gu))
        run(layer, "expert.silu", c, lambda: self.ops.bind("silu_mul", gu, out=act))
        run(layer, f"expert{e}.down", c, lambda: gemms.down.bind(act, ew.down, y))
        np.multiply(y, scales[:, None], out=y)
        out[rows] += y
