"""Seeded 95 % bootstrap intervals of per-example means: one implementation for every task.

A result's quality is a mean over its examples; the interval says how far another draw of the
same number of examples could move it. Resampling is over examples (with replacement), seeded,
and one set of resamples is shared by all metrics of a result, so the intervals of two metrics
of one run are computed on the same resampled sets (as rouge_score's aggregator does).
"""

from __future__ import annotations

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
