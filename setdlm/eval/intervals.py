"""Seeded 95 % bootstrap intervals of per-example means: one implementation for every task.

A result's quality is a mean over its examples; the interval says how far another draw of the
same number of examples could move it. Resampling is over examples (with replacement), seeded,
and one set of resamples is shared by all metrics of a result, so the intervals of two metrics
of one run are computed on the same resampled sets (as rouge_score's aggregator does).

Over a handful of training seeds a percentile bootstrap is too narrow (it estimates the seed
variance with 1/n and reads normal quantiles), so comparisons over seeds also use Student's t
(``t_975``, ``mean_t_interval``).
"""

from __future__ import annotations

import math
import statistics

import numpy as np

RESAMPLES = 1000
SEED = 0
LEVEL = 0.95


def resampled_indices(count: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(resamples, count) example indices drawn with replacement, seeded: the resamples every
    interval of this module is computed on."""
    return np.random.default_rng(seed).integers(0, count, size=(resamples, count))


def bootstrap_95(
    values: dict[str, list[float]], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, list[float]]:
    """{metric: [low, high]}, the 2.5th and 97.5th percentiles of the resampled means."""
    counts = {len(column) for column in values.values()}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"every metric needs the same, non-zero number of examples: {counts}")
    picks = resampled_indices(counts.pop(), resamples, seed)  # (S, N)
    intervals = {}
    for name, column in values.items():
        means = np.asarray(column, dtype=np.float64)[picks].mean(axis=1)  # (S,)
        low, high = np.percentile(means, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
        intervals[name] = [float(low), float(high)]
    return intervals


def ratio_bootstrap_95(
    numerators: list[float],
    denominators: list[float],
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> list[float]:
    """[low, high] of a total over a total (a held-out NLL: summed nats over counted tokens),
    the examples resampled as ``bootstrap_95`` resamples them, each resample aggregated as the
    value is: sum of the picked numerators over sum of the picked denominators."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError(
            f"need as many numerators as denominators, and some: "
            f"{len(numerators)} and {len(denominators)}"
        )
    picks = resampled_indices(len(numerators), resamples, seed)  # (S, N)
    totals = np.asarray(numerators, dtype=np.float64)[picks].sum(axis=1)  # (S,)
    counts = np.asarray(denominators, dtype=np.float64)[picks].sum(axis=1)  # (S,)
    if (counts <= 0).any():
        raise ValueError("a resample has no denominator: some examples count nothing")
    low, high = np.percentile(totals / counts, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return [float(low), float(high)]


def scored_means(records: list[dict], names) -> dict[str, dict]:
    """{name: {"value": mean, "count": sum, "bootstrap_95": [low, high]}} of the per-example
    0/1 scores ``record["scores"][name]`` (a task adds its definitions)."""
    columns = {name: [record["scores"][name] for record in records] for name in names}
    intervals = bootstrap_95(columns)
    return {
        name: {
            "value": sum(values) / len(values),
            "count": int(sum(values)),
            "bootstrap_95": intervals[name],
        }
        for name, values in columns.items()
    }


# Two-sided 95 % quantiles of Student's t by degrees of freedom (1-30; beyond, 2.0 is within
# 2 % of every value). A fractional (Welch) df is rounded down: the wider interval.
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_975(df: float) -> float:
    """Student's t two-sided 95 % quantile at ``df`` degrees of freedom."""
    return T_975[min(max(int(df), 1), len(T_975)) - 1] if df <= len(T_975) else 2.0


def mean_t_interval(values) -> tuple[float, float] | None:
    """[low, high] of the 95 % t interval of a mean over a few values (per-seed differences,
    say); None for fewer than two, which have no spread to estimate."""
    values = [float(v) for v in values]
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t at an integer ``df`` >= 1, in closed form (Abramowitz and
    Stegun 26.7.3-4: a finite series in cos(theta), theta = atan(|t| / sqrt(df))), so the
    claims need no statistics package."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df}")
    df = int(df)
    theta = math.atan(abs(t) / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * cos2
            total += term
        inside = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * cos2
            total += term
        inside = math.sin(theta) * total
    return min(1.0, max(0.0, 1.0 - inside))


def mean_t_p(values) -> float | None:
    """The two-sided p-value of a mean of 0 over a few values (per-seed differences): the
    test ``mean_t_interval`` inverts. None for fewer than two values."""
    values = [float(v) for v in values]
    if len(values) < 2:
        return None
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    if spread == 0:
        return 1.0 if mean == 0 else 0.0
    return t_two_sided_p(mean / (spread / math.sqrt(len(values))), len(values) - 1)
