"""Turning logits into tokens and confidences, and the confidence rule that picks a set."""

from __future__ import annotations

import functools

import torch

MASKED_LOGIT = -1e12  # the official value: large enough to vanish in float32 softmax


def probabilities(logits: torch.Tensor, mask_token_id: int | None) -> torch.Tensor:
    """(B, D, V) logits -> probabilities exp(x - logsumexp(x)), in the logits' own dtype, with
    the mask token excluded as a prediction.

    This is the official computation (log-probs from ``x - logsumexp(x)``, then ``exp``), not
    softmax: near saturation the log-sum-exp rounds to the largest logit, so a confident
    position gets a probability of exactly 1.0 where softmax gives a value 1-2 ulps below it.
    Several positions then share the top confidence and the tie-break below decides which one
    a step commits. The dtype is the backbone's (float32 here; bf16 logits give bf16
    confidences, as in the official code, whose backbones do not upcast their logits).
    Writes into ``logits``: callers pass a tensor of their own (gathered target rows).
    """
    if mask_token_id is not None:
        logits[..., mask_token_id] = MASKED_LOGIT
    return (logits - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()


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
    # argmax keeps the first of equal probabilities, as the official float64 argmax does
    tokens = probs.argmax(dim=-1)
    confidence = probs.gather(-1, tokens[..., None]).squeeze(-1)
    return tokens, confidence


def select_by_confidence(
    confidence: list[float],
    decoded: list[bool] | None,
    k: int,
    threshold: float,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[int]:
    """Which entries of one ranked row to commit: the ``k`` most confident undecoded ones plus
    every undecoded one whose confidence is at least ``threshold``. Returns indices, in order.

    confidence: the row's values (exact Python floats of the ``dtype`` they were computed in);
    decoded: the row's entries that are already decoded (None: none). The row is the one the
    official sampler ranks: for MDLM and BD3LM the whole current block (decoded slots
    included), for SetDLM the masked slots of the window, in position order.

    The official rule (``MDLM._generate_unconditional``, "always decode the most confident
    token"), followed step by step because it decides the commits whenever confidences tie,
    which they do once they saturate at 1.0:
    1. decoded entries get confidence +inf;
    2. ``argsort`` ascending with torch's default sort (not the stable one), on the row's own
       device and dtype; the last (#decoded + k) entries are kept, all of them when that is the
       whole row. On CPU torch sorts rows of at most 16 values stably, so among equal
       confidences the **later** position is kept; longer rows (and CUDA) order equal values as
       that sort does, which is why ties are settled by calling the same sort on the same
       values rather than by a rule of our own. Without a tie at the boundary of the k kept,
       every sort keeps the same entries, so that case is settled without one (fast);
    3. the threshold is tested afterwards and independently of the ranking, on the confidence
       in its dtype: torch compares a bf16 confidence with τ rounded to bf16 (0.9 becomes
       0.8984375), a float32 one with τ rounded to float32.
    """
    open_entries = [i for i in range(len(confidence)) if decoded is None or not decoded[i]]
    if k >= len(open_entries):
        return open_entries
    ranked = sorted(open_entries, key=confidence.__getitem__, reverse=True)
    if confidence[ranked[k - 1]] != confidence[ranked[k]]:
        chosen = set(ranked[:k])
    else:  # a tie at the boundary: torch's sort decides, as in the official sampler
        row = torch.tensor(confidence, dtype=dtype, device=device)
        if decoded is not None:
            row[torch.tensor(decoded, device=device)] = torch.inf
        # the last #decoded + k of the ascending order: the decoded (+inf) and the k kept
        kept = row[None].argsort(dim=-1)[0][len(open_entries) - k :].tolist()
        chosen = set(kept).intersection(open_entries)
    bar = _in_dtype(threshold, dtype)
    chosen.update(i for i in open_entries if confidence[i] >= bar)
    return sorted(chosen)


@functools.lru_cache(maxsize=64)
def _in_dtype(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype``, as torch rounds a Python scalar compared with a tensor."""
    return torch.tensor(value, dtype=dtype).item()


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
