"""The claims table: SetDLM-smax2S against BD3LM-S (the paper's pairing, SPEC 3.7), each with
its own decoding policy, in two parts, each row naming where its protocol comes from.

**The paper's claims**, at the paper's protocol and on its axes:

1. per task at τ = 1e6, one token per step and so equal NFE (SPEC 3.6): the quality (solve:
   GSM8K's first Pareto point, SPEC 6.1; infill: ROCStories, Table 2; unconditional: OWT,
   Table 4), tokens/s (SetDLM faster: SPEC 3.8 and 6.1) and the time per forward (SetDLM's
   forwards cheaper: at equal NFE its speed can come from nothing else);
2. solve accuracy at equal tokens/s along the τ sweep, GSM8K's axis (SPEC 6.1): each curve
   interpolated at the quartiles of the speed range both cover.

**Beyond the paper**: comparisons it does not make, what the miniature shows besides: solve
accuracy at equal τ below 1e6, at equal parallelism (2 and 3 tokens per step) and lost from
τ = 1e6 to parallelism 2; infilling below τ = 1e6; the unconditional samples below τ = 1e6, at
equal parallelism (1.5 and 2, the sweep stops near 2.3) and lost to parallelism 2.

Speed comes from the same run's batch-1 timing: the examples every point and seed decoded one at
a time after its warm-up (metrics.json ``speed.timed_examples``); the rest were decoded in
batches and are counted, not timed. Parallelism is the official parallelism factor
(setdlm/core/decoding/parallelism.py, the paper's axis), and every row at equal parallelism also
states both curves' tokens per forward there.

Each row is a paired difference, the paper's side positive, with two 95 % intervals and a
verdict under Holm's rule over the rows of its part (setdlm/report/claim_stats.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from setdlm.eval.records import SampleLog
from setdlm.eval.seeds import scored_examples, seed_folders, two_level_resamples
from setdlm.report.claim_stats import (
    BEYOND,
    HOLDS,
    NO_EVIDENCE,
    PAPER,
    REVERSED,
    Claim,
    Drawn,
    claim_of,
    holm,
)
from setdlm.report.table import format_tau, hardware_summary
from setdlm.results.reader import ResultPoint, Results

__all__ = ["HOLDS", "NO_EVIDENCE", "REVERSED", "Claim", "build_claims"]

SOLVE, INFILL, UNCONDITIONAL = "arithmetic-solve", "arithmetic-infill", "arithmetic-unconditional"
NO_THRESHOLD = 1e6
LOSS_LEVEL = 2.0  # the quality lost by the time a curve commits 2 tokens per step
SPEED_QUARTILES = (0.25, 0.5, 0.75)  # equal tokens/s: where in the range both curves cover


@dataclass(frozen=True)
class TaskClaims:
    """The claims on one decoding task: its per-example quality and how the rows name it."""

    task: str
    metric: str  # a per-example score of its samples.jsonl
    quality: str  # the claim's words for it
    detail: str  # the comparison's words for it
    paper: str  # where the τ = 1e6 comparison of the paper is
    beyond: str  # why its other comparisons are not the paper's
    levels: tuple[float, ...] = ()  # parallelism factors, inside both sweeps' range
    loss: bool = False  # whether the quality lost from τ = 1e6 to LOSS_LEVEL is compared


TASK_CLAIMS = (
    TaskClaims(
        SOLVE,
        "strict_match",
        "accuracy",
        "strict match",
        "paper: GSM8K's τ = 1e6 point (SPEC 6.1: +2.9 points, smax8 vs S=4)",
        "beyond the paper: its GSM8K curves are compared along tokens/s (SPEC 6.1)",
        (2.0, 3.0),
        loss=True,
    ),
    TaskClaims(
        INFILL,
        "step_correct",
        "infilled step correct",
        "step correct",
        "paper: ROCStories infilling at τ = 1e6 (Table 2, SPEC 5.4)",
        "beyond the paper: it infills at τ = 1e6 only (SPEC 5.4)",
    ),
    TaskClaims(
        UNCONDITIONAL,
        "correct",
        "correct sampled problems",
        "share of samples that are correct problems",
        "paper: OWT samples at τ = 1e6 (Table 4, SPEC 5.3; MAUVE there)",
        "beyond the paper: it samples at τ = 1e6 only (SPEC 5.3)",
        (1.5, 2.0),
        loss=True,
    ),
)
SPEED_PROTOCOL = "paper: batch-1 throughput at τ = 1e6 (SPEC 3.8; GSM8K +12 %, SPEC 6.1)"
FORWARD_PROTOCOL = "paper: equal NFE at τ = 1e6, the gain is cheaper forwards (SPEC 3.6)"
EQUAL_SPEED_PROTOCOL = "paper: GSM8K accuracy against tokens/s along the τ sweep (SPEC 6.1)"


@dataclass(frozen=True)
class Measure:
    """A per-example speed of the timed examples, and how a claim on it reads."""

    name: str
    unit: str  # claim_stats.SCALES: how it is shown
    higher_is_setdlm: bool  # the paper's side: SetDLM's value higher (else lower)

    def value(self, record: dict) -> float | None:
        latency, nfe = record.get("latency_seconds"), record.get("nfe")
        if not latency or not nfe:
            return None
        if self.name == "tokens_per_second":
            return record["generated_tokens"] / latency
        return latency / nfe


TOKENS_PER_SECOND = Measure("tokens_per_second", "tok/s", True)
SECONDS_PER_FORWARD = Measure("seconds_per_forward", "µs/forward", False)


# ------------------------------------------------------------------------- reading a point
def resampled(point: ResultPoint, metric: str) -> Drawn | None:
    """The point's mean ``metric`` over its examples: paired resamples and per-seed means
    (None without per-example scores, or when its seeds decoded other examples)."""
    folders = seed_folders(point.folder) or [point.folder]
    scored = [scored_examples(folder, [metric]) for folder in folders]
    if any(metric not in columns for _, columns in scored):
        return None
    return _drawn(point, [ids for ids, _ in scored], [c[metric] for _, c in scored])


def resampled_speed(point: ResultPoint, measure: Measure) -> Drawn | None:
    """The point's mean ``measure`` over its batch-1 timed examples (None where some were
    timed in a batch, none were timed, or its seeds timed other examples)."""
    ids, columns = [], []
    for folder in seed_folders(point.folder) or [point.folder]:
        records = SampleLog(folder / "samples.jsonl").scan()[0]
        timed = [r for _, r in sorted(records.items()) if r.get("timed", True)]
        timed = [r for r in timed if not r.get("warmup")]
        if not timed or any(r.get("batch_size", 1) != 1 for r in timed):
            return None
        values = [measure.value(r) for r in timed]
        if None in values:
            return None
        ids.append(tuple(r["id"] for r in timed))
        columns.append(np.asarray(values, dtype=np.float64))
    return _drawn(point, ids, columns)


def _drawn(point: ResultPoint, ids: list[tuple], columns: list[np.ndarray]) -> Drawn | None:
    if any(own != ids[0] for own in ids):
        return None  # the crossed bootstrap draws the same examples for every seed
    names = tuple(folder.name for folder in seed_folders(point.folder)) or ("one model",)
    per_seed = np.asarray([column.mean() for column in columns])  # (S,)
    return Drawn(two_level_resamples(columns), per_seed, names, tuple(ids[0]))


Draw = Callable[[ResultPoint, object], Drawn | None]


def _drawn_once() -> Draw:
    """Each (point, metric or measure) read and resampled once: the claims reuse a point in
    several comparisons, and each read parses its seeds' samples.jsonl and draws RESAMPLES
    replicates."""
    memo: dict[tuple[Path, object], Drawn | None] = {}

    def draw(point: ResultPoint, what) -> Drawn | None:
        key = (point.folder, what)
        if key not in memo:
            is_speed = isinstance(what, Measure)
            memo[key] = resampled_speed(point, what) if is_speed else resampled(point, what)
        return memo[key]

    return draw


# ------------------------------------------------------------------------------ the claims
def pairs(results: Results, task: str) -> list[tuple[list[ResultPoint], list[ResultPoint]]]:
    """(SetDLM-smax2S, BD3LM-S) model pairs of a task: lists of each one's own-policy points."""
    points = [p for p in results.for_task(task) if p.policy is None]
    models: dict[tuple, list[ResultPoint]] = {}
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
    return "-".join(model.split("-")[2:])


