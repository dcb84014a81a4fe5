"""Attention kernels of the DSL (issue 3) compiled by TVM for this CPU, checked in fp32 at
rtol 1e-4 against numpy and torch.nn.functional.scaled_dot_product_attention."""

import os

import numpy as np
import pytest

os.environ.setdefault("TVM_NUM_THREADS", "2")
tvm = pytest.importorskip("tvm")
torch = pytest.importorskip("torch")

from sandwich.compiler.lower_tir import lower_to_tir  # noqa: E402
from sandwich.compiler.target import detect_cpu, tvm_target  # noqa: E402
from sandwich.dsl.load import load_kernel  # noqa: E402
from sandwich.runtime.dsl_attention import decode_tiling, prefill_tiling  # noqa: E402
from sandwich.tuner.reference import reference_attention  # noqa: E402

pytestmark = pytest.mark.tvm
CPU = detect_cpu()
rng = np.random.default_rng(3)


def build(name, fixed=None, **tunables):
    mod = lower_to_tir(load_kernel(name), tunables=tunables, vlen=CPU.lanes_f32, fixed=fixed)
    return tvm.compile(mod, target=tvm_target(CPU, 2))["main"]


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def tensors(*arrays):
    return [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)


def torch_attention(q, k, v, scale, causal):
    """The same through torch SDPA (KV heads repeated for GQA)."""
    group = q.shape[1] // k.shape[1]
    tq = torch.from_numpy(q).permute(1, 0, 2)[None]
    tk = torch.from_numpy(k).repeat_interleave(group, 1).permute(1, 0, 2)[None]
    tv = torch.from_numpy(v).repeat_interleave(group, 1).permute(1, 0, 2)[None]
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                           scale=scale)
    return out[0].permute(1, 0, 2).numpy()


@pytest.mark.parametrize("fixed", [None, {"D": 32, "H": 4, "KVH": 2}])
@pytest.mark.parametrize("prior", [0, 21])
def test_flash_prefill_is_causal_attention(fixed, prior):
    """Symbolic and fixed head_dim; S = 45 leaves tails in both block sizes; with `prior`
    cached positions the chunk's queries also see every earlier key (a later prompt chunk)."""
    f = build("flash_prefill", fixed, b_q=CPU.lanes_f32, b_kv=16, mu_k=4, mu_q=2, n_d=CPU.lanes_f32)
    S, H, KVH, D, scale = 45, 4, 2, 32, 0.3
    L = prior + S
    q, k, v = rand(S, H, D), rand(L, KVH, D), rand(L, KVH, D)
    tq, tk, tv, to = tensors(q, k, v, np.full((S, H, D), np.nan, np.float32))
    f(S, L, H, KVH, D, scale, tq, tk, tv, to)
    close(to.numpy(), reference_attention(q, k, v, scale, causal=True))
    if not prior:
        close(to.numpy(), torch_attention(q, k, v, scale, causal=True))


SPLIT = 4


def decode(f, q, kc, vc, slots, lens, scale=0.25):
    B, H, D = q.shape
    max_seq, max_batch, KVH, _ = kc.shape
    tq, tk, tv, ts, tl, to, tw = tensors(
        q, kc, vc, np.array(slots, np.int32), np.array(lens, np.int32),
        np.full((B, H, D), np.nan, np.float32), np.full((SPLIT, B, H, D + 16), np.nan, np.float32))
    f(B, H, KVH, D, max_seq, max_batch, scale, tq, tk, tv, ts, tl, to, tw)
    return to.numpy()


@pytest.fixture(scope="module")
def decode_kernel():
    return build("decode_attention", {"D": 16}, b_kv=16, n_split=SPLIT, n_d=CPU.lanes_f32)


def test_decode_attention_gqa(decode_kernel):
    H, KVH, D, lens, slots = 8, 2, 16, [5, 19], [1, 0]
    kc, vc = rand(24, 2, KVH, D), rand(24, 2, KVH, D)
    q = rand(2, H, D)
    out = decode(decode_kernel, q, kc, vc, slots, lens)
    for b, (n, s) in enumerate(zip(lens, slots, strict=True)):
        close(out[b], reference_attention(q[b:b + 1], kc[:n, s], vc[:n, s], 0.25, causal=False)[0])
        close(out[b], torch_attention(q[b:b + 1], kc[:n, s], vc[:n, s], 0.25, causal=False)[0])


