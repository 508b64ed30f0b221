"""Recompute every cached decoding forward without the KV cache.

``Recomputed(family)`` stands in for a family in ``generate``: each forward runs as usual
(with the cache) and again from scratch over [every committed token | the inputs], where each
committed token sees exactly what it saw when it was computed. If the cache is exact, both give
the same logits. ``use_reference=True`` returns the recomputed logits to the engine, so the
tokens chosen without any cache can be compared with the cached run.
"""

from __future__ import annotations

import torch

from setdlm.core.backbones.base import rows_at


class Recomputed:
    def __init__(self, family, use_reference: bool = False):
        self.family = family
        self.use_reference = use_reference
        self.max_difference = 0.0
        self.forwards = 0
        self._history = None  # per row: list of (token, position, visible history indices)
        self._previous = None

    def __getattr__(self, name):
        return getattr(self.family, name)

    def decode_forward(self, input_ids, position_ids, attention_mask, cache, outputs_at=None):
        cached = self.family.decode_forward(
            input_ids, position_ids, attention_mask, cache, outputs_at=outputs_at
        )
        if cache is None:
            return cached
        batch, width = input_ids.shape
        if attention_mask is None:  # everything visible
            keys = cache.width + width
            attention_mask = torch.ones(
                batch, width, keys, dtype=torch.bool, device=input_ids.device
            )
        if self._history is None:
            self._history = [[] for _ in range(batch)]
        self._absorb_commits(cache)
        reference = self._recompute(input_ids, position_ids, attention_mask, cache.width)
        rows = attention_mask.any(dim=-1)  # (B, Q) real inputs
        if outputs_at is not None:  # compare what the engine asked for: the targets' logits
            reference = rows_at(reference, outputs_at)
            rows = rows.gather(1, outputs_at)
        difference = (cached - reference).abs().amax(dim=-1)[rows]
        if difference.numel():
            self.max_difference = max(self.max_difference, difference.max().item())
        self.forwards += 1
        self._previous = (input_ids.cpu(), position_ids.cpu(), attention_mask.cpu(), cache.width)
        return reference if self.use_reference else cached

    def _absorb_commits(self, cache):
        """Move the inputs the engine committed after the previous forward into the history."""
        if self._previous is None:
            return
        ids, positions, mask, old_width = self._previous
        for b, history in enumerate(self._history):
            added = int(cache.lengths[b]) - len(history)
            base = len(history)
            for i in range(added):
                row = mask[b, i]
                if row[old_width + added :].any():
                    raise AssertionError("a cached input attended to an input that was not cached")
                visible = [j for j in range(base) if row[j]]
                visible += [base + j for j in range(added) if row[old_width + j]]
                history.append((int(ids[b, i]), int(positions[b, i]), visible))

    def _recompute(self, input_ids, position_ids, attention_mask, cache_width):
        batch, width = input_ids.shape
        depth = max(len(h) for h in self._history)
        total = depth + width
        ids = torch.full((batch, total), self.family.config.mask_token_id, dtype=torch.long)
        positions = torch.zeros((batch, total), dtype=torch.long)
        mask = torch.zeros((batch, total, total), dtype=torch.bool)
        for b, history in enumerate(self._history):
            for j, (token, position, visible) in enumerate(history):
                ids[b, j], positions[b, j] = token, position
                mask[b, j, visible] = True
            ids[b, depth:] = input_ids[b].cpu()
            positions[b, depth:] = position_ids[b].cpu()
            cached_part = attention_mask[b, :, :cache_width].cpu()
            mask[b, depth:, : len(history)] = cached_part[:, : len(history)]
            mask[b, depth:, depth:] = attention_mask[b, :, cache_width:].cpu()
        device = input_ids.device
        with torch.no_grad():
            logits = self.family.backbone(ids.to(device), positions.to(device), mask.to(device))
        return logits[:, depth:]
