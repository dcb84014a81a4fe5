"""The permanent KV cache: layout, slot allocation, and capacity errors (issue 6)."""

import numpy as np
import pytest

from sandwich.errors import SandwichError
from sandwich.runtime.kv_cache import CapacityError, KVCache


def _cache(**kw):
    args = dict(layers=2, max_batch=3, max_seq=8, kv_heads=2, head_dim=4) | kw
    return KVCache(**args)


def test_one_contiguous_tensor_per_layer_in_the_decode_kernel_layout():
    kv = _cache()
    assert len(kv.kv) == 2
    for layer in range(2):
        assert kv.kv[layer].flags.c_contiguous
        k, v = kv.k(layer), kv.v(layer)
        assert k.shape == v.shape == (8, 3, 2, 4)  # [max_seq, max_batch, KVH, D]
        assert k.flags.c_contiguous and v.flags.c_contiguous
        assert np.shares_memory(k, kv.kv[layer]) and np.shares_memory(v, kv.kv[layer])
    assert kv.nbytes == 2 * 2 * 8 * 3 * 2 * 4 * 4


def test_slots_are_allocated_and_freed():
    kv = _cache()
    slots = [kv.alloc() for _ in range(3)]
    assert slots == [0, 1, 2] and kv.in_use() == [0, 1, 2]
    kv.lens[1] = 5
    kv.free(1)
    assert kv.in_use() == [0, 2] and kv.lens[1] == 0
    assert kv.alloc() == 1 and kv.lens[1] == 0


def test_request_beyond_max_batch_is_a_clear_error():
    kv = _cache(max_batch=2)
    kv.alloc()
    kv.alloc()
    with pytest.raises(CapacityError, match="all 2 batch slots are in use") as e:
        kv.alloc()
    assert isinstance(e.value, SandwichError)


def test_prompt_longer_than_max_seq_and_room_checks():
    kv = _cache(max_seq=8)
    with pytest.raises(CapacityError, match="prompt of 9 tokens is longer than max_seq=8"):
        kv.check_prompt(9)
    with pytest.raises(CapacityError, match="at least one token"):
        kv.check_prompt(0)
    kv.check_prompt(8)
    s = kv.alloc()
    kv.lens[s] = 7
    kv.check_room(s, 1)
    with pytest.raises(CapacityError, match="would reach 9 tokens, beyond max_seq=8"):
        kv.check_room(s, 2)
    with pytest.raises(CapacityError, match="slot 2 is not allocated"):
        kv.check_room(2, 1)
    with pytest.raises(CapacityError, match="not allocated"):
        kv.free(2)


def test_bad_sizes():
    with pytest.raises(CapacityError, match="must be >= 1"):
        _cache(max_batch=0)