def build_claims(results: Results) -> list[Claim]:
    """Every claim of both parts, with its Holm-adjusted p-value."""
    draw = _drawn_once()
    paper, beyond = [], []
    for task in TASK_CLAIMS:
        for setdlm, bd3lm in pairs(results, task.task):
            compared = Compared(task, setdlm, bd3lm, draw)
            paper += compared.at_no_threshold()
            if task.task == SOLVE:
                paper += compared.at_equal_speed()
            beyond += compared.below_no_threshold()
            beyond += compared.at_equal_parallelism()
            if task.loss:
                beyond += compared.lost_to_parallelism()
    return holm(paper + beyond)


class Compared:
    """The claims on one task for one (SetDLM, BD3LM) pair of curves."""

    def __init__(self, task: TaskClaims, setdlm, bd3lm, draw: Draw):
        self.task, self.setdlm, self.bd3lm, self.draw = task, setdlm, bd3lm, draw
        self.name = f"{setdlm[0].model} vs {bd3lm[0].model}"

    # -- part 1
    def at_no_threshold(self) -> list[Claim]:
        ours = _by_tau(self.setdlm).get(NO_THRESHOLD)
        theirs = _by_tau(self.bd3lm).get(NO_THRESHOLD)
        if ours is None or theirs is None:
            return []
        task = self.task
        claims = self._quality(PAPER, NO_THRESHOLD, task.paper, ours, theirs)
        hardware = _hardware(ours, theirs)
        for measure, protocol in (
            (TOKENS_PER_SECOND, SPEED_PROTOCOL),
            (SECONDS_PER_FORWARD, FORWARD_PROTOCOL),
        ):
            a, b = self.draw(ours, measure), self.draw(theirs, measure)
            if a is None or b is None or not a.pairs_with(b):
                continue
            difference = a.minus(b) if measure.higher_is_setdlm else b.minus(a)
            words = "faster" if measure.higher_is_setdlm else "cheaper per forward"
            claims.append(
                claim_of(
                    PAPER,
                    f"{task.task.removeprefix('arithmetic-')}: {measure.unit} at τ = 1e6 "
                    f"(batch 1, {hardware}): SetDLM {words}",
                    protocol,
                    f"{self.name}, {_timed_words(a)}; "
                    + ("SetDLM − BD3LM" if measure.higher_is_setdlm else "BD3LM − SetDLM"),
                    difference,
                    measure.unit,
                )
            )
        return claims

    def at_equal_speed(self) -> list[Claim]:
        ours = self._curve(_batch1_speed, self.setdlm)
        theirs = self._curve(_batch1_speed, self.bd3lm)
        if not ours or not theirs:
            return []
        low = max(ours[0][0], theirs[0][0])
        high = min(ours[-1][0], theirs[-1][0])
        if high <= low:
            return []
        hardware = _hardware(self.setdlm[0], self.bd3lm[0])
        claims = []
        levels = [low + quartile * (high - low) for quartile in SPEED_QUARTILES]
        for level, a, b in _paired_at(ours, theirs, levels):
            claims.append(
                claim_of(
                    PAPER,
                    f"solve: accuracy at equal speed {level:,.0f} tok/s (batch 1, {hardware}): "
                    "SetDLM higher",
                    EQUAL_SPEED_PROTOCOL,
                    f"{self.name}, strict match, each curve interpolated at that speed "
                    f"(SetDLM {a[1]}, BD3LM {b[1]}); the speed axis is the curves' measured "
                    "mean, its noise not in the interval",
                    a[0].minus(b[0]),
                )
            )
        return claims

    # -- part 2
    def below_no_threshold(self) -> list[Claim]:
        ours, theirs = _by_tau(self.setdlm), _by_tau(self.bd3lm)
        claims = []
        for tau in sorted(set(ours) & set(theirs), reverse=True):
            if tau != NO_THRESHOLD:
                claims += self._quality(BEYOND, tau, self.task.beyond, ours[tau], theirs[tau])
        return claims

    def at_equal_parallelism(self) -> list[Claim]:
        ours, theirs = self._curve(_factor, self.setdlm), self._curve(_factor, self.bd3lm)
        if not ours or not theirs:
            return []
        claims = []
        for level, a, b in _paired_at(ours, theirs, self.task.levels):
            claims.append(
                claim_of(
                    BEYOND,
                    f"{self._short()}: {self.task.quality} at equal parallelism factor "
                    f"{level:g}: SetDLM higher",
                    "beyond the paper: the parallelism-factor axis of its deleted plotting "
                    "script (SPEC 6.1); its claims are along tokens/s",
                    f"{self.name}, {self.task.detail}, each curve interpolated at that factor "
                    f"(SetDLM {a[1]}, BD3LM {b[1]})",
                    a[0].minus(b[0]),
                )
            )
        return claims

    def lost_to_parallelism(self) -> list[Claim]:
        ours, theirs = self._loss(self.setdlm), self._loss(self.bd3lm)
        if ours is None or theirs is None or not ours.pairs_with(theirs):
            return []
        return [
            claim_of(
                BEYOND,
                f"{self._short()}: {self.task.quality} lost from τ = 1e6 to parallelism factor "
                f"{LOSS_LEVEL:g}: SetDLM loses less",
                "beyond the paper: an extrapolation it does not state",
                f"{self.name}, {self.task.detail}: BD3LM's loss ({100 * theirs.estimate:z.1f} "
                f"pp) − SetDLM's ({100 * ours.estimate:z.1f} pp), each curve interpolated at "
                f"factor {LOSS_LEVEL:g}",
                theirs.minus(ours),
            )
        ]

    # -- helpers
    def _short(self) -> str:
        return self.task.task.removeprefix("arithmetic-")

    def _quality(self, part: str, tau: float, protocol: str, ours, theirs) -> list[Claim]:
        a, b = self.draw(ours, self.task.metric), self.draw(theirs, self.task.metric)
        if a is None or b is None or not a.pairs_with(b):
            return []
        return [
            claim_of(
                part,
                f"{self._short()}: {self.task.quality} at equal τ = {format_tau(tau)}: "
                "SetDLM higher",
                protocol,
                f"{self.name}, {self.task.detail}",
                a.minus(b),
            )
        ]

    def _curve(self, axis, points) -> list[tuple[float, Drawn, ResultPoint]] | None:
        """[(x, drawn, point)] of a curve, by x; None when a point has no x or no scores."""
        rows = []
        for point in points:
            x, drawn = axis(point), self.draw(point, self.task.metric)
            if x is None or drawn is None:
                return None
            rows.append((x, drawn, point))
        rows.sort(key=lambda row: row[0])
        return rows

    def _loss(self, points) -> Drawn | None:
        """The quality lost from τ = 1e6 to LOSS_LEVEL, the curve interpolated there."""
        start = _by_tau(points).get(NO_THRESHOLD)
        curve = self._curve(_factor, points)
        if start is None or not curve:
            return None
        at_start, at_level = self.draw(start, self.task.metric), _at(curve, LOSS_LEVEL)
        if at_start is None or at_level is None or not at_start.pairs_with(at_level[0]):
            return None
        return at_start.minus(at_level[0])


