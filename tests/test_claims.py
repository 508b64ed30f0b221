"""The claims table of issue 49: two parts, speed from the same run's batch-1 timing, and
verdicts under Holm's rule over the rows of a part. Synthetic result folders in the layout; no
model is trained."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from setdlm.eval import seeds
from setdlm.eval.intervals import T_975, mean_t_interval, mean_t_p, t_two_sided_p
from setdlm.report import claim_stats, claims
from setdlm.report.claim_stats import BEYOND, PAPER, Claim, bootstrap_p, holm
from setdlm.report.claims_table import claims_table
from setdlm.results.reader import load_results
from setdlm.tasks import task as task_info

PROBLEMS, TIMED = 60, 6
HARDWARE = {"device": "cpu", "cpu": "Test CPU", "torch_threads": 1}


# ------------------------------------------------------------------------------ statistics
def test_the_t_p_value_is_the_test_the_t_interval_inverts():
    for df, quantile in enumerate(T_975, start=1):  # the table's 3-decimal quantiles
        assert t_two_sided_p(quantile, df) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(1.0, 1) == pytest.approx(0.5)  # Cauchy: P(|T| > 1) = 1/2
    assert t_two_sided_p(0.0, 4) == 1.0 and t_two_sided_p(-3.0, 4) == t_two_sided_p(3.0, 4)
    values = [0.02, 0.05, 0.01, 0.04, 0.03]
    low, _ = mean_t_interval(values)
    assert (low > 0) == (mean_t_p(values) < 0.05)
    assert mean_t_p([0.1, 0.1, 0.1]) == 0.0 and mean_t_p([0.0, 0.0]) == 1.0
    assert mean_t_p([0.3]) is None


def test_the_bootstrap_p_value_counts_the_replicates_across_zero():
    assert bootstrap_p(np.full(999, 0.2)) == pytest.approx(2 / 1000)
    assert bootstrap_p(np.zeros(10)) == 1.0
    drawn = np.concatenate([np.full(30, -0.1), np.full(970, 0.1)])
    assert bootstrap_p(drawn) == pytest.approx(2 * 31 / 1001)


def _claim(part: str, p: float, low: float = 0.01, high: float = 0.2) -> Claim:
    """A claim whose bootstrap and t tests both give ``p``, its intervals [low, high]."""
    return Claim(part, f"{part} {p}", "x", "x", "pp", 100.0, 0.1, low, high, 5, 100, p,
                 low, high, p)  # fmt: skip


def test_holm_over_the_rows_of_one_part_decides_the_verdicts():
    """Three rows of the paper's part at p = 0.01, 0.03, 0.04: each interval excludes 0, but
    Holm compares them with 0.05/3, 0.05/2 and 0.05: the first holds, and the second fails,
    which stops the third. A row of the other part is judged among its own rows only."""
    rows = holm([_claim(PAPER, 0.03), _claim(PAPER, 0.01), _claim(BEYOND, 0.04),
                 _claim(PAPER, 0.04)])  # fmt: skip
    assert [round(r.adjusted_p, 6) for r in rows] == [0.06, 0.03, 0.04, 0.06]
    assert [r.verdict for r in rows] == ["no evidence", "holds", "holds", "no evidence"]
    assert all(r.side == "holds" for r in rows)  # the unadjusted intervals, unchanged
    reversed_row = holm([_claim(PAPER, 0.001, -0.2, -0.01)])[0]
    assert reversed_row.verdict == "reversed"
    # the intervals must agree with the test: a low p with an interval across 0 decides nothing
    assert holm([_claim(PAPER, 0.001, -0.01, 0.2)])[0].verdict == "no evidence"
    with pytest.raises(ValueError, match="multiplicity rule"):
        _ = _claim(PAPER, 0.01).verdict


# ------------------------------------------------------------------------- a synthetic run
def _write_seed(point: Path, seed: int, solved, family: str, tau: float, speed: dict, timing):
    """One seed's result: samples.jsonl (the first example a warm-up, the next TIMED timed at
    batch 1 with ``timing(i)`` = (latency, nfe, generated tokens), the rest batched) and
    metrics.json."""
    folder = point / f"seed-{seed}"
    folder.mkdir(parents=True)
    records = []
    for i, s in enumerate(solved):
        latency, nfe, tokens = timing(i)
        timed = 1 <= i <= TIMED
        records.append({
            "id": f"test-{i:03d}", "scores": {"strict_match": float(s)}, "warmup": i == 0,
            "timed": timed, "batch_size": 1 if i <= TIMED else 16, "latency_seconds": latency,
            "nfe": nfe, "generated_tokens": tokens,
        })  # fmt: skip
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    value = float(np.mean(solved))
    size = {"setdlm": {"schedule": {"d": 4, "M": 8}}, "bd3lm": {"block_size": 4}}[family]
    metrics = {
        "task": task_info(point.parent.parent.name).field,
        "examples": len(solved),
        "quality": {"strict_match": {"value": value, "bootstrap_95": [0, 1], "definition": "x"}},
        "speed": {"protocol": "batch 1: per-example tok/s, the paper's speed protocol", **speed},
        "config": {
            "model_config": {"family": family, **size},
            "decode": {"confidence_threshold": tau},
            "model_source": str(point.parents[2] / "models" / point.parent.name / folder.name),
        },
        "config_hash": f"{family}-{tau}-{seed}",
        "hardware": HARDWARE,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))


def _run(tmp_path: Path) -> Path:
    """SetDLM and BD3LM on the solve task at τ = 1e6, 0.7 and 0.5, three seeds: SetDLM's
    forwards take 4 ms, BD3LM's 5 ms, the same NFE at τ = 1e6; both lose accuracy as they
    speed up, SetDLM less."""
    run = tmp_path / "runs" / "claims"
    rng = np.random.default_rng(11)
    curves = {  # (family, τ): (accuracy, parallelism factor, tokens per forward, NFE)
        ("setdlm", 1e6): (0.95, 1.0, 0.9, 20),
        ("setdlm", 0.7): (0.9, 2.0, 1.7, 10),
        ("setdlm", 0.5): (0.8, 3.0, 2.5, 7),
        ("bd3lm", 1e6): (0.95, 1.0, 0.9, 20),
        ("bd3lm", 0.7): (0.8, 2.0, 1.8, 10),
        ("bd3lm", 0.5): (0.6, 3.0, 2.6, 7),
    }
    for (family, tau), (accuracy, factor, per_forward, nfe) in curves.items():
        model = {"setdlm": "setdlm-smax8-arith", "bd3lm": "bd3lm-s4-arith"}[family]
        point = run / "arithmetic-solve" / model / f"tau-{tau:g}"
        forward = 0.004 if family == "setdlm" else 0.005
        for seed in range(3):

            def timing(i, nfe=nfe, forward=forward, seed=seed):
                jitter = 1 + 0.02 * ((i * 7 + seed) % 5)
                return nfe * forward * jitter, nfe, 18

            tokens_per_second = 18 / (nfe * forward)
            speed = {
                "parallelism_mean": factor,
                "tokens_per_forward_mean": per_forward,
                "tokens_per_second_mean": tokens_per_second,
                "timed_examples": TIMED,
            }
            solved = [int(x) for x in rng.random(PROBLEMS) < accuracy]
            _write_seed(point, seed, solved, family, tau, speed, timing)
        seeds.aggregate(point)
    return run


def test_the_papers_claims_come_first_with_speed_from_the_batch1_timing(tmp_path):
    found = claims.build_claims(load_results(_run(tmp_path)))
    parts = [c.part for c in found]
    assert parts == sorted(parts, key=claim_stats.PARTS.index)  # the paper's part first
    by_claim = {c.claim: c for c in found}
    speed = by_claim[
        "solve: tok/s at τ = 1e6 (batch 1, cpu (Test CPU, 1 torch thread)): SetDLM faster"
    ]
    # 18 tokens in 20 forwards of 4 or 5 ms (times the same jitter): 225 against 180 tok/s
    assert speed.part == PAPER and speed.unit == "tok/s" and speed.examples == TIMED
    assert 40 < speed.difference < 48 and speed.verdict == "holds"
    forward = by_claim[
        "solve: µs/forward at τ = 1e6 (batch 1, cpu (Test CPU, 1 torch thread)): SetDLM cheaper "
        "per forward"
    ]
    assert forward.difference == pytest.approx(0.001, rel=0.05) and forward.verdict == "holds"
    assert "BD3LM − SetDLM" in forward.comparison
    equal_speed = [c for c in found if "at equal speed" in c.claim]
    assert len(equal_speed) == 3 and all(c.part == PAPER for c in equal_speed)
    assert all("SPEC 6.1" in c.protocol for c in equal_speed)
    # the equal-τ rows below 1e6 and the equal-parallelism rows are beyond the paper
    below = by_claim["solve: accuracy at equal τ = 0.5: SetDLM higher"]
    assert below.part == BEYOND and below.protocol.startswith("beyond the paper")
    at_two = by_claim["solve: accuracy at equal parallelism factor 2: SetDLM higher"]
    # at the factor's level, each curve's tokens per forward there (both at their τ = 0.7)
    assert "SetDLM between τ 1e6 and 0.7, 1.70 tokens/forward" in at_two.comparison
    assert "BD3LM between τ 1e6 and 0.7, 1.80 tokens/forward" in at_two.comparison


def test_no_speed_claim_from_examples_timed_in_a_batch(tmp_path):
    run = _run(tmp_path)
    for samples in run.glob("arithmetic-solve/setdlm-smax8-arith/tau-1e+06/seed-*/samples.jsonl"):
        lines = [json.loads(line) for line in samples.read_text().splitlines()]
        lines = [dict(r, batch_size=4) for r in lines]
        samples.write_text("".join(json.dumps(r) + "\n" for r in lines))
    found = claims.build_claims(load_results(run))
    assert not any("τ = 1e6 (batch 1" in c.claim for c in found)
    assert any(c.claim == "solve: accuracy at equal τ = 1e6: SetDLM higher" for c in found)


def test_the_table_gives_both_parts_the_adjusted_p_and_the_rule(tmp_path):
    table = claims_table(load_results(_run(tmp_path)))
    assert [c.key for c in table.columns][:4] == ["part", "claim", "protocol", "comparison"]
    assert {row["part"] for row in table.rows} == {PAPER, BEYOND}
    assert all(row["p_holm"] is not None for row in table.rows)
    notes = " ".join(table.notes)
    assert "Holm's step-down over the rows of each part" in notes
    assert "crossed design (10,000 seeded replicates" in notes
    assert "cpu (Test CPU, 1 torch thread)" in notes and "batch-1 timing" in notes
    tok = next(row for row in table.rows if row["unit"] == "tok/s")
    assert 40 < tok["difference"][0] < 48  # shown in tok/s
    accuracy = next(row for row in table.rows if row["unit"] == "pp")
    assert accuracy["difference"][2] > 1  # a fraction, shown in percentage points
    micro = next(row for row in table.rows if row["unit"] == "µs/forward")
    assert 900 < micro["difference"][0] < 1100  # 1 ms, shown in µs
