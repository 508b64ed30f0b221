"""Turning logits into tokens and confidences, and the confidence rule that picks a set."""

from __future__ import annotations

import torch

MASKED_LOGIT = -1e12  # the official value: large enough to vanish in float32 softmax


def probabilities(logits: torch.Tensor, mask_token_id: int | None) -> torch.Tensor:
    """(B, D, V) logits -> probabilities, with the mask token excluded as a prediction.

    Writes into ``logits``: callers pass a tensor of their own (gathered target rows).
    """
    if mask_token_id is not None:
        logits[..., mask_token_id] = MASKED_LOGIT
    return torch.softmax(logits.float(), dim=-1)


def nucleus_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose mass reaches ``top_p`` (the first token that
    crosses it included), renormalized. probs: (..., V)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    drop = cumulative >= top_p
    drop = torch.cat([torch.zeros_like(drop[..., :1]), drop[..., :-1]], dim=-1)  # shift right
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


def choose_tokens(
    probs: torch.Tensor,
    do_sample: bool,
    generators: list[torch.Generator] | None,
    counts: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy or sampled token per position, and its probability (the confidence).

    probs: (B, D, V); counts[b] = number of real positions in row b (the rest is padding).
    Sampling draws each row's noise from that row's own generator, and only for its real
    positions, so a row's tokens do not depend on what else is in the batch.
    Returns tokens (B, D) long and confidence (B, D) float.
    """
    if do_sample:
        if generators is None:
            raise ValueError("sampling needs one torch.Generator per row")
        # Exponential race: argmax p / E with E ~ Exp(1) samples from p exactly.
        race = torch.full_like(probs, -1.0)
        for b, count in enumerate(counts):
            if count:
                uniform = torch.rand(
                    (count, probs.shape[-1]), generator=generators[b], device=probs.device
                )
                exponential = 1e-10 - (uniform + 1e-10).log()
                race[b, :count] = probs[b, :count] / exponential
        tokens = race.argmax(dim=-1)
        confidence = probs.gather(-1, tokens[..., None]).squeeze(-1)
        return tokens, confidence
    confidence, tokens = probs.max(dim=-1)
    return tokens, confidence


def select_by_confidence(confidence: list[float], k: int, threshold: float) -> list[int]:
    """Indices to commit: the ``k`` most confident plus every one at or above ``threshold``.

    Ties are broken toward the earlier index; the result is in index order.
    """
    ranked = sorted(range(len(confidence)), key=lambda i: (-confidence[i], i))
    chosen = set(ranked[:k])
    chosen.update(i for i, value in enumerate(confidence) if value >= threshold)
    return sorted(chosen)


def tokens_per_step(num_tokens: int, num_steps: int | None) -> list[int]:
    """How many tokens each step must commit at least, as the official linear schedule does.

    Time runs 1 -> 0 over min(num_steps, num_tokens) steps (float64 linspace); step i commits
    round(t_i * n) - round(t_{i+1} * n) tokens, which is 1 per step when steps >= tokens.
    """
    if num_tokens <= 0:
        return []
    steps = num_tokens if num_steps is None else min(num_steps, num_tokens)
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    marks = (times * num_tokens).round().to(torch.int64)
    return (marks[:-1] - marks[1:]).tolist()
