"""RMSNorm, SiLU-mul, RoPE, decode and prefill attention from the DSL kernels
(dsl/kernels/*.sw), compiled for this CPU.

Each kernel is checked against the numpy fallback when it is built (DESIGN: a wrong kernel
is never used). The model dimensions are fixed at build time; M (tokens), B (sequences) and
the attended length stay symbolic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from sandwich.compiler.buffers import aligned_zeros
from sandwich.compiler.target import CpuInfo
from sandwich.errors import BuildError, first_line
from sandwich.runtime.dsl_attention import (
    DecodeAttention,
    PrefillAttention,
    Segment,
    amx_attention,
    head_rows,
    kernel_arg,
)
from sandwich.runtime.kv_cache import kv_dtype
from sandwich.runtime.ops_fallback import HeadNorms, NumpyOps


def _build(kernel, cpu: CpuInfo, threads: int, fixed: dict, tunables: dict | None = None,
           directory: Path | None = None):
    """A shipped kernel (by name) or a kernel object, compiled (kept in `directory`, see
    compiler/build.compile_source); one BuildError line."""
    from sandwich.compiler.lower_build import build_kernel
    from sandwich.dsl.load import load_kernel

    name = kernel if isinstance(kernel, str) else kernel.name
    try:
        kernel = load_kernel(kernel) if isinstance(kernel, str) else kernel
        return build_kernel(kernel, tunables=tunables or {}, fixed=fixed, cpu=cpu,
                            threads=threads, directory=directory)["main"]
    except Exception as e:  # DSL or TVM: the user sees one line naming the kernel
        first = first_line(e)
        raise BuildError(f"DSL kernel {name} failed to build: {first}") from e


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def _follows(b: np.ndarray, a: np.ndarray) -> bool:
    """Whether b's (T, ., D) heads follow a's in each row of one buffer: b starts where a's
    heads end, with a's strides (but one row's first, which numpy sets from each view's own
    width)."""
    first = 1 if a.shape[0] == 1 else 0
    return (b.dtype == a.dtype and b.strides[first:] == a.strides[first:]
            and b.ctypes.data == a.ctypes.data + a.shape[1] * a.shape[2] * a.itemsize)


def leading_heads(q: np.ndarray, k: np.ndarray, width: int = 0) -> np.ndarray | None:
    """The (T, R, D) rows whose first heads are q's (T, H, D) and then k's (T, KVH, D) (the
    fused QKV GEMM's output, v's heads after them): dsl_attention.head_rows of q where k's
    heads follow q's in each row, else None. A one-token q, k (whose first strides numpy
    sets from their own widths) span `width` heads (at least H + KVH): the caller has
    checked that the heads up to there follow k's in the row."""
    t, h, d = q.shape
    if (k.shape[0], k.shape[2]) != (t, d) or not _follows(k, q):
        return None
    rows = head_rows(q, max(width, h + k.shape[1]))
    if rows is None or rows.shape[1] < h + k.shape[1]:
        return None
    return rows


