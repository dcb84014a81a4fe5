"""DECA-style bitmask sparsity (issue 26, item 1): exact round trips over the formats that
store whole values, the bit order of the mask, the bytes saved, and the errors."""

import numpy as np
import pytest

from sandwich.errors import ConfigError, ShapeError
from sandwich.sparse_weights import SparseWeight, densify, sparsify
from sandwich.weight_formats import dequantize, quantize

K, N = 128, 16


def pruned(share: float, seed: int = 0) -> np.ndarray:
    """Random (K, N) weights with the smallest `share` of each column set to zero."""
    w = np.random.default_rng(seed).standard_normal((K, N)).astype(np.float32)
    w[np.abs(w) < np.quantile(np.abs(w), share, axis=0)] = 0
    w[:, 3] = 0  # an empty column
    w[:, 4] = -0.0  # zeros with the sign bit: kept, so the round trip is bit-exact
    return w


@pytest.mark.parametrize("name", ["fp32", "bf16", "int8", "int8-g32"])
def test_sparsify_and_densify_round_trip_exactly(name):
    qw = quantize(pruned(0.5), name)
    sw = sparsify(qw)
    back = densify(sw)
    for key, a in qw.arrays().items():
        assert np.array_equal(a.view(np.uint8), getattr(back, key).view(np.uint8)), key
    assert np.array_equal(dequantize(back), dequantize(qw))
    assert sw.offsets[4] == sw.offsets[3]  # the empty column stores nothing
    assert sw.values.size == np.count_nonzero(qw.q.view(f"u{qw.q.itemsize}"))
    assert sw.nbytes == sum(a.nbytes for a in (sw.mask, sw.values, sw.offsets)) + (
        0 if qw.scales is None else qw.scales.nbytes)


def test_the_mask_is_little_endian_along_k_and_sparse_weights_stream_fewer_bytes():
    w = np.zeros((16, 2), np.float32)
    w[[0, 9], 0] = [1.0, 4.0]
    sw = sparsify(quantize(w, "int8"))
    assert sw.mask.tolist() == [[1, 2], [0, 0]]
    assert sw.values.tolist() == [32, 127] and sw.offsets.tolist() == [0, 2, 2]
    dense = quantize(pruned(0.5), "int8-g32")
    sparse = sparsify(dense)
    assert 0.4 < sparse.density < 0.5
    assert sparse.nbytes < 0.7 * dense.nbytes


def test_packed_nibbles_and_inconsistent_arrays_are_one_line_errors():
    with pytest.raises(ConfigError) as e:
        sparsify(quantize(pruned(0.5), "int4-g32"))
    assert "int4-g32" in str(e.value) and "\n" not in str(e.value)
    sw = sparsify(quantize(pruned(0.5), "int8"))
    for change in ({"values": sw.values[:-1]}, {"offsets": sw.offsets[:-1]},
                   {"mask": sw.mask[:, :-1]}, {"values": sw.values.astype(np.int16)}):
        with pytest.raises(ShapeError) as e:
            SparseWeight(**(vars(sw) | change))
        assert "do not agree" in str(e.value) and "\n" not in str(e.value)
