"""Weight formats (issue 26, item 1): names, round trips within each format's error bound,
bit-exact agreement with the `gguf` package's Q8_0, Q4_0, Q4_1 and BF16, GGUF blocks loaded
as stored, the bytes streamed, int6-k's split 6-bit values, and bad names and shapes as
one-line errors."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize as gg_dequantize
from gguf.quants import quantize as gg_quantize

from sandwich.errors import ConfigError, ShapeError
from sandwich.gguf_blocks import from_gguf_blocks
from sandwich.weight_formats import (
    FORMATS,
    QuantizedWeight,
    concat_columns,
    dequantize,
    pack6,
    pad_columns,
    parse_format,
    quantize,
    take_columns,
    take_rows,
    unpack6,
)

NAMES = [f.name for f in FORMATS]
GGUF_TWINS = {"int8-g32": T.Q8_0, "int4-g32": T.Q4_0, "int4-g32-asym": T.Q4_1, "bf16": T.BF16}
K, N = 256, 24


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def weights(seed: int = 0, k: int = K, n: int = N) -> np.ndarray:
    """Random columns plus the hard cases: an all-zero group, a constant column, columns of
    large and tiny values, and groups of exact halves (rounding ties)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[32:64, 0] = 0  # one all-zero group (and half an int4-g128 group)
    w[:, 1] = 0.75  # a constant column
    w[:, 2] *= 1e4
    w[:, 3] *= 1e-6
    w[:, 4] = 0
    w[:32, 5] = np.r_[127, np.arange(31) - 15.5]  # Q8_0 with d = 1: ties at .5
    w[:32, 6] = np.r_[-8, np.arange(31) / 4 - 3.875]  # Q4_0 with d = 1: ties
    return w