def test_decode_ragged_batch_equals_separate_calls_and_ignores_nan_slots(decode_kernel):
    """Lengths 1, 37 and 1000 in one call; everything past a length (and an unused slot)
    is NaN, and the output is finite and the same as with zeros there."""
    H, KVH, D, max_seq, lens, slots = 4, 2, 16, 1024, [1, 37, 1000], [3, 0, 2]
    kc, vc = rand(max_seq, 4, KVH, D), rand(max_seq, 4, KVH, D)
    kz, vz = kc.copy(), vc.copy()
    for n, s in zip(lens, slots, strict=True):
        kc[n:, s], vc[n:, s], kz[n:, s], vz[n:, s] = np.nan, np.nan, 0, 0
    kc[:, 1], vc[:, 1], kz[:, 1], vz[:, 1] = np.nan, np.nan, 0, 0
    q = rand(3, H, D)
    out = decode(decode_kernel, q, kc, vc, slots, lens)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out, decode(decode_kernel, q, kz, vz, slots, lens))
    for b, (n, s) in enumerate(zip(lens, slots, strict=True)):
        alone = decode(decode_kernel, q[b:b + 1], kc, vc, [s], [n])
        np.testing.assert_array_equal(out[b], alone[0])
        close(out[b], torch_attention(q[b:b + 1], kc[:n, s], vc[:n, s], 0.25, causal=False)[0])


def test_decode_tiling_takes_two_vectors_a_head_row_and_blocks_within_half_of_l2():
    """The runtime's decode tiling: two FMA chains per head row where D allows (one left a
    head's products waiting on each other's latency), and the largest block whose K and V
    copies for a full batch take at most half of L2, never below the old 16."""
    kib = 1024
    assert decode_tiling(kv_heads=16, head_dim=128, vlen=8, max_batch=1, l2_bytes=512 * kib) \
        == {"n_d": 16, "b_kv": 16}  # 16 x 16 KB of copies: half of 512 KiB
    assert decode_tiling(kv_heads=3, head_dim=64, vlen=8, max_batch=1, l2_bytes=512 * kib) \
        == {"n_d": 16, "b_kv": 64}
    assert decode_tiling(kv_heads=3, head_dim=64, vlen=8, max_batch=8, l2_bytes=512 * kib)["b_kv"] == 16
    assert decode_tiling(kv_heads=16, head_dim=128, vlen=16, max_batch=1, l2_bytes=1024 * kib) \
        == {"n_d": 32, "b_kv": 32}
    assert decode_tiling(kv_heads=2, head_dim=24, vlen=8, max_batch=1, l2_bytes=512 * kib)["n_d"] == 8
    # D = 24 on 16 AVX-512 lanes: no whole vector divides it, so the widest part that does
    assert decode_tiling(kv_heads=2, head_dim=24, vlen=16, max_batch=1, l2_bytes=512 * kib)["n_d"] == 8
    assert prefill_tiling(head_dim=24, vlen=16)["n_d"] == 8
    # both register tiles half the vector registers: 4 x 2 vectors of 16, 8 x 2 of 32
    assert prefill_tiling(head_dim=64, vlen=8) == {"b_q": 16, "b_kv": 32, "mu_k": 4, "mu_q": 4, "n_d": 16}
    assert prefill_tiling(head_dim=64, vlen=16, registers=32) == {"b_q": 32, "b_kv": 32, "mu_k": 8,
                                                                   "mu_q": 8, "n_d": 32}


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_decode_attention_at_the_runtime_tiling_is_attention(heads, kv_heads):
    """The kernel as the runtime builds it (decode_tiling on this CPU), with lengths that
    leave a tail block and a sequence shorter than one block, against torch."""
    D, max_seq, lens, slots = 32, 160, [150, 9], [1, 0]
    tiling = decode_tiling(kv_heads=kv_heads, head_dim=D, vlen=CPU.lanes_f32, max_batch=2,
                           l2_bytes=CPU.l2_bytes)
    f = build("decode_attention", {"D": D, "H": heads, "KVH": kv_heads}, n_split=SPLIT, **tiling)
    kc, vc = rand(max_seq, 2, kv_heads, D), rand(max_seq, 2, kv_heads, D)
    q = rand(2, heads, D)
    out = decode(f, q, kc, vc, slots, lens)
    for b, (n, s) in enumerate(zip(lens, slots, strict=True)):
        close(out[b], torch_attention(q[b:b + 1], kc[:n, s], vc[:n, s], 0.25, causal=False)[0])


