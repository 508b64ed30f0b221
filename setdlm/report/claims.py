"""The paper's comparisons in miniature, each a paired difference with a verdict.

For a run's arithmetic points, each claim is a difference of a quality (the solve task's
accuracy, the share of correct problems among the unconditional samples) with the paper's
expected sign, computed on paired resamples: every point of a task is resampled with the same
seed indices and the same example indices (setdlm/eval/seeds.py ``two_level_resamples`` with
one rng seed), so the difference's 95 % interval is that of a paired comparison (same training
seeds, same problems; unconditional samples are independent draws, so there the same indices
only resample two independent sets).

With a handful of seeds that bootstrap is too narrow: resampling n seeds estimates their variance
with 1/n instead of 1/(n-1), and its percentiles are normal quantiles where Student's t at n-1
degrees of freedom belongs (2.78 against 1.96 at five seeds). One seed far from the others can
then carry a verdict. So each claim also has a seed-level interval: the t 95 % interval of the
mean of its per-seed differences (setdlm/eval/intervals.py ``mean_t_interval``), which holds the
seed spread at its small-sample width. On solve and infill every seed decodes the same problems,
so it treats them as fixed, which is why the bootstrap stays. The verdict needs both:

- "holds": both intervals exclude 0 on the paper's side;
- "reversed": both exclude 0 on the other side;
- "no evidence": otherwise.

One trained model per family has no seed-level interval: its verdict rests on the bootstrap
over problems alone, and the table says that it ignores seed variance.

SetDLM-smax2S is compared with BD3LM-S (the paper's pairing, SPEC 3.7), with each family's own
decoding policy:

1. the quality at equal τ, for every τ both decoded (paper: SetDLM >= BD3LM);
2. the quality at equal parallelism (solve: 2 and 3 tokens per step; unconditional, whose
   sweep stops near 2.3: 1.5 and 2), each curve interpolated linearly between its two points
   around that parallelism (paper: SetDLM higher);
3. the quality each loses from τ = 1e6 to parallelism 2 (interpolated as in 2; paper: SetDLM
   loses less as τ falls, so BD3LM's loss minus SetDLM's is positive);
4. infilling a masked step at τ = 1e6 (the step correct, in either operand order where the
   generator writes both; paper, ROCStories: SetDLM higher).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from setdlm.eval.intervals import mean_t_interval
from setdlm.eval.seeds import interval, per_example_scores, seed_folders, two_level_resamples
from setdlm.report.table import Column, Table, format_tau
from setdlm.results.reader import ResultPoint, Results

SOLVE, INFILL, UNCONDITIONAL = "arithmetic-solve", "arithmetic-infill", "arithmetic-unconditional"
LOSS_LEVEL = 2.0  # claim 3: the quality lost by the time a curve commits 2 tokens per step
HOLDS, REVERSED, NO_EVIDENCE = "holds", "reversed", "no evidence"


@dataclass(frozen=True)
class ClaimSet:
    """Claims 1-3 on one decoding task: its per-example quality and how the rows name it."""

    task: str
    metric: str  # a per-example score of its samples.jsonl
    quality: str  # the claim's words for it
    detail: str  # the comparison's words for it
    levels: tuple[float, ...]  # claim 2's parallelism levels, inside both sweeps' range


CLAIM_SETS = (
    ClaimSet(SOLVE, "strict_match", "accuracy", "strict match", (2.0, 3.0)),
    ClaimSet(
        UNCONDITIONAL,
        "correct",
        "correct sampled problems",
        "share of samples that are correct problems",
        (1.5, 2.0),
    ),
)


@dataclass(frozen=True)
class Claim:
    claim: str
    comparison: str
    difference: float  # the point estimate, in the metric's unit (a fraction)
    low: float  # the two-level bootstrap 95 % interval
    high: float
    seeds: int
    examples: int
    seed_low: float | None = None  # the t 95 % interval of the per-seed differences' mean;
    seed_high: float | None = None  # None with one seed

    @property
    def verdict(self) -> str:
        seed_level = self.seed_low is not None and self.seed_high is not None
        if self.low > 0 and (not seed_level or self.seed_low > 0):
            return HOLDS
        if self.high < 0 and (not seed_level or self.seed_high < 0):
            return REVERSED
        return NO_EVIDENCE


@dataclass(frozen=True)
class Drawn:
    """A point's quality (or a difference of qualities), ready to be paired with another's."""

    resamples: np.ndarray  # (R,) two-level bootstrap means, indices shared by every point
    per_seed: np.ndarray  # (S,) each seed's mean over its examples
    seeds: tuple[str, ...]  # the seed folders, which pair two points' per-seed values
    examples: int  # per seed

    @property
    def estimate(self) -> float:
        return float(self.per_seed.mean())

    def pairs_with(self, other: Drawn) -> bool:
        """Whether the two are of the same seeds and examples, so that their resamples (always
        RESAMPLES of them) and per-seed values combine element by element (one model on each
        side pairs, whatever its folder is called)."""
        one_each = len(self.seeds) == len(other.seeds) == 1
        return (self.seeds == other.seeds or one_each) and self.examples == other.examples

    def minus(self, other: Drawn) -> Drawn:
        self._check_pairs(other)
        return Drawn(
            self.resamples - other.resamples,
            self.per_seed - other.per_seed,
            self.seeds,
            self.examples,
        )

    def toward(self, other: Drawn, weight: float) -> Drawn:
        """The linear interpolation (1 - weight) * self + weight * other."""
        self._check_pairs(other)
        return Drawn(
            (1 - weight) * self.resamples + weight * other.resamples,
            (1 - weight) * self.per_seed + weight * other.per_seed,
            self.seeds,
            self.examples,
        )

    def _check_pairs(self, other: Drawn) -> None:
        # numpy would broadcast one seed's value against five, or fail deep inside: callers
        # ask pairs_with first, and a caller that forgot is a bug
        if not self.pairs_with(other):
            raise ValueError(
                f"cannot combine seeds {self.seeds} ({self.examples} examples) with "
                f"{other.seeds} ({other.examples})"
            )


def resampled(point: ResultPoint, metric: str) -> Drawn | None:
    """The point's mean ``metric``: paired resamples and per-seed means (None without
    per-example scores)."""
    folders = seed_folders(point.folder)
    names = tuple(folder.name for folder in folders) or ("one model",)
    columns = [per_example_scores(folder, [metric]) for folder in folders or [point.folder]]
    if any(metric not in column for column in columns):
        return None
    values = [column[metric] for column in columns]
    per_seed = np.asarray([v.mean() for v in values])  # (S,)
    return Drawn(two_level_resamples(values), per_seed, names, len(values[0]))


Draw = Callable[[ResultPoint, str], Drawn | None]


def _drawn_once() -> Draw:
    """``resampled``, each (point, metric) read and resampled once: the claims reuse a point in
    several comparisons (equal τ, each parallelism level, the loss), and each read parses its
    seeds' samples.jsonl and draws RESAMPLES two-level resamples."""
    memo: dict[tuple[Path, str], Drawn | None] = {}

    def draw(point: ResultPoint, metric: str) -> Drawn | None:
        key = (point.folder, metric)
        if key not in memo:
            memo[key] = resampled(point, metric)
        return memo[key]

    return draw


