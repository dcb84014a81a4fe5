"""Decode attention from the DSL kernel (dsl/kernels/decode_attention.sw) over the permanent
KV cache: one call per layer and decode step for the whole ragged batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

from sandwich.compiler.buffers import aligned_zeros
from sandwich.compiler.gemm_runner import wrap
from sandwich.errors import BuildError, ShapeError

Segment = tuple[int, int, int]
BF16 = np.dtype(ml_dtypes.bfloat16)


def kernel_arg(x: np.ndarray):
    """Zero-copy argument; TVM's kernels assume 64-byte aligned, compact buffers and do not
    check it (a misaligned numpy array faults in aligned vector loads), so we do. A bf16
    array (ml_dtypes) goes as its 16-bit words, viewed as TVM's bfloat16 (DLPack has no
    ml_dtypes type)."""
    if x.ctypes.data % 64 or not x.flags.c_contiguous:
        raise ShapeError(f"DSL kernel argument of shape {x.shape} must be C-contiguous and "
                         f"64-byte aligned (allocate it with aligned_zeros)")
    if x.dtype == BF16:
        return wrap(x.view(np.uint16))._create_view(x.shape, "bfloat16")
    return wrap(x)


def retyped(kernel, types: dict[str, str]):
    """The kernel with the element type of its array parameters `types` changed (e.g. a bf16
    KV cache): the DSL loads any float type into f32 arithmetic, so the body is the same."""
    params = tuple(dataclasses.replace(p, dtype=types[p.name]) if p.name in types else p
                   for p in kernel.params)
    return dataclasses.replace(kernel, params=params)


B_KV_MIN, B_KV_MAX = 16, 64  # of the kernel's b_kv domain: the floor is the old fixed choice


def _row_lanes(head_dim: int, vlen: int) -> int:
    """Lanes of a head row a register tile takes: two vectors where D allows, else one, else
    the widest power-of-two part of a vector that divides D (the kernels require D % n_d == 0:
    D = 24 on 16 AVX-512 lanes takes 8)."""
    lanes = 2 * vlen
    while lanes > 1 and head_dim % lanes:
        lanes //= 2
    return lanes


def decode_tiling(*, kv_heads: int, head_dim: int, vlen: int, max_batch: int,
                  l2_bytes: int) -> dict[str, int]:
    """decode_attention's n_d and b_kv for a model's shape and the CPU.

    n_d: two vectors of lanes per head row where D allows, so a score's dot product and a P V
    row run as two FMA chains per query head, not one: with one (n_d = vlen) a head's 16 FMAs
    of D = 128 waited on each other's latency. b_kv: the largest block whose K and V copies for
    a full batch (f32, as the kernel copies them) fill at most half of L2, and never below the
    16 it was: each block rescales every head's running output once (online softmax), a cost
    that more positions a block share.
    Measured on Zen 3 (AVX2), 2 threads, one sequence at 512 positions, the caches of every
    layer rotated, the candidates built side by side and timed in interleaved rounds: MHA 16 x
    128 (Sheared-LLaMA) 404 -> 351 us a call, GQA 9/3 x 64 (SmolLM2) 42.9 -> 35.6, GQA 32/8 x
    128 307 -> 259; n_d = 4 vlen was no faster than 2 vlen for MHA and slower for GQA."""
    n_d = _row_lanes(head_dim, vlen)
    copy_per_position = 2 * max_batch * kv_heads * head_dim * 4
    b_kv = B_KV_MIN
    while b_kv * 2 <= B_KV_MAX and 2 * b_kv * copy_per_position <= l2_bytes // 2:
        b_kv *= 2
    return {"n_d": n_d, "b_kv": b_kv}


class DecodeAttention:
    """Split-KV decode attention for one token per sequence; buffers sized for max_batch."""

    def __init__(self, build, *, heads: int, kv_heads: int, head_dim: int, max_batch: int,
                 vlen: int, l2_bytes: int, n_split: int = 2, kv_dtype: str = "f32") -> None:
        """`build(kernel, fixed, tunables)` compiles; `l2_bytes`: one core's L2, which sizes
        the blocks (decode_tiling); `kv_dtype`: the cache's element type (f32, or bf16: the
        kernel widens each K/V row as it copies the block)."""
        from sandwich.dsl.interp import Interpreter
        from sandwich.dsl.load import load_kernel

        self.dims, self.max_batch = (heads, kv_heads, head_dim), max_batch
        tunables = {"n_split": n_split, **decode_tiling(kv_heads=kv_heads, head_dim=head_dim,
                                                         vlen=vlen, max_batch=max_batch,
                                                         l2_bytes=l2_bytes)}
        fixed = {"H": heads, "KVH": kv_heads, "D": head_dim}
        kernel = load_kernel("decode_attention")
        if kv_dtype != "f32":
            kernel = retyped(kernel, {"k_cache": kv_dtype, "v_cache": kv_dtype})
        self._f = build(kernel, fixed, tunables)
        # the scratch shape is whatever the kernel source declares, evaluated at max_batch
        work = next((p for p in kernel.params if p.name == "work"), None)
        if work is None:
            raise BuildError("DSL kernel decode_attention has no 'work' parameter; update "
                             "runtime/dsl_attention.py to its signature")
        env = {**tunables, **fixed, "vlen": vlen, "B": 1}
        per_b = int(np.prod([Interpreter(env).expr(d) for d in work.shape]))
        self._work_shape = lambda b: tuple(Interpreter({**env, "B": b}).expr(d) for d in work.shape)
        self._work = aligned_zeros(per_b * max_batch)
        self._q = aligned_zeros((max_batch, heads, head_dim))
        self._slots = aligned_zeros(max_batch, np.int32)
        self._lens = aligned_zeros(max_batch, np.int32)
        # every argument lives in a permanent buffer, so the wrapped arguments of a (batch
        # size, layer's cache, output) are built once (`bind`): wrapping them costs as much as
        # a short-context kernel
        self._args: dict[tuple, Callable] = {}

    def __call__(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                 segments: Sequence[Segment], scale: float, out: np.ndarray) -> None:
        """q: (B, H, D) (may be strided rows of the fused QKV buffer); out: (B, H * D)."""
        key = (len(segments), scale, k_cache.ctypes.data, v_cache.ctypes.data, k_cache.shape,
               out.ctypes.data)
        run = self._args.get(key)
        if run is None:
            run = self._args[key] = self.bind(k_cache, v_cache, scale, out)
        run(q, segments)

    def bind(self, k_cache: np.ndarray, v_cache: np.ndarray, scale: float,
             out: np.ndarray) -> Callable[[np.ndarray, Sequence[Segment]], None]:
        """run(q, segments) for one batch of out.shape[0] sequences over these buffers, its
        arguments wrapped once: a caller that keeps them (the executor's decode steps) skips
        even the lookup above, whose three pointer reads cost more than a short context's
        kernel (1.7 us each)."""
        b = out.shape[0]
        h, kvh, d = self.dims
        qc, slots, lens = self._q[:b], self._slots[:b], self._lens[:b]
        shape = self._work_shape(b)
        work = self._work[: int(np.prod(shape))].reshape(shape)
        max_seq, max_batch = k_cache.shape[0], k_cache.shape[1]
        f, args = self._f, (b, h, kvh, d, max_seq, max_batch, scale,
                            *map(kernel_arg, (qc, k_cache, v_cache, slots, lens,
                                              out.reshape(b, h, d), work)))

        def run(q: np.ndarray, segments: Sequence[Segment]) -> None:
            if len(segments) != b:
                raise ShapeError(f"decode attention bound for {b} sequences got {len(segments)}")
            qc[...] = q  # the fused QKV rows interleave q, k and v: the kernel wants q compact
            for i, (slot, start, _) in enumerate(segments):
                slots[i], lens[i] = slot, start + 1
            f(*args)
        return run


def prefill_tiling(*, head_dim: int, vlen: int, registers: int = 16) -> dict[str, int]:
    """flash_prefill's tunables: blocks of two vectors of query rows, and both register
    tiles (scores: mu_k keys x b_q rows; P V: mu_q rows x n_d columns) half the vector
    registers each: 4 x 2 vectors in 16 registers, 8 x 2 in 32 (AVX-512).
    16 registers, Zen 3 (AVX2), 2 threads, causal S = 512, the candidates built side by side
    and timed in interleaved rounds: one vector of query rows and a 4 x 1 and 2 x 1 vector
    tile left most FMAs waiting on latency; 4 x 2 took GQA 9/3 x 64 (SmolLM2) 53 -> 104
    GFLOPS, MHA 16 x 128 (Sheared-LLaMA) 39 -> 87; at S = 128 45 -> 76. Blocks of 4 vectors
    of rows (2 keys a tile) or of 64 keys ran within 8% of these.
    32 registers, Sapphire Rapids VM (AVX-512), the same way: 8 x 2 against 4 x 2, MHA 12 x 64
    (Llama-160M) 195 -> 207 GFLOPS at S = 512 and 138 -> 143 at 128, GQA 9/3 x 64 191 -> 201,
    MHA 16 x 128 161 -> 182; 8 keys x 4 rows was between them."""
    mu = 8 if registers >= 32 else 4
    return {"b_q": 2 * vlen, "b_kv": 32, "mu_k": mu, "mu_q": mu, "n_d": _row_lanes(head_dim, vlen)}


def head_rows(x: np.ndarray, width: int = 0) -> np.ndarray | None:
    """The (T, R, D) rows whose first heads are x's (T, H, D) (a strided view of the QKV
    GEMM's output), as one C-contiguous, 64-byte aligned view; None when x does not lie so.
    The view spans the rows' other heads, which a kernel given H leaves alone.

    One row's first stride says nothing of the buffer (numpy gives a reshaped single row
    its own width), so a one-token x is taken as `width` heads wide (at least H): the
    caller has checked that the heads after x's lie in the same row (a decode step's q,
    k and v)."""
    t, h, d = x.shape
    item = x.itemsize
    if (x.dtype != np.float32 or x.ctypes.data % 64 or x.strides[1:] != (d * item, item)
            or (t > 1 and x.strides[0] % (d * item))):
        return None
    r = max(h, width) if t == 1 else x.strides[0] // (d * item)
    if r < h:
        return None
    return np.lib.stride_tricks.as_strided(x, shape=(t, r, d), strides=(r * d * item, d * item, item))


def amx_attention(*, head_dim: int, amx: bool) -> bool:
    """Whether prefill attention can run on AMX tiles (flash_prefill_amx.sw): the CPU has
    AMX-BF16 and the heads split into the tiles' 32 values."""
    return amx and head_dim % 32 == 0


