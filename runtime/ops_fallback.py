"""NUMPY FALLBACK for the non-GEMM ops (RMSNorm, RoPE, SiLU-mul, attention).

The reference the DSL kernels are checked against (ops='numpy' runs the whole model on it).
The executor calls only the methods below, and `ops_dsl.DslOps` overrides every one. They
write into the executor's preallocated buffers (`out=`); numpy still makes small
temporaries inside (reductions, strided matmuls), which the compiled kernels will not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sandwich.compiler.buffers import aligned_zeros

Segment = tuple[int, int, int]  # (batch slot, first position, token count)


@dataclass(frozen=True)
class HeadNorms:
    """Qwen3's per-head RMSNorm weights of q and k (each (D,)), applied before RoPE."""

    q: np.ndarray
    k: np.ndarray
    eps: float


class NumpyOps:
    """Reference implementations with HF Llama's float32 semantics."""

    kind = "numpy-fallback"

    def __init__(self, *, max_tokens: int, heads: int, head_dim: int, max_seq: int) -> None:
        self._var = aligned_zeros(max_tokens)
        half = head_dim // 2
        self._cs = aligned_zeros((2, max_tokens, 1, half))
        self._rot = aligned_zeros((2, max_tokens * heads * half))
        self._scores = aligned_zeros((heads, max_seq))  # decode (one query) scores

    def bind(self, name: str, *args, **kwargs) -> Callable[[], None]:
        """Op `name` on these arrays as a call without arguments (it reads whatever the arrays
        hold when it runs). Compiled ops wrap their arguments once here; numpy has nothing
        to prepare."""
        return functools.partial(getattr(self, name), *args, **kwargs)

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
        """out = x / sqrt(mean(x^2) + eps) * w, row by row."""
        var = self._var[: x.shape[0]]
        np.multiply(x, x, out=out)
        np.mean(out, axis=1, out=var)
        np.add(var, np.float32(eps), out=var)
        np.sqrt(var, out=var)
        np.divide(x, var[:, None], out=out)
        np.multiply(out, w, out=out)

    def add_rmsnorm(self, x: np.ndarray, r: np.ndarray, w: np.ndarray, eps: float,
                    out: np.ndarray) -> None:
        """x += r (the residual add), then out = rmsnorm(x) * w."""
        np.add(x, r, out=x)
        self.rmsnorm(x, w, eps, out)

    def silu_mul(self, gate_up: np.ndarray, out: np.ndarray) -> None:
        """out = silu(gate) * up for gate_up = [gate | up] along columns."""
        n = out.shape[1]
        gate, up = gate_up[:, :n], gate_up[:, n:]
        np.negative(gate, out=out)
        np.exp(out, out=out)
        np.add(out, np.float32(1.0), out=out)
        np.divide(gate, out, out=out)
        np.multiply(out, up, out=out)

    def head_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> None:
        """In place on x (T, heads, D): each head's vector RMS-normalized and scaled by w (D,),
        Qwen3's q/k norm."""
        var = np.mean(np.square(x), axis=-1, keepdims=True)
        var += np.float32(eps)
        x /= np.sqrt(var)
        x *= w

    def rope(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray,
             cos: np.ndarray, sin: np.ndarray, norms: HeadNorms | None = None) -> None:
        """Rotate-half RoPE in place on q (T, H, D) and k (T, KVH, D), after the heads' RMSNorm
        when the model has one (`norms`)."""
        if norms is not None:
            self.head_norm(q, norms.q, norms.eps)
            self.head_norm(k, norms.k, norms.eps)
        t = q.shape[0]
        c, s = self._cs[0, :t], self._cs[1, :t]
        np.take(cos, positions, axis=0, out=c[:, 0])
        np.take(sin, positions, axis=0, out=s[:, 0])
        for x in (q, k):
            half = x.shape[2] // 2
            x1, x2 = x[..., :half], x[..., half:]
            size = x1.size
            a = self._rot[0, :size].reshape(x1.shape)
            b = self._rot[1, :size].reshape(x1.shape)
            np.multiply(x2, s, out=a)  # x2 s
            np.multiply(x1, s, out=b)  # x1 s
            np.multiply(x1, c, out=x1)
            np.subtract(x1, a, out=x1)  # x1 c - x2 s
            np.multiply(x2, c, out=x2)
            np.add(x2, b, out=x2)  # x2 c + x1 s

    def rope_kv(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray,
                slots: np.ndarray, cos: np.ndarray, sin: np.ndarray, norms: HeadNorms | None,
                k_cache: np.ndarray, v_cache: np.ndarray) -> None:
        """`rope` on q and k, then each token's k and v (T, KVH, D) stored at its position of
        its slot's cache column (caches [max_seq, max_batch, KVH, D], a bf16 one rounded)."""
        self.rope(q, k, positions, cos, sin, norms)
        k_cache[positions, slots] = k
        v_cache[positions, slots] = v

    def bind_decode_attention(self, k_cache: np.ndarray, v_cache: np.ndarray, scale: float,
                              out: np.ndarray) -> Callable:
        """run(q, segments): `attention` of a decode step (one token a segment) on these
        buffers, which a caller binds once and replays (DslOps wraps the kernel's arguments
        once)."""
        return lambda q, segments: self.attention(q, k_cache, v_cache, segments, scale, out)

    def attention(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                  segments: Sequence[Segment], scale: float, out: np.ndarray) -> None:
        """Causal GQA attention of each segment's queries over its slot's cached keys.

        q: (T, H, D); caches: [max_seq, max_batch, KVH, D] (positions already written);
        out: (T, H * D)."""
        heads, d = q.shape[1], q.shape[2]
        kvh = k_cache.shape[2]
        g = heads // kvh
        t0 = 0
        wide = k_cache.dtype != np.float32  # a bf16 cache: read as f32
        for slot, start, n in segments:
            length = start + n
            keys, vals = k_cache[:length, slot], v_cache[:length, slot]
            if wide:
                keys, vals = keys.astype(np.float32), vals.astype(np.float32)
            keys = keys.transpose(1, 2, 0)  # (KVH, D, L)
            vals = vals.transpose(1, 0, 2)  # (KVH, L, D)
            qg = q[t0: t0 + n].reshape(n, kvh, g, d).transpose(1, 2, 0, 3)  # (KVH, g, n, D)
            dst = out[t0: t0 + n].reshape(n, kvh, g, d).transpose(1, 2, 0, 3)
            if n == 1:
                sc = self._scores[:, :length].reshape(kvh, g, 1, length)
                np.matmul(qg, keys[:, None], out=sc)
            else:
                sc = np.matmul(qg, keys[:, None])
                causal = np.arange(length)[None, :] > (start + np.arange(n))[:, None]
                sc[..., causal] = -np.inf
            np.multiply(sc, np.float32(scale), out=sc)
            np.subtract(sc, sc.max(axis=-1, keepdims=True), out=sc)
            np.exp(sc, out=sc)
            np.divide(sc, sc.sum(axis=-1, keepdims=True), out=sc)
            np.matmul(sc, vals[:, None], out=dst)
            t0 += n