class DslOps(NumpyOps):
    """Compiled kernels for norms, RoPE, SiLU-mul, decode and prefill attention."""

    kind = "dsl"

    def __init__(self, *, max_tokens: int, max_batch: int, heads: int, kv_heads: int,
                 head_dim: int, hidden: int, intermediate: int, max_seq: int, cpu: CpuInfo,
                 threads: int, qk_norm: bool = False, kv_dtype: str = "f32",
                 shared_intermediate: int = 0, build_dir: Path | None = None,
                 attention: str = "f32") -> None:
        """`build_dir`: where the compiled kernels are kept between processes (the kernel
        cache's ops/ directory; None compiles them in this process only). `attention`: bf16
        runs prefill attention's products in bf16 on AMX tiles where the CPU has them (a
        model whose GEMMs round their activations to bf16 anyway), f32 in f32."""
        super().__init__(max_tokens=max_tokens, heads=heads, head_dim=head_dim, max_seq=max_seq)
        self.dims, self.kv_dtype = (heads, kv_heads, head_dim), kv_dtype

        def build(name, fixed, tunables=None):
            return _build(name, cpu, threads, fixed, tunables, build_dir)

        self._rms = build("rmsnorm", {"N": hidden})
        self._add_rms = build("add_rmsnorm", {"N": hidden})
        # RMSNorm with N = head_dim, each head a row: Qwen3's q/k norms
        self._rms_head = build("rmsnorm", {"N": head_dim}) if qk_norm else None
        # SiLU-mul per width: the MLP's (or each expert's), and a shared expert's (Qwen2-MoE)
        self._silu = {n: build("silu_mul", {"N": n}) for n in {intermediate, shared_intermediate} if n}
        self._rope = build("rope", {"H": heads, "KVH": kv_heads, "D": head_dim})
        self._rope_kv = build("rope_kv", {"H": heads, "KVH": kv_heads, "D": head_dim})
        self._decode = DecodeAttention(build, heads=heads,
                                       kv_heads=kv_heads, head_dim=head_dim, max_batch=max_batch,
                                       vlen=cpu.lanes_f32, l2_bytes=cpu.l2_bytes,
                                       n_split=_pow2_at_most(threads, 16), kv_dtype=kv_dtype)
        rows = max(max_tokens, 3)  # the self-check below runs 3 tokens, whatever max_tokens
        self._prefill = PrefillAttention(build,
                                         heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                         max_tokens=rows, max_seq=max_seq, vlen=cpu.lanes_f32,
                                         registers=cpu.vector_registers,
                                         amx=attention == "bf16" and amx_attention(
                                             head_dim=head_dim, amx=cpu.amx),
                                         kv_dtype=kv_dtype)
        self._q = aligned_zeros((rows, heads, head_dim))
        self._k = aligned_zeros((rows, kv_heads, head_dim))
        self._pos = aligned_zeros((rows,), np.int32)
        self._slots = aligned_zeros((rows,), np.int32)
        try:
            self._self_check(hidden)
        except (ValueError, TypeError, RuntimeError) as e:  # a kernel signature changed under us
            raise BuildError(f"DSL kernels rejected the runtime's arguments: "
                             f"{first_line(e)}; update runtime/ops_dsl.py") from e

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
        self._bind_rmsnorm(x, w, eps, out)()

    def add_rmsnorm(self, x: np.ndarray, r: np.ndarray, w: np.ndarray, eps: float,
                    out: np.ndarray) -> None:
        self._bind_add_rmsnorm(x, r, w, eps, out)()

    def silu_mul(self, gate_up: np.ndarray, out: np.ndarray) -> None:
        self._bind_silu_mul(gate_up, out)()

    def rope(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray,
             cos: np.ndarray, sin: np.ndarray, norms: HeadNorms | None = None) -> None:
        self._bind_rope(q, k, positions, cos, sin, norms)()

    def bind(self, name: str, *args, **kwargs) -> Callable[[], None]:
        """Wrapping a kernel argument costs ~3 us, more than a one-row norm: bound calls wrap
        theirs once."""
        binder = getattr(self, f"_bind_{name}", None)
        return binder(*args, **kwargs) if binder else super().bind(name, *args, **kwargs)

    def _bind_rmsnorm(self, x, w, eps, out):
        f, args = self._rms, (x.shape[0], x.shape[1], eps, *map(kernel_arg, (x, w, out)))
        return lambda: f(*args)

    def _bind_add_rmsnorm(self, x, r, w, eps, out):
        f = self._add_rms
        args = (x.shape[0], x.shape[1], eps, *map(kernel_arg, (x, r, w, out)))
        return lambda: f(*args)

    def _bind_silu_mul(self, gate_up, out):
        f = self._silu[out.shape[1]]
        args = (out.shape[0], out.shape[1], kernel_arg(gate_up), kernel_arg(out))
        return lambda: f(*args)

    def rope_kv(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray,
                slots: np.ndarray, cos: np.ndarray, sin: np.ndarray, norms: HeadNorms | None,
                k_cache: np.ndarray, v_cache: np.ndarray) -> None:
        self._bind_rope_kv(q, k, v, positions, slots, cos, sin, norms, k_cache, v_cache)()

    def _bind_rope_kv(self, q, k, v, positions, slots, cos, sin, norms, k_cache, v_cache):
        """Where q, k and v lead the rows of one buffer (the fused QKV GEMM's output) and the
        cache is f32, rope_kv rotates q and k there and stores k and v into the cache. Else
        the RoPE kernel on compact copies (below), then numpy's stores."""
        t = q.shape[0]
        h, kvh, d = self.dims
        rows = (None if norms is not None or not _follows(v, k)
                else leading_heads(q, k, h + 2 * kvh))
        if (rows is None or rows.shape[1] < h + 2 * kvh
                or any(c.dtype != np.float32 for c in (k_cache, v_cache))):
            rope = self._bind_rope(q, k, positions, cos, sin, norms)

            def rope_then_store() -> None:
                rope()
                k_cache[positions, slots] = k
                v_cache[positions, slots] = v

            return rope_then_store
        pos, sl = self._pos[:t], self._slots[:t]
        f = self._rope_kv
        args = (t, rows.shape[1], h, kvh, d, cos.shape[0], *k_cache.shape[:2],
                *map(kernel_arg, (pos, sl, cos, sin, rows, k_cache, v_cache)))

        def call() -> None:
            pos[...] = positions
            sl[...] = slots
            f(*args)

        return call

    def _bind_rope(self, q, k, positions, cos, sin, norms=None):
        """RoPE reads q and k as compact arrays; the fused QKV rows interleave them (glue copies
        in and out around the kernel). Qwen3's head norms run on the compact copies first (the
        RMSNorm kernel at N = head_dim, each head a row)."""
        t = q.shape[0]
        h, kvh, d = self.dims
        qc, kc, pos = self._q[:t], self._k[:t], self._pos[:t]
        f, args = self._rope, (t, h, kvh, d, cos.shape[0], *map(kernel_arg, (pos, cos, sin, qc, kc)))
        norm_q = norm_k = None
        if norms is not None:
            rows_q, rows_k = qc.reshape(t * h, d), kc.reshape(t * kvh, d)
            norm_q = self._bind_head_norm(rows_q, norms.q, norms.eps)
            norm_k = self._bind_head_norm(rows_k, norms.k, norms.eps)

        def call() -> None:
            qc[...] = q
            kc[...] = k
            pos[...] = positions
            if norm_q is not None:
                norm_q()
                norm_k()
            f(*args)
            q[...] = qc
            k[...] = kc

        return call

    def _bind_head_norm(self, rows, w, eps):
        """RMSNorm in place over rows of head_dim."""
        if self._rms_head is None:
            raise BuildError("q/k head norms need DslOps(qk_norm=True)")
        f, args = self._rms_head, (rows.shape[0], rows.shape[1], eps, *map(kernel_arg, (rows, w, rows)))
        return lambda: f(*args)

    def attention(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                  segments: Sequence[Segment], scale: float, out: np.ndarray) -> None:
        if all(n == 1 for _, _, n in segments):
            self._decode(q, k_cache, v_cache, segments, scale, out)
            return
        t0 = 0
        for slot, start, n in segments:  # a prompt chunk, or a decode token beside one
            rows = slice(t0, t0 + n)
            self._prefill(q[rows], k_cache, v_cache, slot, start + n, scale, out[rows])
            t0 += n

    def bind_decode_attention(self, k_cache: np.ndarray, v_cache: np.ndarray, scale: float,
                              out: np.ndarray) -> Callable:
        """The decode kernel bound to these buffers (DecodeAttention.bind): run(q, segments)."""
        return self._decode.bind(k_cache, v_cache, scale, out)

    def _self_check(self, hidden: int) -> None:
        """Run each kernel once against the numpy fallback on random data (3 tokens; a
        2-slot, 9-position KV cache for decode attention; a 3-token chunk after 2 cached
        positions for prefill attention), the caches of the executor's KV type."""
        rng = np.random.default_rng(0)
        ref = NumpyOps(max_tokens=3, heads=self.dims[0], head_dim=self.dims[2], max_seq=9)

        def rand(*shape):
            a = aligned_zeros(shape)
            a[...] = rng.standard_normal(shape, dtype=np.float32)
            return a

        x, w = rand(3, hidden), rand(hidden)
        gate_ups = [rand(3, 2 * n) for n in self._silu]  # every width built
        h, kvh, d = self.dims
        rows = rng.standard_normal((3, h + 2 * kvh, d), dtype=np.float32)  # fused QKV rows
        qk = rows[:, : h + kvh]
        ang = np.arange(8, dtype=np.float32)[:, None] * np.float32(0.1) ** np.arange(d // 2, dtype=np.float32)
        cos, sin = aligned_zeros(ang.shape), aligned_zeros(ang.shape)
        cos[...], sin[...] = np.cos(ang), np.sin(ang)
        pos, slots = np.array([0, 7, 3]), np.array([1, 0, 1])
        norms = HeadNorms(rand(d), rand(d), 1e-6) if self._rms_head is not None else None
        checks = {}
        for ops in (self, ref):
            y, y2, x2 = aligned_zeros(x.shape), aligned_zeros(x.shape), aligned_zeros(x.shape)
            ops.rmsnorm(x, w, 1e-5, out=y)
            x2[...] = x
            ops.add_rmsnorm(x2, x, w, 1e-5, out=y2)  # x2 = 2 x, y2 its norm
            s = [aligned_zeros((3, gu.shape[1] // 2)) for gu in gate_ups]
            for gu, out in zip(gate_ups, s, strict=True):
                ops.silu_mul(gu, out=out)
            r = aligned_zeros(rows.shape)  # rope_kv (or, with Qwen3's norms, rope and numpy)
            r[...] = rows
            cache = aligned_zeros((2, 9, 2, kvh, d), kv_dtype(self.kv_dtype))
            ops.rope_kv(r[:, :h], r[:, h: h + kvh], r[:, h + kvh:], pos, slots, cos, sin, norms,
                        cache[0], cache[1])
            rq, rk = aligned_zeros((3, h, d)), aligned_zeros((3, kvh, d))  # apart: compact rope
            rq[...], rk[...] = qk[:, :h], qk[:, h:]
            ops.rope(rq, rk, pos, cos, sin, norms)
            checks[ops is self] = (y, np.concatenate([x2, y2]), np.concatenate(s, axis=1), r,
                                   cache.astype(np.float32),
                                   np.concatenate([rq, rk], axis=1))
        kv = aligned_zeros((2, 9, 2, kvh, d), kv_dtype(self.kv_dtype))
        kv[...] = rng.standard_normal(kv.shape, dtype=np.float32)
        segs = [(1, 8, 1), (0, 2, 1)][: self._decode.max_batch]
        for ops in (self, ref):
            a = aligned_zeros((len(segs), h * d))
            ops.attention(qk[: len(segs), :h], kv[0], kv[1], segs, 0.125, out=a)
            checks[ops is self] += (a,)
        qkv3 = rand(3, h + 2 * kvh, d)
        pre = aligned_zeros((2, 6, 1, kvh, d), kv_dtype(self.kv_dtype))  # a chunk of 3 after 2 cached positions
        pre[...] = rng.standard_normal(pre.shape, dtype=np.float32)
        pre[:, 2:5, 0] = qkv3[:, h:].reshape(3, 2, kvh, d).transpose(1, 0, 2, 3)
        for ops in (self, ref):
            a = aligned_zeros((3, h * d))
            ops.attention(qkv3[:, :h], pre[0], pre[1], [(0, 2, 3)], 0.125, out=a)
            checks[ops is self] += (a,)
        names = ("rmsnorm", "add_rmsnorm", "silu_mul", "rope_kv on QKV rows",
                 "rope_kv's cache stores", "rope on compact q, k", "decode_attention",
                 "flash_prefill_amx" if self._prefill.amx else "flash_prefill")
        for name, got, want in zip(names, checks[True], checks[False], strict=True):
            # bf16 products (q, k, v and P rounded): about 1e-2 on these values, where a
            # wrong mask or block is off by tenths
            rtol, atol = (3e-2, 3e-2) if name == "flash_prefill_amx" else (1e-4, 1e-5)
            if not np.allclose(got, want, rtol=rtol, atol=atol):
                raise BuildError(f"DSL kernel {name} disagrees with the numpy reference "
                                 f"(max error {float(np.abs(got - want).max()):.3g}); not used")
