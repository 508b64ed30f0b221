"""Seeds as an axis: a point's per-seed results aggregated with a two-level bootstrap, the
paired claims and their verdicts, whether a table's intervals separate anything, the learning
curves, and the training probe that records them without changing a weight. Synthetic result
folders in the layout; no model is trained."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from setdlm.eval import seeds
from setdlm.eval.intervals import mean_t_interval, t_975
from setdlm.report import claims, curves
from setdlm.report.claims_table import claims_table
from setdlm.report.separation import NO_SEPARATION, separation_notes
from setdlm.results.reader import load_results
from setdlm.tasks import task as task_info

PROBLEMS = 120


SOLVE_SCORES = ("strict_match", "flexible_extract")


def _write_seed(
    point: Path,
    seed: int,
    solved: list[int],
    family: str,
    tau: float,
    scores=SOLVE_SCORES,
    **speed,
):
    """One seed's result of an arithmetic point (the task: the point's folder's parent's
    parent): samples.jsonl and metrics.json, each sample 1 or 0 in every one of ``scores``."""
    folder = point / f"seed-{seed}"
    folder.mkdir(parents=True)
    records = [
        {"id": f"test-{i:03d}", "scores": {name: float(s) for name in scores}}
        for i, s in enumerate(solved)
    ]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    value = sum(solved) / len(solved)
    size = {"setdlm": {"schedule": {"d": 4, "M": 8}}, "bd3lm": {"block_size": 4}}.get(family, {})
    metrics = {
        "task": task_info(point.parent.parent.name).field,
        "examples": len(solved),
        "quality": {
            # an interval of a fraction, as the readers require: inside [0, 1]
            name: {
                "value": value,
                "bootstrap_95": [max(0.0, value - 0.05), min(1.0, value + 0.05)],
                "definition": "x",
            }
            for name in scores
        },
        "speed": {"parallelism_mean": 1.0, "nfe_mean": 20.0, **speed},
        "config": {
            "model_config": {"family": family, **size},
            "decode": {"confidence_threshold": tau},
            "model_source": str(point.parents[2] / "models" / point.parent.name / folder.name),
        },
        "config_hash": f"{family}-{tau}-{seed}",
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))


def _solved(rate: float, rng) -> list[int]:
    return [int(x) for x in rng.random(PROBLEMS) < rate]


def _point(run: Path, model: str, tau: float, task: str = "arithmetic-solve") -> Path:
    return run / task / model / f"tau-{tau:g}"


# ---------------------------------------------------------------------- the two-level bootstrap
def test_two_level_resamples_are_seeded_and_paired_for_equal_shapes():
    rng = np.random.default_rng(1)
    a = [rng.random(50) for _ in range(3)]
    b = [rng.random(50) for _ in range(3)]
    first, again = seeds.two_level_resamples(a), seeds.two_level_resamples(a)
    assert np.array_equal(first, again)
    # the same indices for both: a difference of a point with itself is exactly 0
    assert np.array_equal(seeds.two_level_resamples(a) - seeds.two_level_resamples(a), 0 * first)
    assert not np.array_equal(seeds.two_level_resamples(a), seeds.two_level_resamples(b))


def test_the_interval_holds_the_spread_between_seeds():
    """Three seeds whose models differ (40 %, 60 %, 80 %) against three that agree (60 %):
    the same examples' spread, but only the first interval also holds the seeds'."""
    rng = np.random.default_rng(0)
    differing = [np.asarray(_solved(rate, rng), float) for rate in (0.4, 0.6, 0.8)]
    agreeing = [np.asarray(_solved(0.6, rng), float) for _ in range(3)]
    wide = seeds.interval(seeds.two_level_resamples(differing))
    narrow = seeds.interval(seeds.two_level_resamples(agreeing))
    assert wide[1] - wide[0] > 1.5 * (narrow[1] - narrow[0])
    assert wide[0] < 0.6 < wide[1]


def test_the_examples_are_drawn_once_for_every_seed_the_crossed_design():
    """Five seeds that solve exactly the same problems: the examples' spread is not divided
    among them, so the interval is that of one seed's examples. Drawing each seed's examples
    on its own (nested) would shrink it by about sqrt(5)."""
    rng = np.random.default_rng(6)
    column = np.asarray(_solved(0.6, rng), float)
    five = seeds.interval(seeds.two_level_resamples([column] * 5))
    one = seeds.interval(seeds.two_level_resamples([column]))
    assert five[1] - five[0] == pytest.approx(one[1] - one[0], rel=0.05)
    nested = [column, column[:-1]] * 2 + [column]  # other lengths: each seed's drawn alone
    narrow = seeds.interval(seeds.two_level_resamples(nested))
    assert narrow[1] - narrow[0] < 0.7 * (one[1] - one[0])


def test_the_monte_carlo_error_of_the_bounds_is_what_redrawing_moves_them_by():
    rng = np.random.default_rng(7)
    columns = [np.asarray(_solved(rate, rng), float) for rate in (0.5, 0.6, 0.55, 0.7, 0.65)]
    draws = [seeds.two_level_resamples(columns, resamples=2000, seed=k) for k in range(40)]
    bounds = np.asarray([seeds.interval(d) for d in draws])  # (40, 2)
    spread = bounds.std(axis=0, ddof=1).max()
    stated = np.mean([seeds.mc_error(d) for d in draws])
    assert 0.6 * spread < stated < 1.6 * spread
    # five times the replicates: about sqrt(5) less error
    assert seeds.mc_error(seeds.two_level_resamples(columns, resamples=10_000)) < 0.7 * stated


def test_aggregate_writes_the_mean_over_seeds_with_each_seeds_values(tmp_path):
    rng = np.random.default_rng(2)
    point = _point(tmp_path / "runs" / "r", "setdlm-smax8-arith", 0.5)
    rates = (0.5, 0.6, 0.7)
    for seed, rate in enumerate(rates):
        _write_seed(
            point, seed, _solved(rate, rng), "setdlm", 0.5, tokens_per_second_mean=10.0 + seed
        )
    metrics = seeds.aggregate(point)
    entry = metrics["quality"]["strict_match"]
    values = [s["quality"]["strict_match"] for s in metrics["seeds"]]
    assert entry["seed_values"] == values and entry["value"] == pytest.approx(np.mean(values))
    assert entry["seed_std"] == pytest.approx(np.std(values, ddof=1))
    low, high = entry["bootstrap_95"]
    assert low < entry["value"] < high and entry["interval_over"] == seeds.INTERVAL_TWO_LEVEL
    assert metrics["speed"]["tokens_per_second_mean"] == pytest.approx(11.0)
    assert [s["seed"] for s in metrics["seeds"]] == [0, 1, 2]
    assert json.loads((point / "metrics.json").read_text()) == metrics
    read = load_results(tmp_path / "runs" / "r").points[0]
    assert [s["seed"] for s in read.seeds] == [0, 1, 2]
    # the bounds' Monte-Carlo error, stated in the table's unit (a % column: points)
    from setdlm.report.tables import interval_note

    assert 0 < entry["bootstrap_mc_error"] < (high - low) / 10
    shown = f"acc strict (%) {100 * entry['bootstrap_mc_error']:.2g}"
    assert shown in interval_note([read])


def test_a_speed_some_seed_lacks_is_not_averaged_from_the_others(tmp_path):
    rng = np.random.default_rng(5)
    point = _point(tmp_path / "runs" / "r", "setdlm-smax8-arith", 0.5)
    _write_seed(point, 0, _solved(0.5, rng), "setdlm", 0.5, latency_p50_seconds=0.2)
    _write_seed(point, 1, _solved(0.5, rng), "setdlm", 0.5)
    speed = seeds.aggregate(point)["speed"]
    assert "latency_p50_seconds" not in speed and speed["nfe_mean"] == 20.0


def test_seeds_of_different_evaluations_are_refused_naming_the_folder(tmp_path):
    rng = np.random.default_rng(3)
    point = _point(tmp_path / "runs" / "r", "setdlm-smax8-arith", 0.5)
    _write_seed(point, 0, _solved(0.5, rng), "setdlm", 0.5)
    _write_seed(point, 1, _solved(0.5, rng)[:-1], "setdlm", 0.5)  # one example short
    with pytest.raises(seeds.SeedError, match=r"seed-1: examples 119, but seed-0 has 120"):
        seeds.aggregate(point)
    with pytest.raises(seeds.SeedError, match="no seed-<k> folders"):
        seeds.aggregate(tmp_path / "empty")


# ------------------------------------------------------------------------------- the claims
def _run_with_pair(
    tmp_path: Path, setdlm_rates, bd3lm_rates, task="arithmetic-solve", scores=SOLVE_SCORES
) -> Path:
    """A run of SetDLM-smax8 and BD3LM-s4 on an arithmetic task at τ = 1e6 and 0.5 (parallelism
    1 and 3), three seeds."""
    run = tmp_path / "runs" / "pair"
    rng = np.random.default_rng(4)
    for model, family, rates in (
        ("setdlm-smax8-arith", "setdlm", setdlm_rates),
        ("bd3lm-s4-arith", "bd3lm", bd3lm_rates),
    ):
        for tau, rate, parallelism in ((1e6, rates[0], 1.0), (0.5, rates[1], 3.0)):
            point = _point(run, model, tau, task)
            for seed in range(3):
                solved = _solved(rate, rng)
                speed = {
                    "parallelism_mean": parallelism,
                    "tokens_per_forward_mean": 0.9 * parallelism,
                    "tokens_per_second_mean": 50 * parallelism,
                }
                _write_seed(point, seed, solved, family, tau, scores, **speed)
            seeds.aggregate(point)
    return run


def test_a_claim_holds_only_when_its_paired_interval_excludes_zero_on_the_papers_side(tmp_path):
    run = _run_with_pair(tmp_path, setdlm_rates=(0.9, 0.85), bd3lm_rates=(0.5, 0.2))
    found = claims.build_claims(load_results(run))
    by_claim = {c.claim: c for c in found}
    equal_tau = by_claim["solve: accuracy at equal τ = 0.5: SetDLM higher"]
    assert equal_tau.verdict == claims.HOLDS and equal_tau.low > 0
    assert equal_tau.seeds == 3 and equal_tau.examples == PROBLEMS
    assert (
        by_claim["solve: accuracy at equal parallelism factor 2: SetDLM higher"].verdict == "holds"
    )
    lost = by_claim["solve: accuracy lost from τ = 1e6 to parallelism factor 2: SetDLM loses less"]
    # each curve halfway to its τ = 0.5 point (parallelism 3): BD3LM loses 15 points, SetDLM 2.5
    assert lost.verdict == claims.HOLDS and lost.difference == pytest.approx(0.125, abs=0.06)

    reversed_run = _run_with_pair(tmp_path / "r", setdlm_rates=(0.3, 0.2), bd3lm_rates=(0.9, 0.8))
    verdicts = {c.verdict for c in claims.build_claims(load_results(reversed_run))}
    assert claims.REVERSED in verdicts and claims.HOLDS not in verdicts


def test_the_claims_read_each_point_once(tmp_path, monkeypatch):
    """A point serves several claims (equal τ, each parallelism level, the loss): its samples
    are read and resampled once per build, and the claims are those of reading it each time."""
    run = _run_with_pair(tmp_path, setdlm_rates=(0.9, 0.85), bd3lm_rates=(0.5, 0.2))
    results = load_results(run)
    read, resampled = [], claims.resampled

    def counted(point, metric):
        read.append((point.folder, metric))
        return resampled(point, metric)

    monkeypatch.setattr(claims, "resampled", counted)
    found = claims.build_claims(results)
    # τ = 1e6 and 0.5, parallelism 2 and 3, the loss, and accuracy at three equal speeds
    assert len(found) == 8 and len(read) == len(set(read)) == 4  # 2 models x 2 τ, one metric

    # every comparison asks its own draw: each call re-reads, and nothing changes
    monkeypatch.setattr(claims, "_drawn_once", lambda: counted)
    read.clear()
    assert claims.build_claims(results) == found and len(read) > len(set(read))


def test_equal_models_give_no_evidence_either_way(tmp_path):
    run = _run_with_pair(tmp_path, setdlm_rates=(0.6, 0.6), bd3lm_rates=(0.6, 0.6))
    equal_tau = [c for c in claims.build_claims(load_results(run)) if "equal τ" in c.claim]
    assert equal_tau and {c.verdict for c in equal_tau} == {claims.NO_EVIDENCE}
    table = claims_table(load_results(run))
    assert table.rows and all(row["verdict"] for row in table.rows)


def test_the_unconditional_samples_have_claims_of_their_own(tmp_path):
    """The share of correct sampled problems, compared like the solve accuracy: SetDLM keeps
    its samples correct as τ falls, BD3LM's fall apart (the paper's unconditional claim)."""
    run = _run_with_pair(
        tmp_path,
        setdlm_rates=(0.85, 0.8),
        bd3lm_rates=(0.85, 0.3),
        task=claims.UNCONDITIONAL,
        scores=("correct", "valid"),
    )
    by_claim = {c.claim: c for c in claims.build_claims(load_results(run))}
    assert by_claim[
        "unconditional: correct sampled problems at equal τ = 1e6: SetDLM higher"
    ].verdict == (claims.NO_EVIDENCE)
    assert by_claim[
        "unconditional: correct sampled problems at equal τ = 0.5: SetDLM higher"
    ].verdict == (claims.HOLDS)
    assert {
        f"unconditional: correct sampled problems at equal parallelism factor {level}: "
        "SetDLM higher"
        for level in ("1.5", "2")
    } <= set(by_claim)
    lost = by_claim[
        "unconditional: correct sampled problems lost from τ = 1e6 to parallelism factor 2: "
        "SetDLM loses less"
    ]
    assert lost.verdict == claims.HOLDS and "share of samples" in lost.comparison
    assert not any(c.claim.startswith("solve") for c in by_claim.values())  # no solve points


def test_the_unconditional_figure_draws_mauve_under_correctness(tmp_path):
    """The paper's unconditional figure: a second row of panels, MAUVE against the same speed
    axes, a curve per family with its seeds' mean."""
    from setdlm.report.figures import FIGURES, draw

    run = _run_with_pair(
        tmp_path, (0.85, 0.8), (0.85, 0.3), claims.UNCONDITIONAL, ("correct", "mauve")
    )
    figure = draw(FIGURES[claims.UNCONDITIONAL], load_results(run))
    labels = [ax.get_ylabel() for ax in figure.axes]
    assert len(figure.axes) == 2 * 3  # speed, the parallelism factor, tokens per forward
    assert labels[0] == "correct samples (%)" and labels[3] == "MAUVE (offline featurizer)"
    for ax in figure.axes:  # two families, each a bold mean over faint per-seed lines
        assert len(ax.get_lines()) >= 2 * (1 + 3)
    assert FIGURES["arithmetic-solve"].rows == (FIGURES["arithmetic-solve"],)