class PrefillAttention:
    """Causal attention of a prompt chunk (flash_prefill.sw, or flash_prefill_amx.sw with
    `amx`: bf16 products on tiles): its queries see the positions cached before it and the
    chunk's own earlier positions."""

    def __init__(self, build, *, heads: int, kv_heads: int, head_dim: int, max_tokens: int,
                 max_seq: int, vlen: int, registers: int = 16, amx: bool = False,
                 kv_dtype: str = "f32") -> None:
        """`kv_dtype`: the cache's element type, which the AMX kernel reads (the f32 kernel
        reads compact f32 copies)."""
        from sandwich.dsl.load import load_kernel

        self.dims, self.amx = (heads, kv_heads, head_dim), amx
        fixed = {"H": heads, "KVH": kv_heads, "D": head_dim}
        if amx:
            kernel = load_kernel("flash_prefill_amx")
            if kv_dtype != "f32":
                kernel = retyped(kernel, {"K": kv_dtype, "V": kv_dtype})
            self._f = build(kernel, fixed, {})
        else:
            tunables = prefill_tiling(head_dim=head_dim, vlen=vlen, registers=registers)
            self._f = build(load_kernel("flash_prefill"), fixed, tunables)
        self._q = aligned_zeros((max_tokens, heads, head_dim))
        # the f32 kernel's compact K/V (the AMX kernel reads the cache)
        rows = 0 if amx else max(max_seq, 8)  # the self-check attends over 5 positions
        self._k = aligned_zeros((rows, kv_heads, head_dim))
        self._v = aligned_zeros((rows, kv_heads, head_dim))

    def __call__(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot: int,
                 n_kv: int, scale: float, out: np.ndarray) -> None:
        """q (S, H, D): strided rows of the fused QKV buffer; the caches (max_seq, max_batch,
        KVH, D), whose column `slot` holds n_kv >= S positions up to the chunk's last; out
        (S, H * D). The AMX kernel reads q's rows and the cache where they are; the f32
        kernel takes them copied compact (glue; a bf16 cache widened to f32 as it is copied)."""
        s = q.shape[0]
        if n_kv < s:
            raise ShapeError(f"prefill attention of {s} queries over {n_kv} keys: the chunk's "
                             f"own keys must be cached first")
        h, kvh, d = self.dims
        o = out.reshape(s, h, d)
        qc = self._q[:s]
        if self.amx:
            rows = head_rows(q)
            if rows is None:  # q's rows not aligned: its compact copy is rows of H heads
                rows = qc
                rows[...] = q
            max_seq, max_batch = k_cache.shape[:2]
            self._f(s, n_kv, h, kvh, d, rows.shape[1], max_seq, max_batch, slot, scale,
                    *map(kernel_arg, (rows, k_cache, v_cache, o)))
            return
        qc[...] = q
        kc, vc = self._k[:n_kv], self._v[:n_kv]
        kc[...], vc[...] = k_cache[:n_kv, slot], v_cache[:n_kv, slot]
        self._f(s, n_kv, h, kvh, d, scale, *map(kernel_arg, (qc, kc, vc, o)))
