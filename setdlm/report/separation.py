"""Whether a task's rows tell anything apart: pairs of points whose 95 % intervals of the
task's headline quality (setdlm/tasks/__init__.py) do not overlap.

A table whose intervals all overlap ranks nothing, whatever its point estimates suggest, so
such a task's note says "no separation". Two kinds of pairs are looked at:

- between curves (a model with its decoding policy): at some τ both decoded (a point without
  τ, AR's or a likelihood's, stands for every τ), their intervals are disjoint;
- within a curve as τ falls: two of its points have disjoint intervals.

Disjoint intervals are a conservative test against a paired comparison: two overlapping
intervals can still differ there (the claims table computes those), so "no separation" means no
evidence of a difference, not evidence of none. They are not conservative over a handful of
seeds, though: a row's two-level bootstrap is too narrow there (setdlm/report/claims.py), so a
separation is a lead for the claims table, whose verdicts also need a seed-level t interval.
"""

from __future__ import annotations

from itertools import combinations

from setdlm.report.table import format_tau
from setdlm.results.reader import ResultPoint
from setdlm.tasks import TASKS

NO_SEPARATION = "no separation"


def separation_notes(points: list[ResultPoint]) -> list[str]:
    """One note per task of ``points``: which pairs of its points separate."""
    notes = []
    for task in dict.fromkeys(p.task for p in points):
        headline = TASKS[task].headline
        own = [p for p in points if p.task == task and p.interval(headline) is not None]
        notes.append(f"Separation ({task}, {headline}; 95 % intervals that do not overlap): ")
        notes[-1] += _verdict(own, headline)
    return notes


def _verdict(points: list[ResultPoint], metric: str) -> str:
    if len(points) < 2:
        return "not assessed: fewer than two points with an interval."
    apart, together = curve_pairs(points, metric)
    within, flat = tau_pairs(points, metric)
    if not apart and not within:
        return (
            f"{NO_SEPARATION}: no two points' intervals are disjoint, so these rows rank "
            "neither the families nor the τ values."
        )
    parts = []
    if apart or together:
        count = len(apart) + len(together)
        text = f"between curves, {len(apart)} of {count} pairs separate at a τ both decoded"
        parts.append(text + (f" ({NO_SEPARATION}: {', '.join(together)})" if together else ""))
    if within or flat:
        text = "as τ falls, " + (", ".join(within) if within else "no curve separates")
        parts.append(text + (f" ({NO_SEPARATION} within: {', '.join(flat)})" if flat else ""))
    return "; ".join(parts) + "."


def _disjoint(a: ResultPoint, b: ResultPoint, metric: str) -> bool:
    (low_a, high_a), (low_b, high_b) = a.interval(metric), b.interval(metric)
    return high_a < low_b or high_b < low_a


def _curves(points: list[ResultPoint]) -> dict[str, list[ResultPoint]]:
    curves: dict[str, list[ResultPoint]] = {}
    for point in points:
        curves.setdefault(point.curve, []).append(point)
    return curves


def curve_pairs(points: list[ResultPoint], metric: str) -> tuple[list[str], list[str]]:
    """('a / b' pairs of curves that separate at a shared τ, those that do not)."""
    apart, together = [], []
    for (name_a, own_a), (name_b, own_b) in combinations(_curves(points).items(), 2):
        shared = [
            (a, b) for a in own_a for b in own_b if a.tau is None or b.tau is None or a.tau == b.tau
        ]
        if shared:
            separated = any(_disjoint(a, b, metric) for a, b in shared)
            (apart if separated else together).append(f"{name_a} / {name_b}")
    return apart, together


def tau_pairs(points: list[ResultPoint], metric: str) -> tuple[list[str], list[str]]:
    """(curves with two τ points that separate, each with its widest such pair; curves of
    several τ points that do not)."""
    within, flat = [], []
    for name, own in _curves(points).items():
        swept = [p for p in own if p.tau is not None]
        if len(swept) < 2:
            continue
        separated = [(a, b) for a, b in combinations(swept, 2) if _disjoint(a, b, metric)]
        if not separated:
            flat.append(name)
            continue
        a, b = max(separated, key=lambda ab: abs(ab[0].quality(metric) - ab[1].quality(metric)))
        within.append(f"{name} (τ {format_tau(a.tau)} vs {format_tau(b.tau)})")
    return within, flat
