"""Logits processors, applied once per forward to every predicted position at the same time.

The official samplers loop over positions in Python and call transformers' processors one row
at a time; these are the same formulas vectorized over (B, D, V).
"""

from __future__ import annotations

import torch


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on every token already seen by the row.

    logits: (B, D, V); seen: (B, V) bool, best on the host (the engine builds it there): the seen
    columns are found where it lies, so a GPU is not waited for. A seen token's logit is divided
    by ``penalty`` when positive and multiplied by it when negative (transformers'
    RepetitionPenaltyLogitsProcessor).

    Only the columns some row has seen are computed (a few hundred of a 50k-151k vocabulary):
    the same operations on the same values, so the same bits, at a fraction of the passes over
    (B, D, V) that a penalty of every column would take (5 of them, against one copy).
    """
    columns = seen.any(dim=0).nonzero().squeeze(-1)  # (C,) ids seen by at least one row
    if columns.numel() == logits.shape[-1]:  # a small vocabulary, all of it seen
        return _penalized(logits, seen.to(logits.device), penalty)
    seen_columns = seen.index_select(-1, columns).to(logits.device)  # (B, C)
    columns = columns.to(logits.device)
    chosen = _penalized(logits.index_select(-1, columns), seen_columns, penalty)  # (B, D, C)
    return logits.index_copy(-1, columns, chosen)


def _penalized(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits: (B, D, W) with seen: (B, W) bool on the same device; the seen ones penalized."""
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen[:, None, :], penalized, logits)


def exponential_length_penalty(
    logits: torch.Tensor,
    generated_before: torch.Tensor,
    start: int,
    factor: float,
    eos_token_ids: tuple[int, ...],
) -> torch.Tensor:
    """Raise the EOS logits of positions that come late in the generation.

    logits: (B, D, V); generated_before: (B, D) number of generated tokens visible left of each
    predicted position (for AR: the number generated so far). Past ``start`` tokens, EOS gains
    |logit| * (factor ** (n - start) - 1), as transformers' ExponentialDecayLengthPenalty does
    with the prompt length as its offset.
    """
    excess = (generated_before - start).clamp(min=0).to(logits.dtype)  # (B, D)
    growth = torch.where(excess > 0, factor**excess - 1, torch.zeros_like(excess))  # (B, D)
    eos = torch.tensor(eos_token_ids, device=logits.device)
    eos_logits = logits[..., eos]  # (B, D, E)
    bonus = eos_logits.abs() * growth[..., None]
    bonus = bonus.masked_fill(~torch.isfinite(eos_logits), 0.0)
    logits = logits.clone()
    logits[..., eos] = eos_logits + bonus
    return logits


def token_presence(rows: list[list[int]], vocab_size: int, device) -> torch.Tensor:
    """(B, V) bool: which token ids occur in each row's list."""
    seen = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
    for b, tokens in enumerate(rows):
        if tokens:
            index = torch.tensor(tokens, device=device).clamp(max=vocab_size - 1)
            seen[b, index] = True
    return seen
