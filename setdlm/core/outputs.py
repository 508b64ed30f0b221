"""Result types shared by every family."""

from __future__ import annotations

from typing import NamedTuple

import torch


class LossOutput(NamedTuple):
    """What ``family.loss(batch, ...)`` returns.

    loss: scalar the optimizer minimizes (mean over the batch of per-sequence token means).
    nlls: (B, L) per-token negative log-likelihood terms (0 where not counted).
    token_mask: (B, L) 1 where a token is counted in ``loss``.
    extras: the randomness actually used (orders, t, noised inputs) and per-token log-probs,
        so a loss can be replayed and compared with recorded values.
    """

    loss: torch.Tensor
    nlls: torch.Tensor
    token_mask: torch.Tensor
    extras: dict | None = None