@pytest.mark.parametrize("heads,kv_heads,D", [(4, 4, 32), (6, 2, 24)])
def test_flash_prefill_at_the_runtime_tiling_is_causal_attention(heads, kv_heads, D):
    """The kernel as the runtime builds it (prefill_tiling on this CPU: two vectors of query
    rows, tiles of half the vector registers; D = 24 takes one-vector columns), with a cached prefix and S
    leaving tails in every block, against torch."""
    tiling = prefill_tiling(head_dim=D, vlen=CPU.lanes_f32, registers=CPU.vector_registers)
    f = build("flash_prefill", {"D": D, "H": heads, "KVH": kv_heads}, **tiling)
    S, prior, scale = 77, 19, 0.3
    q, k, v = rand(S, heads, D), rand(prior + S, kv_heads, D), rand(prior + S, kv_heads, D)
    tq, tk, tv, to = tensors(q, k, v, np.full((S, heads, D), np.nan, np.float32))
    f(S, prior + S, heads, kv_heads, D, scale, tq, tk, tv, to)
    close(to.numpy(), reference_attention(q, k, v, scale, causal=True))


def test_paged_decode_attention_follows_the_block_table():
    f = build("paged_decode_attention", {"D": 16, "block_size": 16})
    H, KVH, D, bs, nblocks, max_blocks, lens = 4, 1, 16, 16, 12, 4, [1, 37, 16]
    kc, vc = np.full((2, nblocks, bs, KVH, D), np.nan, np.float32)
    table = np.zeros((3, max_blocks), np.int32)
    free = list(rng.permutation(nblocks))
    keys, vals = [rand(n, KVH, D) for n in lens], [rand(n, KVH, D) for n in lens]
    for b, n in enumerate(lens):
        for t in range(n):
            if t % bs == 0:
                table[b, t // bs] = free.pop()
            kc[table[b, t // bs], t % bs], vc[table[b, t // bs], t % bs] = keys[b][t], vals[b][t]
    q = rand(3, H, D)
    tq, tk, tv, tt, tl, to = tensors(q, kc, vc, table, np.array(lens, np.int32),
                                     np.full((3, H, D), np.nan, np.float32))
    f(3, H, KVH, D, nblocks, bs, max_blocks, 0.25, tq, tk, tv, tt, tl, to)
    for b in range(3):
        close(to.numpy()[b], reference_attention(q[b:b + 1], keys[b], vals[b], 0.25, False)[0])
        close(to.numpy()[b], torch_attention(q[b:b + 1], keys[b], vals[b], 0.25, False)[0])


def test_a_call_with_another_fixed_value_is_refused(decode_kernel):
    q, kc = rand(1, 4, 8), rand(4, 1, 2, 8)
    with pytest.raises(Exception, match="(?i)mismatch|D must be 16"):
        decode(decode_kernel, q, kc, kc, [0], [4])


@pytest.mark.skipif(not CPU.amx, reason="this CPU has no AMX-BF16")
@pytest.mark.parametrize("heads,kv_heads,D,aligned", [(4, 4, 64, True), (6, 2, 32, True),
                                                       (4, 2, 64, False)])
def test_amx_prefill_attention_reads_the_qkv_rows_and_the_cache_where_they_are(heads, kv_heads, D,
                                                                            aligned):
    """PrefillAttention on AMX tiles as the runtime calls it: q a strided view of the fused
    QKV rows (copied compact only where those are not 64-byte aligned), K/V the cache column
    of slot 1 of 3, a chunk after cached positions; within bf16's rounding of causal attention
    on the same values."""
    from sandwich.compiler.buffers import aligned_zeros
    from sandwich.runtime.dsl_attention import PrefillAttention, amx_attention
    from sandwich.runtime.ops_dsl import _build
    from sandwich.weight_formats import round_bf16

    assert amx_attention(head_dim=D, amx=True) and not amx_attention(head_dim=D, amx=False)
    assert not amx_attention(head_dim=24, amx=True)  # a head the 32-value tiles do not split
    att = PrefillAttention(lambda k, fixed, tun: _build(k, CPU, 2, fixed, tun), heads=heads,
                           kv_heads=kv_heads, head_dim=D, max_tokens=96, max_seq=160,
                           vlen=CPU.lanes_f32, amx=True)
    S, prior, width = 77, 50, (heads + 2 * kv_heads) * D
    qkv = aligned_zeros((S * width + 1,))[int(not aligned):][: S * width].reshape(S, width)
    qkv[...] = rand(S, width)
    cache = aligned_zeros((2, 160, 3, kv_heads, D))
    cache[...] = rand(*cache.shape)
    out = aligned_zeros((S, heads * D))
    q = qkv[:, : heads * D].reshape(S, heads, D)
    att(q, cache[0], cache[1], 1, prior + S, 0.125, out)
    k, v = cache[0, : prior + S, 1], cache[1, : prior + S, 1]
    want = reference_attention(*(round_bf16(np.ascontiguousarray(x)) for x in (q, k, v)), 0.125,
                               causal=True)
    np.testing.assert_allclose(out.reshape(S, heads, D), want, atol=5e-3)


@pytest.mark.skipif(not CPU.amx, reason="this CPU has no AMX-BF16")
@pytest.mark.parametrize("kv", ["f32", "bf16"])
def test_amx_prefill_attention_reads_a_cache_of_either_type(kv):
    """A bf16 model's DSL ops over a bf16 KV cache run the AMX attention retyped to read it:
    its self-check (a prefill chunk over that cache against numpy) passes. Before, the
    kernel took only f32 caches and the ops refused to build (mismatched K dtype)."""
    from sandwich.runtime.ops_dsl import DslOps

    ops = DslOps(max_tokens=16, max_batch=2, heads=4, kv_heads=2, head_dim=64, hidden=256,
                 intermediate=512, max_seq=64, cpu=CPU, threads=2, kv_dtype=kv, attention="bf16")
    assert ops._prefill.amx


@pytest.mark.parametrize("t", [1, 3])
def test_rope_kv_runs_on_the_qkv_rows_at_one_token_too(t):
    """The executor's q, k, v are views of the fused QKV rows, and rope_kv rotates and stores
    them where they lie. A decode step's single row has numpy's own first stride for each view
    (q's row H heads wide, k's KVH), which made the ops take the fallback (compact copies, numpy
    stores: 10 of a SmolLM2 decode layer's 145 us on a Zen 3); it must not, and must match the
    numpy ops. The compact-copy buffer is filled with NaN: the fused path never touches it."""
    from sandwich.compiler.buffers import aligned_zeros
    from sandwich.runtime.ops_dsl import DslOps
    from sandwich.runtime.ops_fallback import NumpyOps

    h, kvh, d = 12, 12, 64  # Llama-160M's executor tests build these kernels (the build cache)
    ops = DslOps(max_tokens=16, max_batch=2, heads=h, kv_heads=kvh, head_dim=d, hidden=768,
                 intermediate=3072, max_seq=32, cpu=CPU, threads=2)
    ref = NumpyOps(max_tokens=16, heads=h, head_dim=d, max_seq=32)
    ang = np.arange(16, dtype=np.float32)[:, None] * np.float32(0.1) ** np.arange(d // 2, dtype=np.float32)
    cos, sin = aligned_zeros(ang.shape), aligned_zeros(ang.shape)
    cos[...], sin[...] = np.cos(ang), np.sin(ang)
    pos, slots = np.array([5, 2, 9][:t]), np.array([1, 3, 0][:t])
    init = rand(t, (h + 2 * kvh) * d)
    outs = []
    for o in (ops, ref):
        qkv = aligned_zeros((16, (h + 2 * kvh) * d))[:t]  # the executor's buffer and views
        qkv[...] = init
        q = qkv[:, : h * d].reshape(t, -1, d)
        k = qkv[:, h * d: (h + kvh) * d].reshape(t, -1, d)
        v = qkv[:, (h + kvh) * d:].reshape(t, -1, d)
        cache = aligned_zeros((2, 16, 4, kvh, d))
        if o is ops:
            o._q[...] = np.nan
        o.rope_kv(q, k, v, pos, slots, cos, sin, None, cache[0], cache[1])
        outs.append((qkv.copy(), cache))
    assert np.isnan(ops._q).all()
    close(outs[0][0], outs[1][0])
    close(outs[0][1], outs[1][1])