def test_each_seed_has_its_own_aup_and_the_table_gives_their_interval(tmp_path):
    from setdlm.report.aup import aup, seed_aups
    from setdlm.report.tables import aup_notes

    points = [{0: (1.0, 0.9), 1: (1.0, 0.8)}, {0: (3.0, 0.7), 1: (2.0, 0.8)}]
    per_seed = seed_aups(points, reference=0.9)
    assert per_seed == pytest.approx([
        aup([(1.0, 0.9), (3.0, 0.7)], 0.9).value,
        aup([(1.0, 0.8), (2.0, 0.8)], 0.9).value,
    ])  # fmt: skip
    assert seed_aups([{0: (1.0, 0.9), 1: (1.0, 0.8)}, {0: (3.0, 0.7)}], 0.9) is None
    assert seed_aups([{0: (1.0, 0.9)}, {0: (3.0, 0.7)}], 0.9) is None  # one seed: no spread

    # a table's note: each seed with its own parallelism at each point; a curve whose points
    # have other seeds (BD3LM's τ = 0.5: seed 0 only) gets its mean curve's AUP alone
    run = tmp_path / "runs" / "aup"
    per_seed = {  # (model, τ): [(parallelism, solved of 120) per seed]
        ("setdlm-smax8-arith", 1e6): [(1.0, 108), (1.2, 96)],
        ("setdlm-smax8-arith", 0.5): [(3.0, 84), (2.0, 96)],
        ("bd3lm-s4-arith", 1e6): [(1.0, 90), (1.0, 90)],
        ("bd3lm-s4-arith", 0.5): [(3.0, 60)],
    }
    for (model, tau), seed_points in per_seed.items():
        point = _point(run, model, tau)
        for seed, (parallelism, solved) in enumerate(seed_points):
            rows = [int(i < solved) for i in range(PROBLEMS)]
            family = model.split("-")[0]
            _write_seed(point, seed, rows, family, tau, parallelism_mean=parallelism)
        seeds.aggregate(point)
    [note] = aup_notes(load_results(run).points)
    reference = 0.85  # SetDLM's τ = 1e6 point: (108 + 96) / 2 of 120
    by_hand = [
        aup([(1.0, 0.9), (3.0, 0.7)], reference).value,
        aup([(1.2, 0.8), (2.0, 0.8)], reference).value,
    ]
    low, high = mean_t_interval(by_hand)
    assert low < 0  # two seeds this far apart: the t bound is cut at 0
    expected = (
        f"setdlm-smax8-arith {100 * aup([(1.1, 0.85), (2.5, 0.75)], reference).value:.1f} "
        f"(2 points; per seed {100 * by_hand[0]:.1f} / {100 * by_hand[1]:.1f}: mean "
        f"{100 * np.mean(by_hand):.1f} [0.0†, {100 * high:.1f}])"
    )
    assert expected in note
    bd3lm = aup([(1.0, 0.75), (3.0, 0.5)], reference).value
    assert f"bd3lm-s4-arith {100 * bd3lm:.1f} (2 points)" in note
    assert note.count("per seed") == 1 and "curve of seed means" in note