def _claim(claim: str, comparison: str, difference: Drawn) -> Claim:
    low, high = interval(difference.resamples)
    seed_level = mean_t_interval(difference.per_seed)
    seed_low, seed_high = seed_level if seed_level is not None else (None, None)
    return Claim(
        claim,
        comparison,
        difference.estimate,
        low,
        high,
        len(difference.seeds),
        difference.examples,
        seed_low,
        seed_high,
    )


def pairs(results: Results, task: str) -> list[tuple[ResultPoint, ResultPoint]]:
    """(SetDLM-smax2S, BD3LM-S) model pairs of a task: lists of each one's own-policy points."""
    points = [p for p in results.for_task(task) if p.policy is None]
    models = {}
    for point in points:
        models.setdefault((point.family, point.model), []).append(point)
    found = []
    for (family, model), own in models.items():
        if family != "setdlm":
            continue
        for (other_family, other_model), theirs in models.items():
            paired = other_family == "bd3lm" and theirs[0].size * 2 == own[0].size
            if paired and _tag(other_model) == _tag(model):
                found.append((own, theirs))
    return found


def _tag(model: str) -> str:
    """What follows the family and size in a model name (``-arith``), if anything."""
    parts = model.split("-")
    return "-".join(parts[2:])


def build_claims(results: Results) -> list[Claim]:
    draw = _drawn_once()
    claims = []
    for claim_set in CLAIM_SETS:
        for setdlm, bd3lm in pairs(results, claim_set.task):
            name = f"{setdlm[0].model} vs {bd3lm[0].model}"
            claims += _equal_tau(setdlm, bd3lm, name, claim_set, draw)
            claims += _equal_parallelism(setdlm, bd3lm, name, claim_set, draw)
            claims += _loss_to_parallelism(setdlm, bd3lm, name, claim_set, draw)
    for setdlm, bd3lm in pairs(results, INFILL):
        ours = _by_tau(setdlm).get(1e6)
        theirs = _by_tau(bd3lm).get(1e6)
        if ours and theirs:
            claims += _difference(
                "infilling a masked step: SetDLM more often correct at τ = 1e6",
                f"{ours.model} − {theirs.model}, step correct",
                ours,
                theirs,
                "step_correct",
                draw,
            )
    return claims


