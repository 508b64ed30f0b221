"""Turning logits into tokens and confidences, and the confidence rule that picks a set."""

from __future__ import annotations

import functools
import math

import torch

MASKED_LOGIT = -1e12  # the official value: large enough to vanish in float32 softmax
# Below this many logits in a step (B * D * V), greedy_tokens takes the probability table: its
# few kernel launches (~3 us each on a CPU) cost as much as the passes the top-only computation
# saves. Measured on 2 AMD EPYC cores, top-only time over the table's: 1.3x at 8,192 logits,
# 0.9x at 32,768, 0.7x at 65,536, 0.35-0.7x at GPT-2's and Qwen3's vocabularies
# (docs/checks-and-ci.md, "How a step picks its commits").
TOP_ONLY_MIN_LOGITS = 32768


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


def greedy_tokens(
    logits: torch.Tensor, mask_token_id: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens (B, D) long and their confidences (B, D), bit for bit those of
    ``choose_tokens(probabilities(logits, mask_token_id), do_sample=False, ...)``, without the
    (B, D, V) probability table where that is cheaper: float32 logits on a CPU, at least
    ``TOP_ONLY_MIN_LOGITS`` of them. Writes into ``logits`` as ``probabilities`` does.

    The table costs a log-sum-exp, then an exp and an argmax pass over every logit, but a
    greedy step needs one probability per row: the chosen token's, exp(top - logsumexp), the
    same float operations on the same values as the table's entry. The log-sum-exp is
    ``torch.logsumexp``'s own sequence of operations (the same bits), and its exp(x - top) also
    shows which logits come close to the top. The token is the largest logit unless another
    comes so close that its probability rounds to the same value (the official argmax then
    keeps the earlier one) or, through exp's 1-ulp error, above it; only logits within
    ``_tie_slack`` of the top can, and a step with any such row takes the table.
    """
    vocab = logits.shape[-1]
    if (
        logits.device.type != "cpu"  # an accelerator's passes are cheap; the check would sync
        or logits.dtype != torch.float32  # bf16 ties are common: the slack is ~0.5 logits wide
        or logits.numel() < TOP_ONLY_MIN_LOGITS
    ):
        return choose_tokens(probabilities(logits, mask_token_id), False, None, [])
    if mask_token_id is not None:
        logits[..., mask_token_id] = MASKED_LOGIT
    top = logits.amax(dim=-1, keepdim=True)  # (B, D, 1)
    # torch.logsumexp, step by step: an infinite top shifts by 0 instead
    shift = top.nan_to_num(nan=math.nan, posinf=0.0, neginf=0.0)  # (B, D, 1)
    scaled = (logits - shift).exp_()  # (B, D, V): exp(x - top), exactly 1 at the top
    log_normalizer = scaled.sum(dim=-1, keepdim=True).log_().add_(shift)  # (B, D, 1)
    # 1 where exp(x - top) >= 1 - 2 * slack (every logit within the slack), else 0
    near = scaled.add_(2 * _tie_slack(vocab)).floor_().view(-1, vocab)  # (B*D, V)
    # The top is always near, so the count equals the rows only if no row has a rival
    # (infinite or NaN logits make it differ too). Counts and indices are exact integers.
    if float(near.sum()) != near.shape[0]:
        return choose_tokens(probabilities(logits, None), False, None, [])
    tokens = (near @ _indices(vocab)).long().view(top.shape[:-1])  # (B, D): the one near entry
    confidence = (top - log_normalizer).exp().squeeze(-1)  # (B, D)
    return tokens, confidence


@functools.lru_cache(maxsize=8)
def _tie_slack(vocab: int) -> float:
    """How far below the top logit a float32 logit can be and still reach the top's
    probability: both go through x - logsumexp (each rounded by at most eps/2 of its size) and
    exp (at most 1 ulp off), so they can meet only within eps * (2 + logsumexp - top), and
    logsumexp - top <= log V. The slack is over four times that."""
    return 8 * torch.finfo(torch.float32).eps * (4 + math.log(vocab))


@functools.lru_cache(maxsize=8)
def _indices(vocab: int) -> torch.Tensor:
    """(V,) float32 0, 1, ..., V - 1: exact below 2**24, as are sums with one nonzero term."""
    return torch.arange(vocab, dtype=torch.float32)


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
