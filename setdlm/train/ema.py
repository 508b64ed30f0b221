"""Exponential moving average of a model's parameters, kept in fp32.

After every optimizer step ``shadow = decay * shadow + (1 - decay) * param``, starting from the
initial parameters (Composer's EMA as the official runs use it, decay 0.9999). The shadow stays
fp32 whatever the parameter dtype, so tiny increments of ``1 - decay`` are not rounded away.
Evaluation and export use the shadow weights; training continues on the raw ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class ExponentialMovingAverage:
    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        # named_parameters drops tied duplicates, so a shared tensor is averaged once.
        self.shadow = {
            name: param.detach().to(torch.float32, copy=True)
            for name, param in model.named_parameters()
        }

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        for name, param in model.named_parameters():
            self.shadow[name].mul_(self.decay).add_(param.detach().float(), alpha=1 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing, unexpected = set(self.shadow) - set(state), set(state) - set(self.shadow)
        if missing or unexpected:
            raise KeyError(
                f"EMA state does not match the model: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
        for name, value in state.items():
            self.shadow[name].copy_(value)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        """Overwrite the model's parameters with the averaged ones (cast to their dtype)."""
        copy_averaged_weights(self.shadow, model)

    @contextmanager
    def applied_to(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """Evaluate with the averaged weights, then put the raw training weights back."""
        raw = {name: param.detach().clone() for name, param in model.named_parameters()}
        self.copy_to(model)
        try:
            yield model
        finally:
            copy_averaged_weights(raw, model)


@torch.no_grad()
def copy_averaged_weights(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Copy name -> tensor weights into the model's parameters; every parameter must be named."""
    params = dict(model.named_parameters())
    if set(params) != set(weights):
        raise KeyError(
            f"weights do not match the model: missing {sorted(set(params) - set(weights))}, "
            f"unexpected {sorted(set(weights) - set(params))}"
        )
    for name, param in params.items():
        param.copy_(weights[name])