# ------------------------------------------------------------------------- separation notes
def test_a_table_whose_intervals_all_overlap_says_no_separation(tmp_path):
    same = load_results(_run_with_pair(tmp_path, (0.6, 0.6), (0.6, 0.6)))
    [note] = separation_notes(same.points)
    assert note.startswith("Separation (arithmetic-solve, strict_match") and NO_SEPARATION in note
    assert "rank neither the families nor the τ values" in note

    apart = load_results(_run_with_pair(tmp_path / "b", (0.9, 0.85), (0.9, 0.2)))
    [note] = separation_notes(apart.points)
    # the curves separate at τ = 0.5 (the ±5-point intervals of the synthetic points), BD3LM
    # also within its own sweep, SetDLM not
    assert "1 of 1 pairs separate" in note and "bd3lm-s4-arith (τ 1e6 vs 0.5)" in note
    assert f"{NO_SEPARATION} within: setdlm-smax8-arith" in note


def test_the_t_interval_of_a_mean_over_a_few_seeds():
    low, high = mean_t_interval([1.0, 2.0, 3.0])  # mean 2, standard deviation 1, 2 df
    assert (low, high) == pytest.approx((2 - 4.303 / 3**0.5, 2 + 4.303 / 3**0.5))
    assert mean_t_interval([0.4]) is None and mean_t_interval([]) is None
    assert t_975(4) == 2.776 and t_975(4.9) == 2.776 and t_975(100) == 2.0