def bound(fmt, w: np.ndarray) -> np.ndarray:
    """The largest error each value of `w` may have in `fmt`: half a step (a whole step at the
    clipped end of symmetric int4), plus the rounding of an fp16 scale or minimum."""
    if fmt.bits == 32:
        return np.zeros_like(w)
    if fmt.bits == 16:
        return np.abs(w) * 2.0**-8
    k, n = w.shape
    g = fmt.group_size(k)
    b = w.T.reshape(n, k // g, g).astype(np.float64)
    hi, lo = b.max(-1, keepdims=True), b.min(-1, keepdims=True)
    big = np.maximum(np.abs(hi), np.abs(lo))
    if fmt.bits == 6:
        return np.broadcast_to(_int6_k_bound(big, fmt), b.shape).reshape(n, k).T
    qmax, step, half = {(8, True): (127, big / 127, 0.5), (4, True): (8, big / 8, 1.0),
                        (4, False): (15, (hi - lo) / 15, 0.5),
                        (5, False): (31, (hi - lo) / 31, 0.5)}[(fmt.bits, fmt.symmetric)]
    e = step * half + step * qmax * 1e-6  # float32 arithmetic
    if fmt.super_group:  # int4-k (int5-k): the step and the minimum are 6-bit factors of d and
        # dmin (the super-group's largest over 63, fp16): a step off by d / 2 moves the 15th
        # (31st) up to 15 d / 2 (31 d / 2)
        per = fmt.super_group // g
        def sup(x):  # a group's super-group's largest of x over 63, plus fp16's rounding
            top = x.reshape(n, -1, per).max(-1, keepdims=True) / 63
            return np.repeat(top, per, axis=1).reshape(n, -1, 1) * (1 + 2.0**-10)

        d, dmin = sup((hi - np.minimum(lo, 0)) / qmax), sup(-np.minimum(lo, 0))
        e = e + qmax * d / 2 + dmin / 2 + (qmax + 1) * 63 * 2.0**-25  # and d, dmin fp16 subnormals
    elif fmt.scale_dtype == "float16":  # relative 2^-11, or 2^-25 among the subnormals
        e = e + qmax * np.maximum(step * 2.0**-11, 2.0**-25)
        if not fmt.symmetric:
            e = e + np.maximum(np.abs(lo) * 2.0**-11, 2.0**-25)
    return np.broadcast_to(e, b.shape).reshape(n, k).T


def _int6_k_bound(big: np.ndarray, fmt) -> np.ndarray:
    """int6-k's error bound per group (N, K/16, 1) of largest magnitude `big`: a step of big / 32
    (a whole one where the other end clips at 31); the step an int8 factor of d (the super-
    group's largest step over 128, fp16), off by up to d / 2, or d where 128 clips to 127, moves
    the 32nd value by 32 d; and d as an fp16 subnormal (2^-25 off, times 128 * 32)."""
    n = big.shape[0]
    step = big / 32
    per = fmt.super_group // fmt.group
    d = step.reshape(n, -1, per).max(-1, keepdims=True) / 128 * (1 + 2.0**-10)
    d = np.repeat(d, per, axis=1).reshape(step.shape)
    return step * (1 + 32e-6) + 32 * d + 4096 * 2.0**-25


def test_names_parse_and_unknown_ones_are_one_line_errors():
    assert NAMES[:4] == ["fp32", "bf16", "int8", "int8-g32"]
    for name in NAMES:
        assert parse_format(name).name == name
        assert parse_format(parse_format(name)) is parse_format(name)
    assert parse_format(" INT4 ").name == "int4-g32"
    assert parse_format("int4-asym").name == "int4-g32-asym"
    g = {f.name: (f.bits, f.group, f.symmetric, f.ggml_type) for f in FORMATS}
    assert g["int8"] == (8, None, True, None)
    assert g["int4-g64-asym"] == (4, 64, False, None)
    assert g["int4-g32"][3] == "Q4_0" and g["int8-g32"][3] == "Q8_0"
    assert g["int6-k"] == (6, 16, True, "Q6_K") and parse_format("Q6_K").name == "int6-k"
    for bad in ("int3", "int4-g16", "fp8", ""):
        with pytest.raises(ConfigError) as e:
            parse_format(bad)
        assert f"'{bad}'" in one_line(e) and "int4-g128-asym" in str(e.value)


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_within_the_format_error_bound(name):
    fmt = parse_format(name)
    w = weights()
    qw = quantize(w, name)
    back = dequantize(qw)
    assert back.dtype == np.float32 and back.shape == w.shape
    err = np.abs(back.astype(np.float64) - w)
    assert (err <= bound(fmt, w)).all(), float((err - bound(fmt, w)).max())
    assert (back[:, 4] == 0).all()  # zeros stay zeros, and in a symmetric format in any group
    assert (back[32:64, 0] == 0).all() or not (fmt.symmetric or fmt.group == 32)
    if fmt.super_group:  # int4-k's steps are 6-bit factors of an fp16 per super-group: neither
        return  # a constant nor its own output comes back exactly (the bound above holds)
    if fmt.bits != 8:  # a constant fp16 holds comes back exactly (int8: through a scale)
        assert (back[:, 1] == 0.75).all()
    if fmt.name == "fp32":
        assert np.array_equal(back, w)
    assert np.array_equal(dequantize(quantize(back, name)), back)  # idempotent


@pytest.mark.parametrize("name", NAMES)
def test_arrays_are_contiguous_per_column_and_nbytes_is_what_is_stored(name):
    fmt = parse_format(name)
    qw = quantize(weights(), fmt)
    assert qw.shape == (K, N) and qw.q.shape[0] == N
    for a in qw.arrays().values():
        assert a.flags.c_contiguous and a.shape[0] == N
    assert qw.nbytes == fmt.nbytes(K, N) == sum(a.nbytes for a in qw.arrays().values())


def test_bytes_per_weight_match_the_gguf_blocks():
    per = {f.name: f.nbytes(4096, 1024) / (4096 * 1024) for f in FORMATS}
    assert per["fp32"] == 4 and per["bf16"] == 2
    assert per["int8"] == 1 + 4 / 4096  # one float32 scale per column
    assert per["int8-g32"] == 34 / 32  # Q8_0
    assert per["int4-g32"] == 18 / 32 == 0.5625  # Q4_0
    assert per["int4-g32-asym"] == 20 / 32  # Q4_1
    assert per["int4-g64"] == 34 / 64 and per["int4-g128"] == 66 / 128
    assert per["int4-g128-asym"] == 68 / 128
    assert per["int4-k"] * 8 == 4.625  # Q4_K's 144 bytes a 256, its factors a byte each: 148
    assert per["int6-k"] == 210 / 256 and per["int6-k"] * 8 == 6.5625  # Q6_K's block of 256


@pytest.mark.parametrize("name", list(GGUF_TWINS))
def test_the_gguf_twins_agree_bit_for_bit_with_the_gguf_package(name):
    qtype = GGUF_TWINS[name]
    for seed in range(3):
        w = weights(seed)
        blocks = gg_quantize(np.ascontiguousarray(w.T), qtype)  # GGUF rows are W's columns
        theirs = gg_dequantize(blocks, qtype).T
        ours = quantize(w, name)
        assert np.array_equal(dequantize(ours), theirs)
        stored = from_gguf_blocks(blocks, qtype, (N, K))  # the same bits, block by block
        for key, a in ours.arrays().items():
            assert np.array_equal(a.view(np.uint8), getattr(stored, key).view(np.uint8)), key


def test_gguf_blocks_load_as_stored_whatever_names_the_type():
    w = weights(5, k=64, n=8)
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.F32, T.BF16):
        blocks = gg_quantize(np.ascontiguousarray(w.T), qtype)
        want = np.asarray(gg_dequantize(blocks, qtype), np.float32).T
        for ggml_type in (qtype, int(qtype), qtype.name):
            qw = from_gguf_blocks(blocks, ggml_type, (8, 64))
            assert qw.shape == (64, 8) and np.array_equal(dequantize(qw), want)
            assert qw.nbytes == blocks.nbytes


