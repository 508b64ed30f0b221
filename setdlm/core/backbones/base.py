"""The contract every backbone follows.

A backbone maps token ids to logits. The family decides everything else: which positions a
token may attend to (a boolean mask), at which position each token sits (position ids, which
RoPE uses, so permuted orders keep their true positions), and what enters the KV cache.

    logits = backbone(input_ids, position_ids, attention_mask, cache=None, timesteps=None,
                      outputs_at=None)

- input_ids, position_ids: (B, Q) long.
- attention_mask: (B, Q, K) bool, True = may attend, where K = cache.width + Q with a cache
  (committed slots first, then the Q new inputs) and K = Q without one. None means every
  query attends to every key. Backbones turn it into an additive mask (0 / finfo.min), as the
  official code does, so fully masked rows (padding) give finite values instead of NaN.
- cache: a ``KVCache``; in each layer the backbone passes its Q inputs' keys/values to
  ``cache.extend`` and attends over the returned [cached | new] keys; the engine then commits
  the inputs it keeps.
- timesteps: (B,) float noise level for time-conditioned (adaLN) backbones; zeros otherwise.
- outputs_at: (B, D) long, the inputs whose logits are wanted (the decoding targets); the
  final norm and the LM head run on those rows only, which with a real vocabulary (151k
  for Qwen3) is a large part of a forward. None: every input.
- returns (B, Q, V) float logits over the backbone vocabulary, or (B, D, V) with outputs_at.
"""

from __future__ import annotations

import torch


def rows_at(hidden: torch.Tensor, outputs_at: torch.Tensor | None) -> torch.Tensor:
    """(B, Q, H) hidden states -> (B, D, H) at the inputs ``outputs_at`` (B, D); all if None."""
    if outputs_at is None:
        return hidden
    return hidden.gather(1, outputs_at[..., None].expand(-1, -1, hidden.shape[-1]))


def additive_attention_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, K) bool -> (B, 1, Q, K) additive float mask: 0 where allowed, finfo.min elsewhere."""
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    blocked.masked_fill_(~allowed, torch.finfo(dtype).min)
    return blocked[:, None]
