"""The stopping and rejection rules of unconditional generation (SPEC 5.3), on token lists.

Stopping (the official ``EntropyEosStoppingCriteria``), earliest rule first:

1. the first generated EOS: the decoding engine applies it online (``eos_token_ids``);
2. after at least ``min_tokens`` generated tokens, ``run`` consecutive tokens committed with a
   confidence below ``threshold``;
3. the unigram entropy of the last ``window`` tokens below ``threshold`` (nats); the paper's
   ("legacy") behaviour then also drops those ``window`` tokens.

Rules 2 and 3 are applied here, to the engine's output, at the earliest point of the token
list where they hold. That gives exactly the tokens an online check would keep: the engine
checks rules on the contiguous decoded prefix, and a token of that prefix never changes once
decoded, so the first prefix meeting a rule is the same whether or not decoding went on. What
differs is cost: decoding continued past that point (counted as decoded tokens, not kept).

Rejection: a kept sample whose unigram entropy is below ``entropy_below`` or whose length is
at most ``length_at_most`` tokens is regenerated.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from setdlm.eval.gen_ppl import unigram_entropy


@dataclass(frozen=True)
class LowConfidenceStop:
    min_tokens: int = 128  # the rule looks only at prefixes of at least this many tokens
    run: int = 4  # consecutive low-confidence tokens that stop
    threshold: float = 0.005  # confidence = probability of the committed token when committed

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EntropyStop:
    window: int = 128  # tokens whose unigram entropy is checked
    threshold: float = 4.0  # nats
    drop_window: bool = True  # the paper's ("legacy") behaviour: drop the window when it fires

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Rejection:
    entropy_below: float = 4.0  # nats, over the kept tokens
    length_at_most: int = 50  # kept tokens
    max_attempts: int = 10  # generations per sample at most; the last one is kept regardless

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def to_dict(self) -> dict:
        return asdict(self)

    def verdict(self, tokens: Sequence[int]) -> str | None:
        """Why a kept sample is rejected ("short", "low_entropy"), or None if accepted."""
        if len(tokens) <= self.length_at_most:
            return "short"
        if unigram_entropy(tokens) < self.entropy_below:
            return "low_entropy"
        return None


def low_confidence_stop_point(confidences: Sequence[float], rule: LowConfidenceStop) -> int | None:
    """Shortest prefix length ending in ``rule.run`` consecutive confidences below the
    threshold, among prefixes of at least ``rule.min_tokens`` tokens; None if there is none."""
    streak = 0
    for end, confidence in enumerate(confidences, start=1):
        streak = streak + 1 if confidence < rule.threshold else 0
        if streak >= rule.run and end >= rule.min_tokens:
            return end
    return None


def entropy_stop_point(tokens: Sequence[int], rule: EntropyStop) -> int | None:
    """Shortest prefix length whose last ``rule.window`` tokens have unigram entropy below the
    threshold; None if there is none.

    The window's entropy is updated in O(1) per token: H = log w - S / w with S = sum c log c
    over the window's token counts c.
    """
    window = rule.window
    if len(tokens) < window:
        return None
    counts: Counter[int] = Counter()
    s = 0.0  # sum over the window's distinct tokens of c log c

    def change(token: int, delta: int) -> None:
        nonlocal s
        before = counts[token]
        after = before + delta
        s += _c_log_c(after) - _c_log_c(before)
        counts[token] = after

    for end, token in enumerate(tokens, start=1):
        change(token, +1)
        if end > window:
            change(tokens[end - window - 1], -1)
        if end >= window and math.log(window) - s / window < rule.threshold:
            return end
    return None


def _c_log_c(count: int) -> float:
    return count * math.log(count) if count > 0 else 0.0


def apply_stop_rules(
    tokens: Sequence[int],
    engine_stopped: bool,
    eos_token_ids: Sequence[int],
    confidences: Sequence[float] | None,
    low_confidence: LowConfidenceStop | None,
    entropy: EntropyStop | None,
) -> tuple[list[int], str]:
    """The tokens kept from one generation and why it ended.

    ``tokens`` is the engine's output, which ends at the token that met one of its own stop
    rules when ``engine_stopped`` (the first EOS here). Returns the kept tokens, without that
    EOS, and one of "eos", "engine_stop_rule", "low_confidence", "entropy", "max_new_tokens".
    At the same prefix length the engine's stop wins, then low confidence, then entropy.
    """
    ends = []  # (prefix length, rule order, reason)
    if engine_stopped:
        at_eos = bool(tokens) and tokens[-1] in eos_token_ids
        ends.append((len(tokens), 0, "eos" if at_eos else "engine_stop_rule"))
    if low_confidence is not None:
        if confidences is None or len(confidences) != len(tokens):
            raise ValueError("the low-confidence stop rule needs one confidence per token")
        end = low_confidence_stop_point(confidences, low_confidence)
        if end is not None:
            ends.append((end, 1, "low_confidence"))
    if entropy is not None:
        end = entropy_stop_point(tokens, entropy)
        if end is not None:
            ends.append((end, 2, "entropy"))
    if not ends:
        return list(tokens), "max_new_tokens"
    end, _, reason = min(ends)
    if reason == "eos":
        return list(tokens[: end - 1]), reason
    if reason == "entropy" and entropy.drop_window:
        return list(tokens[: end - entropy.window]), reason
    return list(tokens[:end]), reason
