"""The shipped kernel sources (dsl/kernels): they parse, pass the checks, expose the
tuner's search space, and compute the right thing (run by the reference interpreter on
tiny shapes against numpy, fp32, rtol 1e-4)."""

import numpy as np
import pytest

from sandwich.dsl.interp import run
from sandwich.dsl.load import builtin_kernels, load_kernel
from sandwich.dsl.space import domains, is_valid, require_valid
from sandwich.tuner.reference import reference_attention

VLEN = 4
EXPECTED = {"gemm", "flash_prefill", "flash_prefill_amx", "decode_attention", "paged_decode_attention", "rope",
            "rope_kv", "rmsnorm", "add_rmsnorm", "silu_mul"}
rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_kernel_parses_and_checks(name):
    assert name in builtin_kernels()
    assert load_kernel(name).name == name


def test_gemm_exposes_the_tuner_template():
    k = load_kernel("gemm")
    assert [t.name for t in k.tunables] == ["mu_m", "mu_n", "pack_n", "b_m", "b_n", "b_k",
                                            "t_m", "t_n", "t_k"]
    assert domains(k, vlen=16)["mu_n"] == (16, 32, 48, 64)
    w = next(p for p in k.params if p.name == "W")
    assert len(w.shape) == 3  # packed W[N / pack_n, K, pack_n]
    base = dict(mu_m=4, mu_n=16, pack_n=32, b_m=64, b_n=128, b_k=256, t_m=1, t_n=2, t_k=1)
    assert is_valid(k, base, vlen=16)
    assert not is_valid(k, {**base, "pack_n": 48}, vlen=16)  # pack_n % mu_n ok, b_n % 48 not
    assert not is_valid(k, {**base, "mu_m": 6}, vlen=16)  # b_m % mu_m


