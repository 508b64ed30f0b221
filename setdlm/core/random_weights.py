"""Random weights for untrained models used in tests and benchmarks.

The official initialization zeroes the DiT output layer, so an untrained model gives every
token the same logit and every decoding decision is a tie. Redrawing every matrix from a
seeded normal distribution (norm gains set to 1) gives varied, reproducible predictions.
"""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def redraw_weights(model: torch.nn.Module, seed: int, gain: float = 1.0) -> torch.nn.Module:
    """Every matrix ~ N(0, (gain / sqrt(fan_in))^2) in sorted-name order; norm weights = 1."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in sorted(model.named_parameters()):
        if parameter.ndim >= 2:
            scale = gain / math.sqrt(parameter.shape[-1])
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
        elif "norm" in name:
            parameter.fill_(1.0)
    return model