def _nested_seeds(run: Path, model: str, family: str, tau: float, rates) -> None:
    """A point whose seed k solves exactly the first ``rates[k]`` share of the problems: two
    points built so are paired problem by problem, the higher rate solving a superset. Its
    parallelism: 1 at τ = 1e6, 3 below."""
    point = _point(run, model, tau)
    for seed, rate in enumerate(rates):
        solved = [int(i < round(rate * PROBLEMS)) for i in range(PROBLEMS)]
        _write_seed(point, seed, solved, family, tau, parallelism_mean=1.0 if tau == 1e6 else 3.0)
    seeds.aggregate(point)


def test_one_seed_cannot_carry_a_verdict_over_five(tmp_path):
    """Five seeds on which SetDLM solves a superset of BD3LM's problems, by 0-2.5 points on four
    and by 40 on one: no resampled difference is negative, so the two-level bootstrap
    excludes 0, but the seeds disagree too much for a t interval over them to; consistent
    leads on every seed hold."""
    run = tmp_path / "runs" / "five"
    bd3lm = (0.6, 0.6, 0.6, 0.6, 0.6)
    _nested_seeds(run, "bd3lm-s4-arith", "bd3lm", 0.5, bd3lm)
    _nested_seeds(run, "setdlm-smax8-arith", "setdlm", 0.5, (0.625, 0.625, 0.625, 0.6, 1.0))
    [carried] = claims.build_claims(load_results(run))
    differences = [0.025, 0.025, 0.025, 0.0, 0.4]
    assert carried.seeds == 5 and carried.difference == pytest.approx(np.mean(differences))
    assert carried.low > 0  # the bootstrap alone would say "holds"
    assert (carried.seed_low, carried.seed_high) == pytest.approx(mean_t_interval(differences))
    assert carried.seed_low < 0 and carried.verdict == claims.NO_EVIDENCE
    row = claims_table(load_results(run)).rows[0]
    assert row["seed_level"][1:] == pytest.approx((100 * carried.seed_low, 100 * carried.seed_high))

    steady = tmp_path / "runs" / "steady"
    _nested_seeds(steady, "bd3lm-s4-arith", "bd3lm", 0.5, bd3lm)
    _nested_seeds(steady, "setdlm-smax8-arith", "setdlm", 0.5, (0.7, 0.725, 0.7, 0.675, 0.7))
    [held] = claims.build_claims(load_results(steady))
    assert held.seed_low > 0 and held.verdict == claims.HOLDS

    # one trained model per family: the bootstrap over problems decides, and the table says so
    single = tmp_path / "runs" / "single"
    _nested_seeds(single, "bd3lm-s4-arith", "bd3lm", 0.5, (0.6,))
    _nested_seeds(single, "setdlm-smax8-arith", "setdlm", 0.5, (0.7,))
    table = claims_table(load_results(single))
    [row] = table.rows
    assert row["seed_level"] is None and row["verdict"] == claims.HOLDS
    assert any("no seed-level interval" in note for note in table.notes)


