"""The contract every backbone follows.

A backbone maps token ids to logits. The family decides everything else: which positions a
token may attend to (a boolean mask), at which position each token sits (position ids, which
RoPE uses, so permuted orders keep their true positions), and what enters the KV cache.

    logits = backbone(input_ids, position_ids, attention_mask, cache=None, timesteps=None)

- input_ids, position_ids: (B, Q) long.
- attention_mask: (B, Q, K) bool, True = may attend, where K = cache.width + Q with a cache
  (committed slots first, then the Q new inputs) and K = Q without one. None means every
  query attends to every key. Backbones turn it into an additive mask (0 / finfo.min), as the
  official code does, so fully masked rows (padding) give finite values instead of NaN.
- cache: a ``KVCache``; in each layer the backbone passes its Q inputs' keys/values to
  ``cache.extend`` and attends over the returned [cached | new] keys; the engine then commits
  the inputs it keeps.
- timesteps: (B,) float noise level for time-conditioned (adaLN) backbones; zeros otherwise.
- returns (B, Q, V) float logits over the backbone vocabulary.
"""

from __future__ import annotations

import torch


def additive_attention_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, K) bool -> (B, 1, Q, K) additive float mask: 0 where allowed, finfo.min elsewhere."""
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    blocked.masked_fill_(~allowed, torch.finfo(dtype).min)
    return blocked[:, None]