def test_gguf_blocks_that_cannot_load_are_one_line_errors():
    blocks = gg_quantize(np.ones((8, 64), np.float32), T.Q4_0)
    cases = {"F16 has no weight format": (blocks, T.F16, (8, 64)),
             "Q5_0 has no weight format": (blocks, "q5_0", (8, 64)),
             "K = 64 is not a multiple of 256": (blocks, T.Q4_K, (8, 64)),
             "must hold 288 bytes, got 144": (blocks[:4], T.Q4_0, (8, 64)),
             "K = 48 is not a multiple of 32": (blocks, T.Q4_0, (12, 48)),
             "2-D": (blocks, T.Q4_0, (512,))}
    for what, args in cases.items():
        with pytest.raises(ConfigError) as e:
            from_gguf_blocks(*args)
        assert what in one_line(e)


def test_bad_shapes_and_values_are_one_line_errors():
    for name, shape, what in (("int4-g32", (48, 8), "K a multiple of 32"),
                              ("int4-g128", (192, 8), "K a multiple of 128"),
                              ("int8-g32", (100, 4), "K a multiple of 32"),
                              ("int8", (5,), "must be 2-D")):
        with pytest.raises(ConfigError) as e:
            quantize(np.ones(shape, np.float32), name)
        assert what in one_line(e)
    assert dequantize(quantize(np.ones((5, 3), np.float32), "int8")).shape == (5, 3)
    huge = np.full((32, 2), 1e6, np.float32)
    for name in ("int4-g32", "int4-g32-asym", "int8-g32"):
        with pytest.raises(ConfigError) as e:
            quantize(huge * (1e2 if name == "int8-g32" else 1), name)
        assert "float16 scales" in one_line(e)
    for name in ("int8", "bf16", "fp32"):  # float32 scales, or none: huge values are fine
        assert np.allclose(dequantize(quantize(huge * 1e20, name)), 1e26, rtol=1e-2)
    nan = np.ones((32, 2), np.float32)
    nan[3, 1] = np.nan
    with pytest.raises(ConfigError) as e:
        quantize(nan, "int4-g32")
    assert "NaN" in one_line(e)
    with pytest.raises(ShapeError) as e:
        QuantizedWeight(parse_format("int4-g32"), (64, 8), np.zeros((8, 64), np.uint8))
    assert "'q' must be uint8[8, 32]" in one_line(e)