def test_the_seed_level_interval_follows_the_curves_interpolation(tmp_path):
    """At equal parallelism 2, halfway between each curve's τ = 1e6 (1 token/step) and τ = 0.5
    (3) points, every seed's value is interpolated as the resamples are."""
    run = tmp_path / "runs" / "curve"
    rates = {
        ("setdlm-smax8-arith", 1e6): (0.9, 0.95, 0.9, 0.85, 0.9),
        ("setdlm-smax8-arith", 0.5): (0.7, 0.8, 0.6, 0.7, 0.75),
        ("bd3lm-s4-arith", 1e6): (0.9, 0.9, 0.9, 0.9, 0.9),
        ("bd3lm-s4-arith", 0.5): (0.6, 0.65, 0.6, 0.7, 0.5),
    }
    for (model, tau), seed_rates in rates.items():
        _nested_seeds(run, model, model.split("-")[0], tau, seed_rates)
    by_claim = {c.claim: c for c in claims.build_claims(load_results(run))}
    at_two = by_claim["solve: accuracy at equal parallelism factor 2: SetDLM higher"]
    ours = [
        (a + b) / 2
        for a, b in zip(*[rates["setdlm-smax8-arith", t] for t in (1e6, 0.5)], strict=True)
    ]
    theirs = [
        (a + b) / 2 for a, b in zip(*[rates["bd3lm-s4-arith", t] for t in (1e6, 0.5)], strict=True)
    ]
    differences = [a - b for a, b in zip(ours, theirs, strict=True)]
    assert at_two.difference == pytest.approx(np.mean(differences))
    assert (at_two.seed_low, at_two.seed_high) == pytest.approx(mean_t_interval(differences))
    lost = by_claim["solve: accuracy lost from τ = 1e6 to parallelism factor 2: SetDLM loses less"]
    losses = [  # BD3LM's loss minus SetDLM's, per seed
        (b1 - b2) - (s1 - s2)
        for s1, s2, b1, b2 in zip(
            rates["setdlm-smax8-arith", 1e6],
            ours,
            rates["bd3lm-s4-arith", 1e6],
            theirs,
            strict=True,
        )
    ]
    assert (lost.seed_low, lost.seed_high) == pytest.approx(mean_t_interval(losses))


def test_points_of_other_seeds_are_not_paired_within_a_curve_either(tmp_path):
    """SetDLM's τ = 0.5 point decoded with four seeds where the rest has five: no claim uses
    it (nothing interpolates one seed's value against another's), and the rest still builds."""
    run = tmp_path / "runs" / "short"
    _nested_seeds(run, "bd3lm-s4-arith", "bd3lm", 1e6, (0.9,) * 5)
    _nested_seeds(run, "bd3lm-s4-arith", "bd3lm", 0.5, (0.6,) * 5)
    _nested_seeds(run, "setdlm-smax8-arith", "setdlm", 1e6, (0.9,) * 5)
    _nested_seeds(run, "setdlm-smax8-arith", "setdlm", 0.5, (0.8,) * 4)
    found = claims.build_claims(load_results(run))
    assert [c.claim for c in found] == ["solve: accuracy at equal τ = 1e6: SetDLM higher"]
    assert found[0].seeds == 5


def test_one_model_pairs_with_one_seed_whatever_its_folder(tmp_path):
    """A point evaluated once, without seed folders, against one in a seed-0 folder."""
    run = tmp_path / "runs" / "mixed"
    _nested_seeds(run, "bd3lm-s4-arith", "bd3lm", 0.5, (0.6,))
    _nested_seeds(run, "setdlm-smax8-arith", "setdlm", 0.5, (0.7,))
    point = _point(run, "setdlm-smax8-arith", 0.5)
    for path in (point / "seed-0").iterdir():  # the seed's result, moved up to the point
        path.replace(point / path.name)
    (point / "seed-0").rmdir()
    [claim] = claims.build_claims(load_results(run))
    assert claim.seeds == 1 and claim.seed_low is None
    assert claim.difference == pytest.approx(0.1) and claim.verdict == claims.HOLDS


