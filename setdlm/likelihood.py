"""Held-out NLL, perplexity and bits per token/byte, for every family.

What is measured differs by family and is reported with the number: AR gives the exact NLL;
MDLM and BD3LM give the NELBO (an upper bound on the NLL); SetDLM gives the exact NLL under one
sampled staggered order (an upper bound on -log E_order p(x)). Aggregation follows the
official metric: total NLL over total counted tokens of the whole set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

WHAT_IS_MEASURED = {
    "ar": "exact NLL",
    "mdlm": "NELBO (upper bound on NLL), one t per sequence",
    "bd3lm": "NELBO (upper bound on NLL), one t per block",
    "setdlm": "NLL of one sampled staggered order (upper bound on NLL)",
}


@dataclass(frozen=True)
class LikelihoodResult:
    nll: float  # nats per counted token
    perplexity: float
    bits_per_token: float
    bits_per_byte: float | None
    tokens: int
    sequences: int
    measured: str

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def evaluate_likelihood(
    model, batches: Iterable[dict[str, torch.Tensor]], seed: int = 0, tokenizer=None
) -> LikelihoodResult:
    """Sum the family's eval-mode loss terms over ``batches`` (noise drawn from ``seed``).

    With a tokenizer, bits per byte divide the total by the UTF-8 bytes of the counted tokens.
    """
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total_nll, total_tokens, total_bytes, sequences = 0.0, 0, 0, 0
    for batch in batches:
        output = model.loss(batch, generator=generator)
        total_nll += float(output.nlls.double().sum())
        total_tokens += int(output.token_mask.sum())
        sequences += len(batch["input_ids"])
        if tokenizer is not None:
            counted = _counted_positions(batch["input_ids"], output)
            total_bytes += _utf8_bytes(batch["input_ids"], counted, tokenizer)
    model.train(was_training)
    if total_tokens == 0:
        raise ValueError("no token was counted: every batch was padding or context")
    nll = total_nll / total_tokens
    return LikelihoodResult(
        nll=nll,
        perplexity=math.exp(nll),
        bits_per_token=nll / math.log(2),
        bits_per_byte=total_nll / math.log(2) / total_bytes if total_bytes else None,
        tokens=total_tokens,
        sequences=sequences,
        measured=WHAT_IS_MEASURED[model.config.family],
    )


def _counted_positions(input_ids: torch.Tensor, output) -> torch.Tensor:
    """(B, L) bool: which input positions the loss counted, in the original order.

    Loss terms may skip leading positions (AR predicts from position 1 on; eval drops a clean
    BOS) and SetDLM's terms are in its sampled order, which its extras record.
    """
    token_mask = output.token_mask.bool().cpu()
    offset = input_ids.shape[1] - token_mask.shape[1]
    counted = torch.zeros(input_ids.shape, dtype=torch.bool)
    order = (output.extras or {}).get("order")
    if order is None:
        counted[:, offset:] = token_mask
    else:
        counted.scatter_(1, order[:, offset:].cpu(), token_mask)
    return counted


def _utf8_bytes(input_ids: torch.Tensor, counted: torch.Tensor, tokenizer) -> int:
    """UTF-8 bytes of the text of the counted tokens, row by row in their original order."""
    total = 0
    for ids, mask in zip(input_ids.cpu(), counted, strict=True):
        text = tokenizer.decode(ids[mask].tolist(), skip_special_tokens=False)
        total += len(text.encode("utf-8"))
    return total
