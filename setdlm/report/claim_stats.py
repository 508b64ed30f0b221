"""The statistics of a claim: a paired difference, its two intervals, and a verdict under a
stated multiplicity rule.

A difference is drawn on the crossed two-level bootstrap of setdlm/eval/seeds.py, both sides
with the same seed and example indices (``Drawn``), and has two 95 % intervals: the bootstrap's
percentile interval, and the Student-t interval of the mean of its per-seed differences (a
bootstrap over a handful of seeds is too narrow: it divides their variance by n and reads normal
quantiles, so one far seed could carry it). Each interval has the p-value of the test it
inverts: the bootstrap's, twice the share of replicates on the far side of 0; the t test's,
exact. A claim needs both, so its p-value is the larger of the two (an intersection-union test:
it rejects only where both do).

The multiplicity rule: Holm's step-down over the rows of one part of the claims table, at a
family-wise 5 %. Sorted by p-value, the i-th smallest (from 0) is compared with 0.05 / (m - i)
and the adjusted p-value is the running maximum of (m - i) p. A row's verdict is

- "holds": its Holm-adjusted p-value is below 0.05, and both unadjusted intervals exclude 0 on
  the paper's side (the difference is written so that the paper's side is positive);
- "reversed": the same on the other side;
- "no evidence": otherwise.

The unadjusted intervals are shown as they are: an interval that excludes 0 on a row Holm does
not reject is a lead, not a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from setdlm.eval.intervals import mean_t_interval, mean_t_p
from setdlm.eval.seeds import interval, mc_error

HOLDS, REVERSED, NO_EVIDENCE = "holds", "reversed", "no evidence"
ALPHA = 0.05  # family-wise, over the rows of one part
PAPER, BEYOND = "the paper's claims", "beyond the paper"
PARTS = (PAPER, BEYOND)
SCALES = {"pp": 100.0, "tok/s": 1.0, "µs/forward": 1e6}  # shown = scale * the measure's unit


@dataclass(frozen=True)
class Drawn:
    """A point's per-example measure (or a difference of such), ready to be paired."""

    resamples: np.ndarray  # (R,) crossed two-level bootstrap means, indices shared by all
    per_seed: np.ndarray  # (S,) each seed's mean over its examples
    seeds: tuple[str, ...]  # the seed folders, which pair two points' per-seed values
    ids: tuple[str, ...]  # the example ids, in the order the resamples index them

    @property
    def examples(self) -> int:
        return len(self.ids)

    @property
    def estimate(self) -> float:
        return float(self.per_seed.mean())

    def pairs_with(self, other: Drawn) -> bool:
        """Whether the two are of the same seeds and examples, so that their resamples and
        per-seed values combine element by element (one model on each side pairs, whatever
        its folder is called)."""
        one_each = len(self.seeds) == len(other.seeds) == 1
        return (self.seeds == other.seeds or one_each) and self.ids == other.ids

    def minus(self, other: Drawn) -> Drawn:
        self._check_pairs(other)
        resamples, per_seed = self.resamples - other.resamples, self.per_seed - other.per_seed
        return replace(self, resamples=resamples, per_seed=per_seed)

    def toward(self, other: Drawn, weight: float) -> Drawn:
        """The linear interpolation (1 - weight) * self + weight * other."""
        self._check_pairs(other)
        return replace(
            self,
            resamples=(1 - weight) * self.resamples + weight * other.resamples,
            per_seed=(1 - weight) * self.per_seed + weight * other.per_seed,
        )

    def _check_pairs(self, other: Drawn) -> None:
        # numpy would broadcast one seed's value against five, or pair other problems:
        # callers ask pairs_with first, and a caller that forgot is a bug
        if not self.pairs_with(other):
            raise ValueError(
                f"cannot combine seeds {self.seeds} ({self.examples} examples) with "
                f"{other.seeds} ({other.examples}), or their examples differ"
            )


@dataclass(frozen=True)
class Claim:
    part: str  # PAPER or BEYOND
    claim: str
    protocol: str  # where the comparison's protocol comes from
    comparison: str
    unit: str  # the difference's unit as shown ("pp", "tok/s", "µs/forward")
    scale: float  # shown = scale * the measure's own unit (a fraction, seconds)
    difference: float  # the point estimate, the paper's side positive, in the measure's unit
    low: float  # the two-level bootstrap 95 % interval
    high: float
    seeds: int
    examples: int
    p_bootstrap: float
    seed_low: float | None = None  # the t 95 % interval of the per-seed differences' mean;
    seed_high: float | None = None  # None with one seed
    p_seed: float | None = None
    mc_error: float = 0.0  # the Monte-Carlo error of the bootstrap bounds
    adjusted_p: float | None = None  # Holm over its part (``holm``); None: not adjusted yet

    @property
    def p_value(self) -> float:
        """The larger of the two tests' p-values: the claim needs both."""
        return max(self.p_bootstrap, self.p_seed if self.p_seed is not None else 0.0)

    @property
    def side(self) -> str:
        """The side both unadjusted intervals put it on (NO_EVIDENCE: neither agrees)."""
        seed_level = self.seed_low is not None and self.seed_high is not None
        if self.low > 0 and (not seed_level or self.seed_low > 0):
            return HOLDS
        if self.high < 0 and (not seed_level or self.seed_high < 0):
            return REVERSED
        return NO_EVIDENCE

    @property
    def verdict(self) -> str:
        if self.adjusted_p is None:
            raise ValueError(f"{self.claim}: no verdict before the multiplicity rule (holm)")
        return self.side if self.adjusted_p < ALPHA else NO_EVIDENCE


def bootstrap_p(resampled: np.ndarray) -> float:
    """Two-sided p-value of 0 from bootstrap replicates: twice the share on the far side of 0
    (counting 0 itself), each count plus one so that no finite draw claims p = 0."""
    count = len(resampled)
    below = int(np.count_nonzero(resampled <= 0))
    above = int(np.count_nonzero(resampled >= 0))
    return min(1.0, 2 * (min(below, above) + 1) / (count + 1))


def claim_of(
    part: str, claim: str, protocol: str, comparison: str, difference: Drawn, unit: str = "pp"
) -> Claim:
    """The claim on ``difference`` (the paper's side positive, a fraction for "pp", seconds
    for a timing), before its part's Holm."""
    scale = SCALES[unit]
    low, high = interval(difference.resamples)
    seed_level = mean_t_interval(difference.per_seed)
    seed_low, seed_high = seed_level if seed_level is not None else (None, None)
    return Claim(
        part,
        claim,
        protocol,
        comparison,
        unit,
        scale,
        difference.estimate,
        low,
        high,
        len(difference.seeds),
        difference.examples,
        bootstrap_p(difference.resamples),
        seed_low,
        seed_high,
        mean_t_p(difference.per_seed),
        mc_error(difference.resamples),
    )


def holm(claims: list[Claim]) -> list[Claim]:
    """The claims with Holm-adjusted p-values, each part a family of its own (same order)."""
    adjusted = list(claims)
    for part in PARTS:
        members = [i for i, claim in enumerate(claims) if claim.part == part]
        order = sorted(members, key=lambda i: claims[i].p_value)
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (len(order) - rank) * claims[i].p_value))
            adjusted[i] = replace(claims[i], adjusted_p=running)
    return adjusted
