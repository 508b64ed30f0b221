"""A per-sequence KV cache shared by every backbone and every family.

Each sequence of a batch keeps its own number of cached tokens, because families commit a
different number of tokens per step (SetDLM commits every token above the confidence threshold,
so two sequences of one batch diverge after the first step). Keys and values live in
preallocated buffers of shape (B, H, capacity, D); ``lengths[b]`` says how many leading slots of
row b hold committed tokens. Slots past a row's length hold stale data and are hidden from
attention by ``key_valid``.

A forward with a cache works in two phases:
1. the backbone reads the committed keys/values of each layer (``read``) and attends over
   [committed slots | the new inputs]; it hands the new inputs' keys/values to ``stash``;
2. the decoding engine decides which of the new inputs become committed (``commit``); the rest
   (mask-token queries) are dropped. Keys are stored after RoPE, so slot order never matters
   for attention; the original positions are kept only to crop by position.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, device: torch.device | str = "cpu"):
        self.num_layers = num_layers
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # (B,)
        # The same lengths on the host: read for every layer of every forward, so reading them
        # must not wait for the device.
        self._host_lengths = [0] * batch_size
        self._key_valid: torch.Tensor | None = None
        self.positions = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)
        self._keys: list[torch.Tensor | None] = [None] * num_layers  # (B, H, cap, D)
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._stash: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    # ----------------------------------------------------------------- reading
    @property
    def lengths_on_host(self) -> list[int]:
        return list(self._host_lengths)

    @property
    def width(self) -> int:
        """Number of key slots a forward attends over: the longest row's length."""
        return max(self._host_lengths, default=0)

    def key_valid(self) -> torch.Tensor:
        """(B, width) bool: slot s of row b holds a committed token."""
        if self._key_valid is None:
            slots = torch.arange(self.width, device=self.device)
            self._key_valid = slots[None, :] < self.lengths[:, None]
        return self._key_valid

    def cached_positions(self) -> torch.Tensor:
        """(B, width) long: original position of each cached token (stale past ``lengths``)."""
        return self.positions[:, : self.width]

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Committed (keys, values) of a layer, each (B, H, width, D); None when empty."""
        keys, values = self._keys[layer], self._values[layer]
        if keys is None or self.width == 0:
            return None
        return keys[:, :, : self.width], values[:, :, : self.width]

    # ----------------------------------------------------------------- writing
    def stash(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold the (B, H, Q, D) keys/values of the current forward's inputs until ``commit``."""
        self._stash[layer] = (keys, values)

    def commit(self, keep: torch.Tensor, positions: torch.Tensor) -> None:
        """Append the stashed inputs selected by ``keep`` and drop the rest.

        keep: (B, Q) bool, which inputs of the last forward become cached, appended in input
        order after each row's current length. positions: (B, Q) original positions.
        """
        if any(s is None for s in self._stash):
            raise RuntimeError("commit() without a preceding forward that stashed every layer")
        keep = keep.to(self.device, torch.bool)
        rows, cols = keep.nonzero(as_tuple=True)
        if rows.numel() == 0:
            self.discard_stash()
            return
        added = keep.sum(dim=1)  # (B,)
        new_lengths = self.lengths + added
        self._ensure_capacity(int(new_lengths.max()))
        # destination slot of each kept input: its row's length + its rank among kept inputs
        rank = torch.cumsum(keep.long(), dim=1) - 1  # (B, Q)
        slots = self.lengths[rows] + rank[rows, cols]
        for layer, (keys, values) in enumerate(self._stash):
            self._keys[layer][rows, :, slots] = keys[rows, :, cols]
            self._values[layer][rows, :, slots] = values[rows, :, cols]
        self.positions[rows, slots] = positions.to(self.device)[rows, cols]
        self._set_lengths(new_lengths.tolist())
        self.discard_stash()

    def commit_prefix(self, counts: list[int], positions: torch.Tensor) -> None:
        """``commit`` for the common case: row b keeps its first ``counts[b]`` inputs.

        Decoding commits a prefix every step, so this path copies slices (one copy per layer
        when every row has the same length and count) instead of scattering by index.
        """
        if not any(counts):
            self.discard_stash()
            return
        lengths = self._host_lengths
        new_lengths = [length + count for length, count in zip(lengths, counts, strict=True)]
        self._ensure_capacity(max(new_lengths))
        positions = positions.to(self.device)
        if len(set(lengths)) == 1 and len(set(counts)) == 1:
            spans = [(slice(None), lengths[0], counts[0])]
        else:
            spans = [(b, lengths[b], count) for b, count in enumerate(counts) if count]
        for layer, (keys, values) in enumerate(self._stash):
            for rows, start, count in spans:
                self._keys[layer][rows, :, start : start + count] = keys[rows, :, :count]
                self._values[layer][rows, :, start : start + count] = values[rows, :, :count]
        for rows, start, count in spans:
            self.positions[rows, start : start + count] = positions[rows, :count]
        self._set_lengths(new_lengths)
        self.discard_stash()

    def _set_lengths(self, lengths: list[int]) -> None:
        self._host_lengths = list(lengths)
        self.lengths = torch.tensor(lengths, dtype=torch.long, device=self.device)
        self._key_valid = None

    def discard_stash(self) -> None:
        """Forget the last forward's inputs without caching any of them."""
        self._stash = [None] * self.num_layers

    def keep_slots(self, keep: torch.Tensor) -> None:
        """Keep only the cached slots selected by ``keep`` (B, width) bool, compacted in order.

        The families use it to crop: drop the oldest slots (left crop) or the smallest
        original positions, when the cache would outgrow the model length.
        """
        width = self.width
        keep = keep[:, :width] & self.key_valid()
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # kept slots first
        for layer in range(self.num_layers):
            if self._keys[layer] is None:
                continue
            keys, values = self._keys[layer], self._values[layer]
            index = order[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            keys[:, :, :width] = torch.gather(keys[:, :, :width], 2, index)
            values[:, :, :width] = torch.gather(values[:, :, :width], 2, index)
        self.positions[:, :width] = torch.gather(self.positions[:, :width], 1, order)
        self._set_lengths(keep.sum(dim=1).tolist())

    def _ensure_capacity(self, needed: int) -> None:
        capacity = self.positions.shape[1]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity, 16)
        for layer, (keys, _) in enumerate(self._stash):
            heads, head_dim = keys.shape[1], keys.shape[3]
            for store in (self._keys, self._values):
                grown = keys.new_zeros(self.batch_size, heads, new_capacity, head_dim)
                if store[layer] is not None:
                    grown[:, :, :capacity] = store[layer]
                store[layer] = grown
        grown_positions = self.positions.new_zeros(self.batch_size, new_capacity)
        grown_positions[:, :capacity] = self.positions
        self.positions = grown_positions
