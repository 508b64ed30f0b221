"""An endless, resumable stream of micro-batches whose order depends only on (seed, epoch).

Each epoch visits the dataset in the permutation ``randperm(N, seed=derive_seed(seed, epoch))``,
cut into global batches of ``batch_size * world_size`` items; process ``rank`` takes its own
``batch_size`` slice of every global batch. The position is just (epoch, batch index), so a
checkpoint can store it and a resumed run yields exactly the batch that would have come next,
with no need to replay or fast-forward anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch


def derive_seed(seed: int, *labels: object) -> int:
    """A 63-bit seed from a base seed and labels; stable across processes, Python and platforms.

    Python's ``hash`` is salted per process, so a cryptographic digest is used instead.
    """
    key = ":".join(str(part) for part in (seed, *labels)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def collate(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack same-keyed items of (L,) tensors into a batch of (B, L) tensors."""
    keys = set(items[0])
    for position, item in enumerate(items):
        if set(item) != keys:
            raise ValueError(
                f"batch item {position} has keys {sorted(item)}, expected {sorted(keys)}"
            )
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}


class ResumableBatchLoader:
    """Micro-batches of ``batch_size`` items for one process, forever, in a reproducible order."""

    def __init__(
        self,
        dataset: Sequence[dict[str, torch.Tensor]],
        batch_size: int,
        seed: int,
        *,
        rank: int = 0,
        world_size: int = 1,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.global_batch_size = batch_size * world_size
        # Incomplete global batches are dropped so every process sees equal-sized batches.
        self.batches_per_epoch = len(dataset) // self.global_batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"dataset has {len(dataset)} items, fewer than one global batch of "
                f"{self.global_batch_size} (batch_size {batch_size} x {world_size} processes)"
            )
        self.epoch = 0
        self.batch_index = 0
        self._order_epoch = -1
        self._order = torch.empty(0, dtype=torch.long)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """(N,) the permutation of item indices visited in ``epoch``."""
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "data-order", epoch))
        return torch.randperm(len(self.dataset), generator=generator)

    def next_batch(self) -> dict[str, torch.Tensor]:
        if self._order_epoch != self.epoch:
            self._order = self.epoch_order(self.epoch)
            self._order_epoch = self.epoch
        start = self.batch_index * self.global_batch_size + self.rank * self.batch_size
        indices = self._order[start : start + self.batch_size].tolist()
        self.batch_index += 1
        if self.batch_index == self.batches_per_epoch:
            self.epoch, self.batch_index = self.epoch + 1, 0
        return collate([self.dataset[index] for index in indices])

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """The position of the next batch, plus what must match for the position to mean it."""
        return {
            "epoch": self.epoch,
            "batch_index": self.batch_index,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "dataset_length": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "dataset_length": len(self.dataset),
        }
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"data position was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={value!r}; the saved position would point at different batches"
                )
        if not 0 <= state["batch_index"] < self.batches_per_epoch or state["epoch"] < 0:
            raise ValueError(f"data position {state} is outside {self.batches_per_epoch} batches")
        self.epoch, self.batch_index = int(state["epoch"]), int(state["batch_index"])
