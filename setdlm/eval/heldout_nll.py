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

from setdlm.families import family as family_info


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
def sequence_terms(model, batch, generator, num_samples: int = 1, tokenizer=None) -> list[dict]:
    """Per sequence of ``batch``: the NLL (or bound) summed over its counted tokens, averaged
    over ``num_samples`` Monte-Carlo draws of the family's noise (t, masks or order), its
    counted tokens and (with a tokenizer) their UTF-8 bytes."""
    totals = torch.zeros(len(batch["input_ids"]), dtype=torch.float64)
    for _ in range(num_samples):
        output = model.loss(batch, generator=generator)
        totals += output.nlls.double().sum(dim=-1).cpu()
    tokens = output.token_mask.sum(dim=-1).long().tolist()
    counted = _counted_positions(batch["input_ids"], output) if tokenizer is not None else None
    terms = []
    for row in range(len(tokens)):
        term = {"nll": float(totals[row]) / num_samples, "tokens": tokens[row]}
        if counted is not None:
            term["bytes"] = _utf8_bytes(
                batch["input_ids"][row : row + 1], counted[row : row + 1], tokenizer
            )
        terms.append(term)
    return terms


def summarize(terms: list[dict], family: str, num_samples: int = 1) -> LikelihoodResult:
    """Total NLL over total counted tokens (the official aggregation), and the derived units."""
    total_nll = sum(t["nll"] for t in terms)
    total_tokens = sum(t["tokens"] for t in terms)
    total_bytes = sum(t.get("bytes", 0) for t in terms)
    if total_tokens == 0:
        raise ValueError("no token was counted: every sequence was padding or context")
    nll = total_nll / total_tokens
    info = family_info(family)
    measured = info.likelihood
    if num_samples > 1 and not info.likelihood_exact:  # a bound or an order: draws averaged
        measured += f", averaged over {num_samples} Monte-Carlo draws"
    return LikelihoodResult(
        nll=nll,
        perplexity=math.exp(nll),
        bits_per_token=nll / math.log(2),
        bits_per_byte=total_nll / math.log(2) / total_bytes if total_bytes else None,
        tokens=total_tokens,
        sequences=len(terms),
        measured=measured,
    )


def evaluate_likelihood(
    model,
    batches: Iterable[dict[str, torch.Tensor]],
    seed: int = 0,
    tokenizer=None,
    num_samples: int = 1,
) -> LikelihoodResult:
    """Held-out likelihood of ``batches`` in eval mode (noise drawn from ``seed``)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    terms = []
    for batch in batches:
        terms += sequence_terms(model, batch, generator, num_samples, tokenizer)
    model.train(was_training)
    return summarize(terms, model.config.family, num_samples)


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