# -------------------------------------------------------------------------- learning curves
def _write_curve(models: Path, model: str, seed: int, accuracies: list[float], every=100):
    folder = models / model / f"seed-{seed}"
    folder.mkdir(parents=True)
    lines = [
        json.dumps({"step": every * (i + 1), "loss": 1.0 / (i + 1), "accuracy": a, "problems": 200})
        for i, a in enumerate(accuracies)
    ]
    (folder / curves.CURVE_FILE).write_text("\n".join(lines) + "\n")


def test_learning_curves_say_whether_the_last_quarter_is_flat(tmp_path):
    models = tmp_path / "models"
    for seed, shift in enumerate((0.0, 0.01, -0.01)):
        flat = [min(0.8, 0.1 * i) + shift for i in range(1, 17)]  # 80 % from step 800 on
        rising = [0.05 * i + shift for i in range(1, 17)]  # still climbing at the end
        _write_curve(models, "setdlm-smax8-arith", seed, flat)
        _write_curve(models, "bd3lm-s4-arith", seed, rising)
    verdicts = {v.model: v for v in curves.convergence(curves.read_curves(models))}
    assert verdicts["setdlm-smax8-arith"].flat and not verdicts["bd3lm-s4-arith"].flat
    assert verdicts["setdlm-smax8-arith"].mean == pytest.approx(0.8)
    written = curves.write_curves(models, tmp_path / "tables", tmp_path / "figures")
    assert {p.name for p in written} == {
        "learning_curves.md",
        "learning_curves.csv",
        "learning_curves_points.md",
        "learning_curves_points.csv",
        "learning_curves.png",
    }
    summary = (tmp_path / "tables" / "learning_curves.md").read_text()
    assert "| setdlm-smax8-arith | 3 | 1600 |" in summary and "still changing" in summary


def test_a_curve_that_reaches_the_ceiling_late_is_flat_and_one_that_climbs_to_it_is_not(tmp_path):
    # 200 problems: 100 % on every seed has a plain binomial error of 0, which would call one
    # probe step (0.5 points) in the last quarter "still changing"; the adjusted error does not
    assert curves.probe_standard_error(1.0, 200) == pytest.approx(0.0069, abs=1e-4)
    assert curves.probe_standard_error(0.5, 200) == pytest.approx(0.035, abs=1e-3)
    models = tmp_path / "models"
    for seed in range(3):
        late = [0.99] * 12 + [0.995, 1.0, 1.0, 1.0]  # the last point comes in the last quarter
        climbing = [0.8] * 12 + [0.85, 0.9, 0.95, 1.0]  # 15 points over the last quarter
        _write_curve(models, "ar-arith", seed, late)
        _write_curve(models, "setdlm-smax8-arith", seed, climbing)
    verdicts = {v.model: v for v in curves.convergence(curves.read_curves(models))}
    assert verdicts["ar-arith"].flat and verdicts["ar-arith"].noise > 0
    assert not verdicts["setdlm-smax8-arith"].flat


def test_a_broken_curve_file_is_named_with_its_line(tmp_path):
    models = tmp_path / "models"
    _write_curve(models, "ar-arith", 0, [0.1, 0.2])
    path = models / "ar-arith" / "seed-0" / curves.CURVE_FILE
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(curves.CurveError, match=r"seed-0/learning_curve.jsonl:3: not a"):
        curves.read_curves(models)
    with pytest.raises(curves.CurveError, match="no learning_curve.jsonl"):
        curves.read_curves(tmp_path / "nothing")


