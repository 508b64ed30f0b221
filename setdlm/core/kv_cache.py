"""A per-sequence KV cache shared by every backbone and every family.

Each sequence of a batch keeps its own number of cached tokens, because families commit a
different number of tokens per step (SetDLM commits every token above the confidence threshold,
so two sequences of one batch diverge after the first step). Keys and values live in
preallocated buffers of shape (B, H, capacity, D); ``lengths[b]`` says how many leading slots of
row b hold committed tokens. ``width`` is the longest row's length; slots of a row between its
length and ``width`` are stale and hidden from attention by ``key_valid``.

A forward with a cache works in two phases:
1. in every layer the backbone hands its Q new keys/values to ``extend``, which writes them
   into slots [width, width + Q) of the buffer and returns the view [0, width + Q): attention
   runs over [committed slots | new inputs] without concatenating anything;
2. the decoding engine then decides which inputs become committed (``commit_prefix`` or
   ``commit``). A row whose length equals ``width`` keeps its first inputs where they already
   are, so the usual decoding step copies nothing; other rows move their kept inputs down to
   their own length. Inputs not kept (mask-token queries) are simply left beyond the length.
Keys are stored after RoPE, so slot order never matters for attention; original positions are
kept only to crop by position.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        device: torch.device | str = "cpu",
        capacity: int = 64,
    ):
        """capacity: slots allocated at a layer's first write (the engine passes the longest
        canvas, so that buffers are allocated once per call instead of growing as they fill);
        a forward that needs more still grows them."""
        self.num_layers = num_layers
        self.batch_size = batch_size
        self.capacity = capacity
        self.device = torch.device(device)
        # Row lengths live on the host: read for every layer of every forward, so reading them
        # must not wait for the device; their device copy is made when something needs it.
        self._host_lengths = [0] * batch_size
        self._lengths: torch.Tensor | None = None
        self._key_valid: torch.Tensor | None = None
        self.positions = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)
        self._keys: list[torch.Tensor | None] = [None] * num_layers  # (B, H, capacity, D)
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._staged = 0  # inputs written after ``width`` by the last forward

    # ----------------------------------------------------------------- reading
    @property
    def lengths_on_host(self) -> list[int]:
        return list(self._host_lengths)

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) long on the cache's device: committed slots per row."""
        if self._lengths is None:
            self._lengths = torch.tensor(self._host_lengths, dtype=torch.long, device=self.device)
        return self._lengths

    @property
    def width(self) -> int:
        """Number of key slots before a forward's own inputs: the longest row's length."""
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
        width = self.width
        if self._keys[layer] is None or width == 0:
            return None
        return self._keys[layer][:, :, :width], self._values[layer][:, :, :width]

    # ----------------------------------------------------------------- writing
    def extend(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a layer's (B, H, Q, D) new keys/values after ``width``; return both buffers'
        views over [0, width + Q), the keys the forward's queries attend over."""
        width, count = self.width, keys.shape[2]
        self._ensure_capacity(layer, width + count, keys)
        key_buffer, value_buffer = self._keys[layer], self._values[layer]
        key_buffer[:, :, width : width + count] = keys
        value_buffer[:, :, width : width + count] = values
        self._staged = count
        return key_buffer[:, :, : width + count], value_buffer[:, :, : width + count]

    def commit_prefix(self, counts: list[int], positions: torch.Tensor) -> None:
        """Row b keeps the first ``counts[b]`` inputs of the last forward (the decoding case).

        positions: (B, Q) original positions of those inputs.
        """
        self._check_staged(max(counts, default=0))
        width = self.width
        positions = positions.to(self.device)
        self._ensure_position_capacity(width + positions.shape[1])
        self.positions[:, width : width + positions.shape[1]] = positions
        rows, sources, targets = [], [], []  # the moves of every row that is not at width
        for b, count in enumerate(counts):
            start = self._host_lengths[b]
            if count and start != width:
                rows += [b] * count
                sources += range(width, width + count)
                targets += range(start, start + count)
        if rows:
            moves = torch.tensor([rows, sources, targets], device=self.device)  # (3, N)
            self._move(*moves)
        self._set_lengths(
            [length + n for length, n in zip(self._host_lengths, counts, strict=True)]
        )

    def commit(self, keep: torch.Tensor, positions: torch.Tensor) -> None:
        """Row b keeps the inputs where ``keep[b]`` (B, Q) is True, appended in input order."""
        self._check_staged(keep.shape[1] if keep.any() else 0)
        width = self.width
        positions = positions.to(self.device)
        self._ensure_position_capacity(width + positions.shape[1])
        self.positions[:, width : width + positions.shape[1]] = positions
        keep = keep.to(self.device).bool()
        counts = keep.sum(dim=1).tolist()
        rows, inputs = keep.nonzero(as_tuple=True)  # (N,) each, row-major: input order per row
        rank = keep.long().cumsum(dim=1) - 1  # (B, Q): index of a kept input among its row's
        targets = self.lengths[rows] + rank[rows, inputs]
        if len(rows):
            self._move(rows, width + inputs, targets)
        self._set_lengths(
            [length + n for length, n in zip(self._host_lengths, counts, strict=True)]
        )

    def keep_slots(self, keep: torch.Tensor) -> None:
        """Keep only the cached slots selected by ``keep`` (B, width) bool, compacted in order.

        The engine uses it to crop: drop the oldest slots (left crop) or the smallest original
        positions, when the cache would outgrow the model length.
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

    def reset_row(self, row: int) -> None:
        """Empty row ``row`` for a new sequence (continuous batching); its old slots become
        stale, hidden by ``key_valid``."""
        self.truncate_row(row, 0)

    def truncate_row(self, row: int, length: int) -> None:
        """Keep only the first ``length`` slots of row ``row`` (the oldest: slots are in the
        order they were cached); the others become stale, hidden by ``key_valid``."""
        if length >= self._host_lengths[row]:
            return
        lengths = list(self._host_lengths)
        lengths[row] = max(0, length)
        self._set_lengths(lengths)

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only the batch rows ``rows``, in that order (finished rows leave the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for store in (self._keys, self._values):
            for layer, buffer in enumerate(store):
                if buffer is not None:
                    store[layer] = buffer.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self.batch_size = len(rows)
        self._set_lengths([self._host_lengths[r] for r in rows])

    def adopt_rows(self, rows: list[int], other: KVCache) -> None:
        """Row ``rows[i]`` takes row i of ``other`` (a cache filled by a forward of its own, for
        rows that join a running batch); the rows must have been emptied with ``reset_row``."""
        count = other.width
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in range(self.num_layers):
            keys, values = other._keys[layer], other._values[layer]
            if keys is None:
                continue
            self._ensure_capacity(layer, count, keys)
            self._keys[layer][index, :, :count] = keys[:, :, :count]
            self._values[layer][index, :, :count] = values[:, :, :count]
        self._ensure_position_capacity(count)
        self.positions[index, :count] = other.positions[:, :count]
        lengths = list(self._host_lengths)
        for row, length in zip(rows, other.lengths_on_host, strict=True):
            lengths[row] = length
        self._set_lengths(lengths)

    # ----------------------------------------------------------------- internals
    def _move(self, rows: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Copy slot ``sources[i]`` of row ``rows[i]`` to its slot ``targets[i]``, for every i
        at once (N,) each: one indexed copy per buffer, whatever the number of rows. The
        right-hand side is gathered before it is written, so overlapping ranges are safe."""
        for layer in range(self.num_layers):
            for buffer in (self._keys[layer], self._values[layer]):
                buffer[rows, :, targets] = buffer[rows, :, sources]  # (N, H, D) slots
        self.positions[rows, targets] = self.positions[rows, sources]

    def _check_staged(self, needed: int) -> None:
        if needed > self._staged:
            raise RuntimeError(
                f"commit of {needed} inputs but the last forward extended the cache with "
                f"{self._staged}"
            )

    def _set_lengths(self, lengths: list[int]) -> None:
        self._host_lengths = list(lengths)
        self._lengths = None
        self._key_valid = None
        self._staged = 0

    def _ensure_capacity(self, layer: int, needed: int, like: torch.Tensor) -> None:
        buffer = self._keys[layer]
        capacity = 0 if buffer is None else buffer.shape[2]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity, self.capacity)
        _, heads, _, head_dim = like.shape  # like: (any batch, H, Q, D), for dtype and sizes
        for store in (self._keys, self._values):
            grown = like.new_zeros(self.batch_size, heads, new_capacity, head_dim)
            if store[layer] is not None:
                grown[:, :, :capacity] = store[layer]
            store[layer] = grown

    def _ensure_position_capacity(self, needed: int) -> None:
        capacity = self.positions.shape[1]
        if needed > capacity:
            grown = self.positions.new_zeros(
                self.batch_size, max(needed, 2 * capacity, self.capacity)
            )
            grown[:, :capacity] = self.positions
            self.positions = grown