@pytest.mark.parametrize("t_k", [1, 2])
def test_gemm_matches_numpy_with_tails(t_k):
    k = load_kernel("gemm")
    tun = dict(mu_m=2, mu_n=4, pack_n=8, b_m=8, b_n=64, b_k=64, t_m=2, t_n=2, t_k=t_k)
    require_valid(k, tun, vlen=VLEN)
    M, N, K = 19, 16, 10
    a, w = rand(M, K), rand(K, N)
    wp = np.ascontiguousarray(w.reshape(K, N // 8, 8).transpose(1, 0, 2))
    c = np.full((M, N), np.nan, np.float32)
    run(k, tunables=tun, vlen=VLEN, M=M, N=N, K=K, A=a, W=wp, C=c)
    close(c, a @ w)


def test_rmsnorm_silu_rope_match_numpy():
    x, w = rand(3, 10), rand(10)
    y = np.zeros_like(x)
    run(load_kernel("rmsnorm"), tunables={}, vlen=VLEN, M=3, N=10, eps=1e-6, x=x, w=w, y=y)
    close(y, x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * w)
    r, x1 = rand(3, 10), x.copy()
    run(load_kernel("add_rmsnorm"), tunables={}, vlen=VLEN, M=3, N=10, eps=1e-6, x=x1, r=r, w=w, y=y)
    close(x1, x + r)  # the residual added in place, then normed
    close(y, (x + r) / np.sqrt(((x + r).astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * w)

    gu = rand(3, 10)
    out = np.zeros((3, 5), np.float32)
    run(load_kernel("silu_mul"), tunables={}, M=3, N=5, x=gu, out=out)
    g = gu[:, :5].astype(np.float64)
    close(out, g / (1 + np.exp(-g)) * gu[:, 5:])

    T, H, KVH, D, P = 3, 2, 1, 8, 16
    pos = np.array([5, 0, 11], np.int32)
    ang = np.arange(P)[:, None] * 10000.0 ** (-np.arange(D // 2) * 2 / D)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q, kk = rand(T, H, D), rand(T, KVH, D)
    q0, k0 = q.copy(), kk.copy()
    run(load_kernel("rope"), tunables={}, vlen=VLEN, T=T, H=H, KVH=KVH, D=D, max_pos=P,
        positions=pos, cos_cache=cos, sin_cache=sin, q=q, k=kk)

    def ref(x):
        c, s = np.concatenate([cos[pos]] * 2, 1)[:, None], np.concatenate([sin[pos]] * 2, 1)[:, None]
        rot = np.concatenate([-x[..., D // 2:], x[..., : D // 2]], -1)
        return x * c + rot * s

    close(q, ref(q0))
    close(kk, ref(k0))

    rows = rand(T, H + 2 * KVH, D)  # the fused QKV rows: q's heads, k's, v's
    rows0 = rows.copy()
    slots = np.array([2, 0, 2], np.int32)
    kc, vc = np.full((2, P, 3, KVH, D), np.nan, np.float32)
    run(load_kernel("rope_kv"), tunables={}, vlen=VLEN, T=T, R=H + 2 * KVH, H=H, KVH=KVH, D=D,
        max_pos=P, LMAX=P, NB=3, positions=pos, slots=slots, cos_cache=cos, sin_cache=sin,
        x=rows, k_cache=kc, v_cache=vc)
    close(rows[:, : H + KVH], ref(rows0[:, : H + KVH]))
    close(kc[pos, slots], rows[:, H: H + KVH])  # the rotated k, and v, at each token's place
    close(vc[pos, slots], rows0[:, H + KVH:])
    assert np.isnan(kc).sum() == kc.size - T * KVH * D  # nothing else written
    assert np.array_equal(rows[:, H + KVH:], rows0[:, H + KVH:])  # v untouched


@pytest.mark.parametrize("prior", [0, 11])
def test_flash_prefill_matches_causal_attention(prior):
    S, H, KVH, D = 37, 4, 2, 4
    q, k, v = rand(S, H, D), rand(prior + S, KVH, D), rand(prior + S, KVH, D)
    o = np.full((S, H, D), np.nan, np.float32)
    run(load_kernel("flash_prefill"), tunables=dict(b_q=8, b_kv=16, mu_k=4, mu_q=2, n_d=4), vlen=VLEN, S=S,
        L=prior + S, H=H, KVH=KVH, D=D, scale=0.5, Q=q, K=k, V=v, O=o)
    close(o, reference_attention(q, k, v, 0.5, causal=True))


def _decode(lens, slots, q, k_cache, v_cache, H, KVH, D):
    out = np.full((len(lens), H, D), np.nan, np.float32)
    work = np.full((2, len(lens), H, D + 16), np.nan, np.float32)
    run(load_kernel("decode_attention"), tunables=dict(b_kv=16, n_split=2, n_d=VLEN), vlen=VLEN,
        B=len(lens), H=H, work=work,
        KVH=KVH, D=D, max_seq=k_cache.shape[0], max_batch=k_cache.shape[1], scale=0.5, q=q,
        k_cache=k_cache, v_cache=v_cache, slots=np.array(slots, np.int32),
        lens=np.array(lens, np.int32), out=out)
    return out


def test_decode_attention_ragged_gqa_ignores_slots_past_length():
    H, KVH, D, max_seq, max_batch = 4, 2, 4, 40, 4
    lens, slots = [1, 37, 20], [2, 0, 3]
    kc, vc = rand(max_seq, max_batch, KVH, D), rand(max_seq, max_batch, KVH, D)
    for n, s in zip(lens, slots, strict=True):
        kc[n:, s], vc[n:, s] = np.nan, np.nan
    kc[:, 1], vc[:, 1] = np.nan, np.nan  # an unused slot
    q = rand(3, H, D)
    out = _decode(lens, slots, q, kc, vc, H, KVH, D)
    assert np.isfinite(out).all()
    for b, (n, s) in enumerate(zip(lens, slots, strict=True)):
        close(out[b], reference_attention(q[b : b + 1], kc[:n, s], vc[:n, s], 0.5, causal=False)[0])
        alone = _decode([n], [s], q[b : b + 1], kc, vc, H, KVH, D)
        np.testing.assert_array_equal(out[b], alone[0])  # one call == separate calls


def test_paged_decode_attention_follows_the_block_table():
    H, KVH, D, bs, nblocks, max_blocks = 4, 1, 4, 4, 20, 10
    lens = [1, 37, 9]
    kc, vc = np.full((2, nblocks, bs, KVH, D), np.nan, np.float32)
    table = np.zeros((3, max_blocks), np.int32)
    free = list(rng.permutation(nblocks))
    keys, vals = [], []
    for b, n in enumerate(lens):
        kb, vb = rand(n, KVH, D), rand(n, KVH, D)
        keys.append(kb)
        vals.append(vb)
        for t in range(n):
            if t % bs == 0:
                table[b, t // bs] = free.pop()
            kc[table[b, t // bs], t % bs], vc[table[b, t // bs], t % bs] = kb[t], vb[t]
    q = rand(3, H, D)
    out = np.full((3, H, D), np.nan, np.float32)
    run(load_kernel("paged_decode_attention"), tunables={}, vlen=VLEN, B=3, H=H, KVH=KVH, D=D,
        num_blocks=nblocks, block_size=bs, max_blocks=max_blocks, scale=0.5, q=q, k_cache=kc,
        v_cache=vc, block_table=table, lens=np.array(lens, np.int32), out=out)
    for b in range(3):
        close(out[b], reference_attention(q[b : b + 1], keys[b], vals[b], 0.5, causal=False)[0])