def test_bf16_rounds_to_nearest_even():
    w = np.array([[1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-20, -0.0]], np.float32).T
    back = dequantize(quantize(w, "bf16"))[:, 0]
    assert list(back) == [1.0, 1 + 2.0**-6, 1 + 2.0**-7, 0.0]
    assert np.signbit(back[3])


@pytest.mark.parametrize("name", ["int8", "int4-g64-asym", "bf16"])
def test_take_columns_permutes_without_requantizing(name):
    qw = quantize(weights(), name)
    perm = np.random.default_rng(1).permutation(N)
    assert np.array_equal(dequantize(take_columns(qw, perm)), dequantize(qw)[:, perm])
    assert take_columns(qw, perm[:8]).shape == (K, 8)


@pytest.mark.parametrize("name", NAMES)
def test_take_rows_cuts_a_share_of_k_with_the_whole_ks_scales(name):
    """A tensor-parallel rank's share of K: the values one process has (int8's one scale per
    column stays the whole column's, not its half's); a cut inside a group is an error (for
    int4-k, inside a super-group of 256)."""
    k = 2 * K if parse_format(name).super_group else K
    w = weights(k=k)
    qw = quantize(w, name)
    half = take_rows(qw, slice(k // 2, k))
    assert half.shape == (k // 2, N)
    assert np.array_equal(dequantize(half), dequantize(qw)[k // 2:])
    if name == "int8":  # quantized alone, the half would get its own scales
        assert not np.array_equal(dequantize(half), dequantize(quantize(w[K // 2:], name)))
    if parse_format(name).group:
        with pytest.raises(ShapeError, match="must be whole groups") as e:
            take_rows(qw, slice(16, k))
        one_line(e)


def test_a_gguf_files_tensors_load_as_stored_and_match_its_reader(tmp_path):
    from gguf_tiny import write_tiny_gguf

    from sandwich.runtime.gguf_file import GGUFCheckpoint, rope_unpermute

    ck = GGUFCheckpoint(write_tiny_gguf(tmp_path / "tiny.gguf")[0])
    seen = set()
    for name in ck.keys():
        t = ck.get(name)
        if len(t.shape) != 2 or t.dtype == "F16":
            continue
        qw = from_gguf_blocks(t.raw.data, t.raw.tensor_type, t.shape)
        if t.rope_heads:  # llama.cpp's RoPE row order back to HF's, still quantized
            order = rope_unpermute(np.arange(t.shape[0])[:, None], t.rope_heads)[:, 0]
            qw = take_columns(qw, order)
        assert np.array_equal(dequantize(qw), t.to_f32().T), name
        seen.add(t.dtype)
    assert seen == {"Q8_0", "Q4_0", "Q4_1", "BF16", "F32"}


def test_round_away_rounds_halves_away_from_zero_exactly():
    from sandwich.weight_formats import round_away

    x = np.array([0.49999997, 0.5, -0.5, 1.5, 2.5, -2.5, -0.49999997, 126.5, -1e-30], np.float32)
    assert round_away(x).tolist() == [0, 1, -1, 2, 3, -3, 0, 127, 0]
    assert round_away(x).dtype == np.float32


@pytest.mark.parametrize("name", NAMES)
def test_a_large_weight_quantizes_in_pieces_to_the_same_arrays(name, monkeypatch):
    import sandwich.weight_formats as wf

    k = 256 if parse_format(name).super_group else 128
    w = weights(7, k=k, n=200)
    whole = quantize(w, name)
    monkeypatch.setattr(wf, "PIECE_VALUES", k * 9)  # pieces of 9 columns, the last of 2
    pieces = quantize(w, name)
    for key, a in whole.arrays().items():
        assert np.array_equal(a.view(np.uint8), getattr(pieces, key).view(np.uint8)), key


def test_int6_k_splits_each_6_bit_value_into_low_nibbles_and_high_bit_pairs():
    v = np.random.default_rng(3).integers(0, 64, (5, 512), dtype=np.uint8)
    q, high = pack6(v)
    assert (q.shape, high.shape, q.dtype, high.dtype) == ((5, 256), (5, 128), np.uint8, np.uint8)
    assert np.array_equal(unpack6(q, high), v)
    j = 7  # plain consecutive pairs and quads, not int4's pairing across a group's halves
    assert q[0, j] == (v[0, 2 * j] & 15) | (v[0, 2 * j + 1] & 15) << 4
    assert high[0, j] == sum(int(v[0, 4 * j + i] >> 4) << (2 * i) for i in range(4))


def test_int6_k_quantizes_as_ggml_shapes_q6_k():
    """The value of largest magnitude in a super-group is its step * -32 (stored 0) and that
    group's factor -128 (d = the step / -128); an all-zero group is factor 0, values 32."""
    w = weights(4, k=512)
    qw = quantize(w, "int6-k")
    assert list(qw.arrays()) == ["q", "high", "scales", "super_scales"]
    assert qw.mins is None and qw.super_mins is None
    values = unpack6(qw.q, qw.high)
    for col, sup in ((0, 0), (7, 1)):
        part = w[256 * sup: 256 * (sup + 1), col]
        at = 256 * sup + int(np.abs(part).argmax())
        assert values[col, at] == 0 and qw.scales[col, at // 16] == -128
        assert np.sign(qw.super_scales[col, sup]) == np.sign(w[at, col])  # d * -128 * -32
    assert (qw.scales[0, 2:4] == 0).all() and (values[0, 32:64] == 32).all()
    assert (dequantize(qw)[32:64, 0] == 0).all() and not np.signbit(dequantize(qw)[32:64, 0]).any()
    with pytest.raises(ConfigError) as e:
        quantize(np.ones((128, 2), np.float32), "int6-k")
    assert "int6-k needs K a multiple of 256" in one_line(e)
    with pytest.raises(ConfigError) as e:  # d = 1e9 / 4096 is past fp16's 65504
        quantize(np.full((256, 2), 1e9, np.float32), "int6-k")
    assert "float16 scales" in one_line(e)


def test_int6_k_high_bits_follow_the_columns_and_rows_they_belong_to():
    w = weights(6, k=512)
    qw = quantize(w, "int6-k")
    both = concat_columns([take_columns(qw, np.arange(0, 10)), take_columns(qw, np.arange(10, N))])
    assert np.array_equal(both.high, qw.high) and np.array_equal(dequantize(both), dequantize(qw))
    padded = pad_columns(qw, N + 8)
    assert padded.high.shape == (N + 8, 128) and (dequantize(padded)[:, N:] == 0).all()
    assert np.array_equal(dequantize(padded)[:, :N], dequantize(qw))
    tail = take_rows(qw, slice(256, 512))  # whole super-groups: its own high bits and d
    assert tail.high.shape == (N, 64) and np.array_equal(dequantize(tail), dequantize(qw)[256:])
    with pytest.raises(ShapeError) as e:
        take_rows(qw, slice(0, 128))  # whole groups of 16, not of 256
    assert "must be whole groups of 256" in one_line(e)
