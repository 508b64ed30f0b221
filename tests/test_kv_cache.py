"""The ragged per-sequence KV cache: commit, drop, crop."""

from __future__ import annotations

import torch

from setdlm.core.kv_cache import KVCache


def _stash_all(cache, keys, values):
    for layer in range(cache.num_layers):
        cache.stash(layer, keys + layer, values - layer)


def test_commit_appends_each_rows_kept_inputs_in_order():
    cache = KVCache(num_layers=2, batch_size=2)
    keys = torch.arange(2 * 1 * 4 * 3, dtype=torch.float32).view(2, 1, 4, 3)  # (B, H, Q, D)
    values = -keys
    _stash_all(cache, keys, values)
    keep = torch.tensor([[True, False, True, False], [True, True, True, True]])
    positions = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    cache.commit(keep, positions)
    assert cache.lengths.tolist() == [2, 4]
    assert cache.width == 4
    assert cache.key_valid().tolist() == [[True, True, False, False], [True] * 4]
    k, v = cache.read(1)
    assert torch.equal(k[0, :, :2], keys[0][:, [0, 2]] + 1)
    assert torch.equal(v[1], values[1] - 1)
    assert cache.cached_positions()[0, :2].tolist() == [10, 12]
    # a second commit lands after each row's own length
    _stash_all(cache, keys, values)
    cache.commit(torch.tensor([[False, False, False, True], [False] * 4]), positions)
    assert cache.lengths.tolist() == [3, 4]
    assert torch.equal(cache.read(0)[0][0, :, 2], keys[0, :, 3])


def test_commit_of_nothing_drops_the_stash():
    cache = KVCache(num_layers=1, batch_size=1)
    cache.stash(0, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    cache.commit(torch.zeros(1, 2, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.long))
    assert cache.width == 0 and cache.read(0) is None


def test_keep_slots_compacts_the_kept_slots_in_order():
    cache = KVCache(num_layers=1, batch_size=2)
    keys = torch.arange(2 * 5, dtype=torch.float32).view(2, 1, 5, 1)
    cache.stash(0, keys, keys)
    cache.commit(torch.ones(2, 5, dtype=torch.bool), torch.arange(5).expand(2, -1))
    cache.keep_slots(torch.tensor([[False, True, False, True, True], [True] * 5]))
    assert cache.lengths.tolist() == [3, 5]
    assert cache.read(0)[0][0, 0, :3, 0].tolist() == [1.0, 3.0, 4.0]
    assert cache.cached_positions()[0, :3].tolist() == [1, 3, 4]
    assert cache.read(0)[0][1, 0, :, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
