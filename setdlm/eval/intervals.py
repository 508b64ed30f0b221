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


def bootstrap_95(
    values: dict[str, list[float]], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, list[float]]:
    """{metric: [low, high]}, the 2.5th and 97.5th percentiles of the resampled means."""
    counts = {len(column) for column in values.values()}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"every metric needs the same, non-zero number of examples: {counts}")
    count = counts.pop()
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, count, size=(resamples, count))  # (S, N)
    intervals = {}
    for name, column in values.items():
        means = np.asarray(column, dtype=np.float64)[picks].mean(axis=1)  # (S,)
        low, high = np.percentile(means, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
        intervals[name] = [float(low), float(high)]
    return intervals


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
