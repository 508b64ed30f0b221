"""Area under the accuracy-parallelism curve (AUP-style): one number per family and task.

A τ sweep gives a family's points (parallelism ρ, accuracy y). Sorted by ρ, the area is

    AUP = ρ_1 · y_1 W(y_1) + Σ_{i ≥ 2} (ρ_i − ρ_{i−1}) · (y_i W(y_i) + y_{i−1} W(y_{i−1})) / 2

with W(y) = min(1, exp(−α (1 − y / y_ref))), α = 3: a point counts fully only as accurate as
the reference y_ref, and less the further it falls below it, so speed bought with accuracy
earns little. The reference is the best accuracy of any point of the task (every family), so
the families of one table share it; it is stated with the numbers. A family with one point
(AR) has AUP = ρ · y · W(y): its accuracy at parallelism 1.

A curve decoded with several training seeds also has one AUP per seed (``seed_aups``: that
seed's own parallelism and accuracy at every point, the same reference), whose spread is the
seed-level interval the tables give beside the AUP of the mean curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 3.0


@dataclass(frozen=True)
class Aup:
    value: float  # in accuracy units (a fraction) × tokens per step
    reference: float  # y_ref, the accuracy the weighting is relative to
    points: int


def weight(accuracy: float, reference: float) -> float:
    if reference <= 0:
        return 1.0
    return min(1.0, math.exp(-ALPHA * (1 - accuracy / reference)))


def aup(points: list[tuple[float, float]], reference: float) -> Aup:
    """``points``: (parallelism, accuracy) pairs of one family on one task."""
    if not points:
        raise ValueError("AUP needs at least one (parallelism, accuracy) point")
    ordered = sorted(points)
    weighted = [(rho, y * weight(y, reference)) for rho, y in ordered]
    area = weighted[0][0] * weighted[0][1]
    for (rho_a, y_a), (rho_b, y_b) in zip(weighted, weighted[1:], strict=False):
        area += (rho_b - rho_a) * (y_a + y_b) / 2
    return Aup(area, reference, len(points))


def seed_aups(points: list[dict[int, tuple[float, float]]], reference: float) -> list[float] | None:
    """Each seed's AUP over a curve: ``points[i]`` maps seed -> (parallelism, accuracy) at the
    curve's i-th point. None unless every point has the same seeds, two or more: a seed missing
    at some point would have an AUP over other points than the rest."""
    seeds = {tuple(sorted(point)) for point in points}
    if len(seeds) != 1 or len(next(iter(seeds))) < 2:
        return None
    return [aup([point[seed] for point in points], reference).value for seed in sorted(points[0])]