# ------------------------------------------------------------------ the training check
def _write_training(models: Path, model: str, seed: int, loss: float, accuracy: float):
    folder = models / model / f"seed-{seed}"
    folder.mkdir(parents=True)
    losses = [{"step": s, "loss": loss + 1.0 / s} for s in range(10, 4001, 10)]
    (folder / "losses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in losses))
    curve = [{"step": 4000, "loss": loss, "accuracy": accuracy, "problems": 200}]
    (folder / curves.CURVE_FILE).write_text(json.dumps(curve[0]) + "\n")


def test_the_training_check_holds_a_retraining_to_the_reference_seed_spread(tmp_path):
    from setdlm.report import training_check

    trained = training_check.trained_seeds  # {model: {seed: metrics}} of a folder
    reference = tmp_path / "reference"
    for seed, (loss, accuracy) in enumerate([(0.40, 0.90), (0.41, 0.92), (0.39, 0.91)]):
        _write_training(reference, "setdlm-smax8-arith", seed, loss, accuracy)
    baseline_path = tmp_path / "training.json"
    baseline = training_check.write_baseline(baseline_path, reference)
    spec = baseline["models"]["setdlm-smax8-arith"]["accuracy"]
    # three seeds 1 point apart, on a 200-problem probe whose binomial error at 91 % (Agresti-
    # Coull: 184 of 204) is 2.1 points: the tolerance is 3 x that floor, not 3 x the seeds' 1
    assert spec["mean"] == pytest.approx(0.91) and spec["std"] == pytest.approx(0.01)
    assert spec["std_floor"] == pytest.approx((184 / 204 * 20 / 204 / 204) ** 0.5)
    assert spec["tolerance"] == pytest.approx(3 * spec["std_floor"])
    loss = baseline["models"]["setdlm-smax8-arith"]["loss@4000"]
    assert loss["std_floor"] == 0.01 and loss["tolerance"] == pytest.approx(0.03)
    assert set(baseline["models"]["setdlm-smax8-arith"]) == {
        "accuracy", "loss@1000", "loss@2000", "loss@3000", "loss@4000"
    }  # fmt: skip
    close, far = tmp_path / "close", tmp_path / "far"
    _write_training(close, "setdlm-smax8-arith", 7, 0.405, 0.925)  # one more seed, it seems
    _write_training(far, "setdlm-smax8-arith", 7, 0.405, 0.80)  # 11 points off: 5 std
    assert training_check.compare(baseline, trained(close)) == []
    problems = training_check.compare(baseline, trained(far))
    assert len(problems) == 1 and problems[0].startswith("setdlm-smax8-arith seed 7: accuracy")
    with pytest.raises(training_check.TrainingCheckError, match="no <model>/seed-<k>"):
        trained(tmp_path / "nothing")
    # one seed: no mean to compare; three seeds of another CPU, centred or 4 points low
    assert training_check.mean_comparisons(baseline, trained(close)) == []
    portable, shifted = tmp_path / "portable", tmp_path / "shifted"
    for seed, accuracy in enumerate([0.905, 0.915, 0.92]):
        _write_training(portable, "setdlm-smax8-arith", seed, 0.40, accuracy)
        _write_training(shifted, "setdlm-smax8-arith", seed, 0.40, accuracy - 0.04)
    [(line, agree)] = training_check.mean_comparisons(baseline, trained(portable))
    assert agree and "difference +0.0033" in line
    [(line, agree)] = training_check.mean_comparisons(baseline, trained(shifted))
    assert not agree and line.endswith("DIFFER")


def test_seeds_at_the_ceiling_keep_the_probes_noise_as_tolerance(tmp_path):
    from setdlm.report import training_check

    reference = tmp_path / "reference"
    for seed in range(3):
        _write_training(reference, "ar-arith", seed, 0.30, 1.0)
    baseline = training_check.write_baseline(tmp_path / "training.json", reference)
    # no spread at all; 100 % of 200 problems has an Agresti-Coull error of 0.69 points
    assert baseline["models"]["ar-arith"]["accuracy"]["tolerance"] == pytest.approx(0.0208, 1e-2)
    assert baseline["models"]["ar-arith"]["accuracy"]["problems"] == 200
    one_problem, five = tmp_path / "one", tmp_path / "five"
    _write_training(one_problem, "ar-arith", 3, 0.30, 0.995)
    _write_training(five, "ar-arith", 3, 0.30, 0.975)
    assert training_check.compare(baseline, training_check.trained_seeds(one_problem)) == []
    [problem] = training_check.compare(baseline, training_check.trained_seeds(five))
    assert "accuracy 0.9750, reference 1.0000 ± 0.0207" in problem
    # a seed probed on 100 problems is not judged by the 200-problem tolerance
    (one_problem / "ar-arith" / "seed-3" / curves.CURVE_FILE).write_text(
        json.dumps({"step": 4000, "loss": 0.3, "accuracy": 1.0, "problems": 100}) + "\n"
    )
    [problem] = training_check.compare(baseline, training_check.trained_seeds(one_problem))
    assert "probed on 100 problems, the reference seeds on 200" in problem
    # reference seeds probed on different numbers of problems have no one binomial error
    (reference / "ar-arith" / "seed-2" / curves.CURVE_FILE).write_text(
        json.dumps({"step": 4000, "loss": 0.3, "accuracy": 1.0, "problems": 100}) + "\n"
    )
    with pytest.raises(curves.CurveError, match="share one probe size.*found 100, 200"):
        training_check.write_baseline(tmp_path / "training.json", reference)
    # a baseline of the first format (no std_floor) is refused, not misread
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": 1, "models": {}}))
    with pytest.raises(training_check.TrainingCheckError, match="format 1.*rewrite it"):
        training_check.main([str(one_problem), "--baseline", str(old)])


def test_the_welch_interval_of_a_difference_of_seed_means():
    from setdlm.report.training_check import welch_difference

    # equal variances 1e-4 and n = 3 on both sides: se = sqrt(2e-4 / 3), df = 4, t = 2.776
    difference, low, high = welch_difference([0.90, 0.91, 0.92], [0.88, 0.89, 0.90])
    assert difference == pytest.approx(0.02)
    assert high - difference == pytest.approx(2.776 * (2e-4 / 3) ** 0.5)
    assert difference - low == pytest.approx(high - difference)
    assert welch_difference([0.5, 0.5], [0.5, 0.5]) == (0.0, 0.0, 0.0)
    # every seed at the ceiling on both sides: no variance, the floor keeps one problem in 200
    # (0.005) from reading as a disagreement, while a 2-point shift still does
    at_ceiling, ceiling_low, ceiling_high = welch_difference([0.995] * 3, [1.0] * 4, floor=0.01)
    assert ceiling_low < 0 < ceiling_high and at_ceiling == pytest.approx(-0.005)
    assert welch_difference([0.98] * 3, [1.0] * 4, floor=0.01)[2] < 0
    # the floor never narrows a Welch interval wider than it
    assert welch_difference([0.90, 0.91, 0.92], [0.88, 0.89, 0.90], floor=0.01)[2] == high


# ------------------------------------------------------------------ the decoding check
def test_the_decoding_check_compares_tokens_scores_and_counted_speed():
    from setdlm.report.decoding_check import Decoded, compare

    ids = {f"test-{i}": f"{i} 7 8" for i in range(100)}
    scores = {f"test-{i}": float(i % 2) for i in range(100)}
    counted = {"nfe_mean": 20.0, "parallelism_mean": 1.0}
    key = "arithmetic-solve/setdlm-smax8-arith/tau-0.5/seed-0"
    baseline = {
        "tolerances": {"accuracy": 0.02, "min_agreement": 0.97, "counted_speed": 0.02},
        "points": {key: {"accuracy": 0.5, "counted": counted, "outputs": ids, "scores": scores}},
    }

    def decoded(changed: int = 0, flipped: int = 0, nfe: float = 20.0, subset: int = 100):
        outputs = {i: (v + " 9" if n < changed else v) for n, (i, v) in enumerate(ids.items())}
        new_scores = {i: (1.0 - s if n < flipped else s) for n, (i, s) in enumerate(scores.items())}
        keep = list(ids)[:subset]
        return Decoded(
            key,
            sum(new_scores[i] for i in keep) / len(keep),
            {i: outputs[i] for i in keep},
            {i: new_scores[i] for i in keep},
            {**counted, "nfe_mean": nfe},
        )

    assert compare(baseline, [decoded()])[0].problems == []
    assert "token agreement 96.0 %" in compare(baseline, [decoded(changed=4)])[0].problems[0]
    assert compare(baseline, [decoded(changed=3)])[0].problems == []  # 97 % agree
    # flipping 4 of the first 4 (alternating 0/1) leaves the mean: tokens decide there
    three_points = decoded(flipped=6)  # 0,1,0,1,0,1 -> 1,0,1,0,1,0: the mean is unchanged
    assert compare(baseline, [three_points])[0].problems == []
    lost = decoded(flipped=0)
    lost.scores.update({f"test-{i}": 0.0 for i in range(1, 7, 2)})  # three solved lost: 3 points
    lost = Decoded(key, 0.47, lost.outputs, lost.scores, lost.counted)
    assert any("accuracy 47.0 %" in p for p in compare(baseline, [lost])[0].problems)
    assert any("nfe_mean 21" in p for p in compare(baseline, [decoded(nfe=21.0)])[0].problems)
    # the first 20 examples only: their own baseline accuracy, no counted speed compared
    assert compare(baseline, [decoded(nfe=30.0, subset=20)])[0].problems == []


# ------------------------------------------------------------------ the committed references
REPO = Path(__file__).resolve().parent.parent


def test_every_seed_of_the_default_reuses_its_committed_reference_model():
    """`make run` copies a reference model only when its recipe is the default's; a recipe
    changed without `make reference-models` would retrain (an hour) where it should copy."""
    from setdlm.workflow.config import load, model_seeds
    from setdlm.workflow.train import model_recipe, reference_model, tiny_settings

    config = load(REPO / "workflows" / "config" / "tiny.yaml", check_data=False)
    config["reference_models"] = str(REPO / config["reference_models"])
    pairs = [(name, seed) for name in config["models"] for seed in model_seeds(config, name) or ()]
    assert len(pairs) >= 12  # four arithmetic models, three seeds each
    recipes = {pair: model_recipe(config, pair[0], tiny_settings(config, *pair)) for pair in pairs}
    stale = [pair for pair in pairs if reference_model(config, *pair, recipes[pair]) is None]
    assert stale == [], "recipes without a committed reference model (make reference-models)"


def test_a_learning_curve_takes_its_budget_from_the_solve_task_unless_it_states_one():
    """One budget for one question: the curve probes the problems the solve task scores, so it
    inherits that task's max_new_tokens (resolved before the plan hashes the settings, so that
    stating it and inheriting it are the same training); a model the task does not evaluate
    keeps the probe's own default, and a curve's own budget wins."""
    from setdlm.workflow.config import load, train_settings

    config = load(REPO / "workflows" / "config" / "tiny.yaml", check_data=False)
    solve = config["tasks"]["arithmetic-solve"]
    assert "max_new_tokens" not in config["models"]["setdlm-smax8-arith"]["train"]["curve"]
    assert train_settings(config, "setdlm-smax8-arith")["curve"]["max_new_tokens"] == 26
    solve["max_new_tokens"] = 30
    assert train_settings(config, "setdlm-smax8-arith")["curve"]["max_new_tokens"] == 30
    solve["models"].remove("ar-arith")
    assert "max_new_tokens" not in train_settings(config, "ar-arith")["curve"]
    config["models"]["ar-arith"]["train"] = {
        **config["models"]["ar-arith"]["train"],
        "curve": {"every": 250, "max_new_tokens": 40},
    }
    solve["models"].append("ar-arith")
    assert train_settings(config, "ar-arith")["curve"]["max_new_tokens"] == 40


def test_the_readme_quotes_the_reference_claims_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quoted = readme.split("<!-- CLAIMS TABLE", 1)[1].split("<!-- END CLAIMS TABLE -->", 1)[0]
    reference = (REPO / "results/reference/tiny/tables/claims.md").read_text(encoding="utf-8")
    rows = [line for line in reference.splitlines() if line.startswith("| ")]
    # the paper's part, every row of it; the part beyond the paper is said in a sentence
    paper = [row for row in rows if row.startswith("| the paper's claims |")]
    assert len(paper) >= 10 and all(row in quoted.splitlines() for row in paper)
    assert rows[0] in quoted.splitlines()  # the header
    assert not any(line.startswith("| beyond the paper |") for line in quoted.splitlines())
