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


# -- prefix reuse ------------------------------------------------------------------------------
def _filled(kv, tokens):
    """A slot holding `tokens` (as a forward pass records them), then freed."""
    s = kv.alloc()
    kv.record(s, 0, tokens)
    kv.lens[s] = len(tokens)
    kv.free(s)
    return s


def test_a_prompt_takes_the_freed_slot_that_holds_the_most_of_it():
    kv = _cache(max_batch=3, max_seq=16)
    a = _filled(kv, [1, 2, 3, 4, 5])
    b = _filled(kv, [1, 2, 9])
    assert (a, b) == (0, 1)
    s = kv.alloc([1, 2, 3, 4, 5, 6, 7])  # a's five positions, then 6 and 7 to prefill
    assert s == a and kv.lens[s] == 5 and kv.ids[s] == [1, 2, 3, 4, 5] and kv.reused_tokens == 5
    t = kv.alloc([1, 2, 9])  # b whole: all but the last token, whose logits are needed
    assert t == b and kv.lens[t] == 2 and kv.ids[t] == [1, 2]
    assert kv.alloc([1, 2, 9]) == 2 and kv.lens[2] == 0  # the never-used slot: nothing kept
    assert kv.reused_tokens == 7


def test_a_short_common_opening_does_not_evict_a_kept_conversation():
    """[1, 2] matches a's opening but not half of a's ten kept tokens: the prompt takes the
    slot freed longest ago (here the never-used slot 1), and a stays for its own next turn."""
    kv = _cache(max_batch=2, max_seq=16)
    a = _filled(kv, list(range(1, 11)))
    s = kv.alloc([1, 2, 50, 51])
    assert s == 1 and kv.lens[s] == 0
    kv.free(s)
    t = kv.alloc(list(range(1, 11)) + [77])
    assert t == a and kv.lens[t] == 10


def test_what_a_slot_keeps_follows_what_was_written():
    kv = _cache(max_batch=1, max_seq=16)
    s = kv.alloc()
    kv.record(s, 0, [4, 5, 6])
    kv.record(s, 3, [7])  # a decode step
    kv.lens[s] = 4
    kv.record(s, 2, [9])  # positions rewritten from 2 on
    assert kv.ids[s] == [4, 5, 9]
    kv.lens[s] = 3
    kv.free(s)
    assert kv.alloc([4, 5, 9, 1]) == s and kv.lens[s] == 3
    kv.record(s, 5, [1])  # a gap (positions filled some other way): nothing is known
    kv.free(s)
    assert kv.ids[s] is None and kv.alloc([4, 5, 9, 1]) == s and kv.lens[s] == 0


def test_reuse_off_and_check_free_change_nothing():
    kv = _cache(max_batch=2, max_seq=16, reuse=False)
    a = _filled(kv, [1, 2, 3])
    kv.check_free()
    s = kv.alloc([1, 2, 3, 4])
    assert kv.lens[s] == 0 and kv.reused_tokens == 0 and s == 1  # the one freed longest ago
    kv.alloc()
    with pytest.raises(CapacityError, match="all 2 batch slots are in use"):
        kv.check_free()
    assert a == 0


def test_a_running_sequences_positions_are_copied_for_a_prompt_that_starts_with_them():
    """Slot 0 runs 40 positions; a prompt of those 40 and two more gets them copied into its
    own slot (every layer's K and V); a match of fewer than COPY_MIN positions is not copied."""
    from sandwich.runtime.kv_cache import COPY_MIN

    kv = _cache(max_batch=3, max_seq=64)
    a = kv.alloc()
    run = list(range(100, 140))
    kv.record(a, 0, run)
    kv.lens[a] = 40
    rng = np.random.default_rng(0)
    for t in kv.kv:
        t[:, :40, a] = rng.standard_normal(t[:, :40, a].shape)
    b = kv.alloc(run + [7, 8])
    assert b != a and kv.lens[b] == 40 and kv.ids[b] == run and kv.copied_tokens == 40
    for t in kv.kv:
        np.testing.assert_array_equal(t[:, :40, b], t[:, :40, a])
    c = kv.alloc(run[:COPY_MIN - 1] + [9, 9])
    assert kv.lens[c] == 0 and kv.copied_tokens == 40
