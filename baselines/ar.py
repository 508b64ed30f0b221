"""Autoregression: left to right, one token per step, KV cache committed every step.

config -> mask (causal) -> loss (next-token cross-entropy) -> decoding policy (next token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from setdlm.core import masks
from setdlm.core.decoding import OrderPolicy, PolicyOptions, RowInputs, RowState
from setdlm.core.family import Family, per_sequence_mean
from setdlm.core.outputs import LossOutput


class AR(Family):
    def loss(self, batch, *, generator=None, randomness=None) -> LossOutput:
        """Mean next-token NLL over target tokens; no randomness.

        A label counts when it is a target (not prompt, not padding). With official_compat the
        count follows the official code instead: a label counts when its *input* position is a
        target, so the first answer token is never scored and the token after the last real
        token (padding) is.
        """
        del generator, randomness  # AR has no noise
        ids, attention, context = self.batch_tensors(batch)  # (B, L) each
        inputs, labels = ids[:, :-1], ids[:, 1:]  # (B, L-1): position i predicts token i + 1
        length = inputs.shape[1]
        positions = torch.arange(length, device=ids.device).expand(ids.shape[0], -1)
        # Right padding only follows the real tokens, so a causal mask alone is exact for them.
        mask = masks.causal_mask(length, device=ids.device).expand(ids.shape[0], -1, -1)
        logits = self.backbone(inputs, positions, mask)  # (B, L-1, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        target_log_probs = log_probs.gather(-1, labels[..., None]).squeeze(-1)  # (B, L-1)
        target = attention & ~context  # (B, L)
        # the label's own flag (ours), or its input's (the official off-by-one, SPEC 8.3)
        token_mask = (target[:, :-1] if self.config.official_compat else target[:, 1:]).float()
        nlls = -target_log_probs * token_mask
        loss = per_sequence_mean(nlls, token_mask.sum(dim=-1))
        return LossOutput(loss, nlls, token_mask, {"target_log_probs": target_log_probs})


@dataclass(frozen=True)
class NextTokenOptions(PolicyOptions):
    """The next-token policy has no knobs."""

    name = "next-token"
    flat_identity = True


class NextTokenPolicy(OrderPolicy):
    """Prefill the prompt causally; then feed the newest token, cache it, predict the next."""

    Options = NextTokenOptions

    def setup(self, row: RowState) -> None:
        if row.infill:
            raise ValueError("AR decodes left to right: give it the left context, not masks")
        if row.prompt_length == 0:
            raise ValueError("AR needs a non-empty prompt (at least a BOS token)")

    def prefill(self, row: RowState) -> RowInputs:
        n = row.prompt_length
        targets = [(n - 1, n)] if row.generated else []
        return RowInputs(list(range(n)), masks.causal_mask(n), n, targets, k=1)

    def plan(self, row: RowState) -> RowInputs | None:
        decoded = row.prompt_length + row.committed
        if decoded >= len(row.tokens):
            return None
        return RowInputs([decoded - 1], None, 1, [(0, decoded)], k=1)

    def observe(self, row: RowState, committed: list[int]) -> None:
        del row, committed  # the next position follows from the committed count