def _by_tau(points: list[ResultPoint]) -> dict[float, ResultPoint]:
    return {point.tau: point for point in points if point.tau is not None}


def _difference(claim: str, comparison: str, ours, theirs, metric: str, draw: Draw) -> list[Claim]:
    a, b = draw(ours, metric), draw(theirs, metric)
    if a is None or b is None or not a.pairs_with(b):
        return []
    return [_claim(claim, comparison, a.minus(b))]


def _equal_tau(setdlm, bd3lm, name: str, claim_set: ClaimSet, draw: Draw) -> list[Claim]:
    ours, theirs = _by_tau(setdlm), _by_tau(bd3lm)
    claims = []
    for tau in sorted(set(ours) & set(theirs), reverse=True):
        claims += _difference(
            f"{claim_set.quality} at equal τ = {format_tau(tau)}: SetDLM higher",
            f"{name}, {claim_set.detail}",
            ours[tau],
            theirs[tau],
            claim_set.metric,
            draw,
        )
    return claims


def _curve(points: list[ResultPoint], metric: str, draw: Draw) -> list[tuple[float, Drawn]] | None:
    """[(parallelism, drawn)] of a model's points, by parallelism; None when a point has no
    per-example scores."""
    rows = []
    for point in points:
        parallelism = point.speed("parallelism_mean")
        drawn = draw(point, metric)
        if parallelism is None or drawn is None:
            return None
        rows.append((parallelism, drawn))
    rows.sort(key=lambda row: row[0])
    return rows


def _at(rows: list[tuple[float, Drawn]], level: float) -> Drawn | None:
    """The curve interpolated linearly at a parallelism level (None outside its range): the
    resamples and each seed's value with the same weights."""
    for (x0, d0), (x1, d1) in zip(rows, rows[1:], strict=False):
        if x0 <= level <= x1 and x1 > x0:
            # two points of one curve decoded with other seeds do not interpolate
            return d0.toward(d1, (level - x0) / (x1 - x0)) if d0.pairs_with(d1) else None
    return None


def _equal_parallelism(setdlm, bd3lm, name: str, claim_set: ClaimSet, draw: Draw) -> list[Claim]:
    ours, theirs = _curve(setdlm, claim_set.metric, draw), _curve(bd3lm, claim_set.metric, draw)
    if not ours or not theirs:
        return []
    claims = []
    for level in claim_set.levels:
        a, b = _at(ours, level), _at(theirs, level)
        if a is None or b is None or not a.pairs_with(b):
            continue
        claims.append(
            _claim(
                f"{claim_set.quality} at equal parallelism {level:g} tokens/step: SetDLM higher",
                f"{name}, {claim_set.detail} interpolated between τ points",
                a.minus(b),
            )
        )
    return claims


