"""The ragged per-sequence KV cache: extend, commit, crop."""

from __future__ import annotations

import pytest
import torch

from setdlm.core.kv_cache import KVCache


def _extend_all(cache, keys, values):
    views = [cache.extend(layer, keys + layer, values - layer) for layer in range(cache.num_layers)]
    return views


def test_extend_returns_the_cached_slots_followed_by_the_new_inputs():
    cache = KVCache(num_layers=1, batch_size=1)
    first = torch.arange(6, dtype=torch.float32).view(1, 1, 3, 2)  # (B, H, Q, D)
    keys, _ = cache.extend(0, first, first)
    assert torch.equal(keys, first)
    cache.commit_prefix([2], torch.tensor([[5, 6, 7]]))
    second = torch.full((1, 1, 2, 2), -1.0)
    keys, values = cache.extend(0, second, second)
    assert torch.equal(keys, torch.cat([first[:, :, :2], second], dim=2))  # input 3 was dropped
    assert cache.cached_positions().tolist() == [[5, 6]]


def test_commit_keeps_each_rows_selected_inputs_in_order():
    cache = KVCache(num_layers=2, batch_size=2)
    keys = torch.arange(2 * 1 * 4 * 3, dtype=torch.float32).view(2, 1, 4, 3)  # (B, H, Q, D)
    values = -keys
    _extend_all(cache, keys, values)
    keep = torch.tensor([[True, False, True, False], [True, True, True, True]])
    positions = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    cache.commit(keep, positions)
    assert cache.lengths.tolist() == [2, 4] and cache.width == 4
    assert cache.key_valid().tolist() == [[True, True, False, False], [True] * 4]
    k, v = cache.read(1)
    assert torch.equal(k[0, :, :2], keys[0][:, [0, 2]] + 1)
    assert torch.equal(v[1], values[1] - 1)
    assert cache.cached_positions()[0, :2].tolist() == [10, 12]
    # the next inputs go after the widest row; each row's kept ones land after its own length
    _extend_all(cache, keys, values)
    cache.commit_prefix([1, 0], positions)
    assert cache.lengths.tolist() == [3, 4]
    assert torch.equal(cache.read(0)[0][0, :, 2], keys[0, :, 0])
    assert torch.equal(cache.read(0)[0][1], keys[1])  # row 1 unchanged
    assert cache.cached_positions()[0, :3].tolist() == [10, 12, 10]


def test_committing_more_than_the_forward_added_is_an_error():
    cache = KVCache(num_layers=1, batch_size=1)
    cache.extend(0, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    with pytest.raises(RuntimeError, match="extended the cache with 2"):
        cache.commit_prefix([3], torch.zeros(1, 3, dtype=torch.long))
    cache.commit_prefix([0], torch.zeros(1, 2, dtype=torch.long))
    assert cache.width == 0 and cache.read(0) is None


def test_keep_slots_compacts_the_kept_slots_in_order():
    cache = KVCache(num_layers=1, batch_size=2)
    keys = torch.arange(2 * 5, dtype=torch.float32).view(2, 1, 5, 1)
    cache.extend(0, keys, keys)
    cache.commit_prefix([5, 5], torch.arange(5).expand(2, -1))
    cache.keep_slots(torch.tensor([[False, True, False, True, True], [True] * 5]))
    assert cache.lengths.tolist() == [3, 5]
    assert cache.read(0)[0][0, 0, :3, 0].tolist() == [1.0, 3.0, 4.0]
    assert cache.cached_positions()[0, :3].tolist() == [1, 3, 4]
    assert cache.read(0)[0][1, 0, :, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]


def test_truncate_row_keeps_that_rows_oldest_slots_only():
    """A policy that recomputes part of its cache keeps the row's first n slots: the others
    are hidden from attention and the next commit writes over them."""
    cache = KVCache(num_layers=1, batch_size=2)
    keys = torch.arange(2 * 4, dtype=torch.float32).view(2, 1, 4, 1)
    cache.extend(0, keys, keys)
    cache.commit_prefix([4, 4], torch.arange(4).expand(2, -1))
    cache.truncate_row(0, 1)
    cache.truncate_row(1, 9)  # longer than the row: nothing to drop
    assert cache.lengths.tolist() == [1, 4] and cache.width == 4
    assert cache.key_valid().tolist() == [[True, False, False, False], [True] * 4]
    new = torch.full((2, 1, 1, 1), -1.0)
    cache.extend(0, new, new)
    cache.commit_prefix([1, 0], torch.full((2, 1), 7))
    assert cache.lengths.tolist() == [2, 4]
    assert cache.read(0)[0][0, 0, :2, 0].tolist() == [0.0, -1.0]
    assert cache.cached_positions()[0, :2].tolist() == [0, 7]