def _by_tau(points: list[ResultPoint]) -> dict[float, ResultPoint]:
    return {point.tau: point for point in points if point.tau is not None}


def _factor(point: ResultPoint) -> float | None:
    return point.speed("parallelism_mean")


def _batch1_speed(point: ResultPoint) -> float | None:
    speed = point.batch1_speed()
    return None if speed is None else speed[0]


def _paired_at(ours, theirs, levels):
    """(level, SetDLM's point, BD3LM's point) for each level both curves reach, interpolated
    alike, where the two pair (same seeds and examples)."""
    for level in levels:
        a, b = _at(ours, level), _at(theirs, level)
        if a is not None and b is not None and a[0].pairs_with(b[0]):
            yield level, a, b


def _at(rows, level: float) -> tuple[Drawn, str] | None:
    """The curve interpolated linearly at ``level`` of its x (None outside its range): the
    resamples and each seed's value with the same weights, and in words between which τ and
    at what tokens per forward (interpolated alike)."""
    for (x0, d0, p0), (x1, d1, p1) in zip(rows, rows[1:], strict=False):
        if x0 <= level <= x1 and x1 > x0:
            if not d0.pairs_with(d1):  # two points of one curve decoded with other seeds
                return None
            weight = (level - x0) / (x1 - x0)
            return d0.toward(d1, weight), _between(p0, p1, weight)
    return None


def _between(p0: ResultPoint, p1: ResultPoint, weight: float) -> str:
    words = f"between τ {format_tau(p0.tau)} and {format_tau(p1.tau)}"
    t0, t1 = p0.speed("tokens_per_forward_mean"), p1.speed("tokens_per_forward_mean")
    if t0 is None or t1 is None:
        return words
    return f"{words}, {(1 - weight) * t0 + weight * t1:.2f} tokens/forward"


def _hardware(*points: ResultPoint) -> str:
    return " / ".join(dict.fromkeys(hardware_summary(p.metrics) for p in points))


def _timed_words(drawn: Drawn) -> str:
    return f"{drawn.examples} timed examples per seed"


def hardware_of(results: Results) -> str:
    """The hardware of the run's arithmetic points, each different one named."""
    points = [p for task in (SOLVE, INFILL, UNCONDITIONAL) for p in results.for_task(task)]
    return _hardware(*points) if points else "unknown hardware"


def has_claims(run_dir: Path) -> bool:
    """Whether a run folder holds arithmetic results (the claims table's input)."""
    return any((run_dir / task).is_dir() for task in (SOLVE, INFILL, UNCONDITIONAL))