def _loss_to_parallelism(setdlm, bd3lm, name: str, claim_set: ClaimSet, draw: Draw) -> list[Claim]:
    def loss(points) -> Drawn | None:
        """The quality lost from τ = 1e6 to LOSS_LEVEL tokens per step, the curve
        interpolated there."""
        start = _by_tau(points).get(1e6)
        curve = _curve(points, claim_set.metric, draw)
        if start is None or not curve:
            return None
        at_start, at_level = draw(start, claim_set.metric), _at(curve, LOSS_LEVEL)
        if at_start is None or at_level is None or not at_start.pairs_with(at_level):
            return None
        return at_start.minus(at_level)

    ours, theirs = loss(setdlm), loss(bd3lm)
    if ours is None or theirs is None or not ours.pairs_with(theirs):
        return []
    return [
        _claim(
            f"{claim_set.quality} lost from τ = 1e6 to parallelism {LOSS_LEVEL:g}: "
            "SetDLM loses less",
            f"{name}, {claim_set.detail}: BD3LM's loss ({100 * theirs.estimate:z.1f} pp) − "
            f"SetDLM's ({100 * ours.estimate:z.1f} pp), each curve interpolated at "
            f"{LOSS_LEVEL:g} tokens/step",
            theirs.minus(ours),
        )
    ]


CLAIMS_KEY = "claims"


def claims_table(results: Results) -> Table:
    claims = build_claims(results)
    rows = [
        {
            "claim": c.claim,
            "comparison": c.comparison,
            "difference": (100 * c.difference, 100 * c.low, 100 * c.high),
            "seed_level": None
            if c.seed_low is None
            else (None, 100 * c.seed_low, 100 * c.seed_high),
            "verdict": c.verdict,
            "seeds": c.seeds,
            "examples": c.examples,
        }
        for c in claims
    ]
    seeds = sorted({c.seeds for c in claims})
    notes = [
        "Each row: a difference of accuracies (solve, infill: % of test problems; unconditional: "
        "% of samples that are correct problems) in percentage points (the paper's expected side "
        "positive) with two paired 95 % intervals. Two-level bootstrap: 2000 seeded resamples of "
        "the training seeds, then of the examples within each seed, the same indices for both "
        "sides (same seeds, same problems; the unconditional samples are independent draws). "
        "Seed-level: Student's t over the per-seed differences (n - 1 degrees of freedom), "
        "because a bootstrap over a handful of seeds is too narrow (it divides their variance by "
        "n and reads normal quantiles) and lets one seed carry a verdict. holds: both intervals "
        "exclude 0 on the paper's side; reversed: both exclude 0 on the other side; no "
        "evidence: otherwise (judged unrounded: a seed-level bound shown as 0.0 is above 0, "
        "-0.0 below; the CSV has every bound in full).",
        "Models: SetDLM-smax2S against BD3LM-S (the paper's pairing), each with its own "
        "decoding policy; tiny CPU models on the synthetic arithmetic task, so these are the "
        "paper's comparisons in miniature, not its numbers (setdlm/report/claims.py).",
    ]
    if seeds == [1]:
        notes.append(
            "One trained model per family: the interval resamples problems only and ignores "
            "seed variance, and there is no seed-level interval (train.seeds trains several)."
        )
    if not claims:
        notes.append(
            "No claim could be computed: the run has no SetDLM-smax2S and BD3LM-S pair on "
            "arithmetic-solve, arithmetic-infill or arithmetic-unconditional with per-example "
            "scores."
        )
    return Table(
        CLAIMS_KEY,
        "The paper's comparisons in miniature: paired differences and verdicts",
        [
            Column("claim", "claim"),
            Column("comparison", "comparison"),
            Column("difference", "difference (pp) [two-level bootstrap 95 %]", 1, ranged=True),
            Column("seed_level", "seed-level t 95 % (pp)", 1, ranged=True, show=_bounds),
            Column("verdict", "verdict"),
            Column("seeds", "seeds", 0),
            Column("examples", "examples per seed", 0),
        ],
        rows,
        notes,
    )


def _bounds(cell: tuple[None, float, float]) -> str:
    """[low, high] of the seed-level interval, each with its sign: a bound of -0.002 reads
    "-0.0" beside a verdict of no evidence, where the other columns' format would print 0.0."""
    _, low, high = cell
    return f"[{low:.1f}, {high:.1f}]"


def has_claims(run_dir: Path) -> bool:
    """Whether a run folder holds arithmetic results (the claims table's input)."""
    return any((run_dir / task).is_dir() for task in (SOLVE, INFILL, UNCONDITIONAL))
