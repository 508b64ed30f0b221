"""`setdlm plan --cost`: the jobs, GPUs and GPU hours of a small matrix, by the stated model."""

from __future__ import annotations

from pathlib import Path

import pytest

from setdlm.checkpoints.zoo import REVISIONS_ENV
from setdlm.report.paper_numbers import match_gsm8k
from setdlm.util.paths import data_path
from setdlm.workflow import cost
from setdlm.workflow import plan as workflow_plan


def test_the_cost_of_a_small_matrix(monkeypatch):
    monkeypatch.delenv(REVISIONS_ENV, raising=False)
    config = {
        "name": "cost",
        "models": {
            "ar": {"family": "ar", "checkpoint": {"gsm8k": "gsm8k:ar"}},
            "setdlm-smax16": {
                "family": "setdlm",
                "d": 8,
                "window": 8,
                "checkpoint": {"gsm8k": "gsm8k:setdlm-smax16"},
            },
        },
        "tasks": {
            "gsm8k": {
                "models": ["ar", "setdlm-smax16"],
                "thresholds": [1.0e6, 0.9],
                "limit": 10,
                "max_new_tokens": 100,
                "overrides": {"ar": {"thresholds": [1.0e6]}},
            }
        },
        "data": {"sources": {"gsm8k": "dir"}},
        "resources": {"gsm8k": {"gpus": 2}, "fetch": {"gpus": 0}},
    }
    environ = {"SETDLM_DATA_DIR": str(data_path())}
    plan = workflow_plan.build(config, environ)
    rules = {rule.rule: rule for rule in cost.costs(plan)}
    # the default spreads a task's points over one job per model: AR's, and SetDLM's two τ
    assert {name: rule.jobs for name, rule in rules.items()} == {
        "copy_data": 1,  # a data directory's file: a local rule, no GPU
        "data_manifest": 1,
        "fetch": 2,
        "evaluate": 2,
        "table_gsm8k": 1,
        "figures": 1,
        "sync_mlflow": 1,
        "all_tables": 1,
    }

    def speed(family, size, tau):
        return match_gsm8k(family, size, tau).tokens_per_second

    # smax16 has no published speed: the mean of smax8's and smax32's at the same τ
    smax16 = [(speed("setdlm", 8, tau) + speed("setdlm", 32, tau)) / 2 for tau in (1e6, 0.9)]
    per_token = 1 / speed("ar", None, None) + sum(1 / s for s in smax16)
    overhead = 2 * cost.JOB_OVERHEAD_S
    evaluate = rules["evaluate"]
    assert evaluate.gpus == 2
    # 10 examples x min(256 typical, 100 budget) tokens; the bound decodes the 100 each
    assert evaluate.gpu_seconds == pytest.approx(2 * (overhead + 10 * 100 * per_token))
    assert evaluate.bound_seconds == pytest.approx(2 * (overhead + 10 * 100 * per_token))
    assert evaluate.tasks["gsm8k"][0] == 2
    assert rules["fetch"].gpu_seconds == 0
    config["tasks"]["gsm8k"]["max_new_tokens"] = None  # the protocol's 1,024, 256 typical
    rules = {rule.rule: rule for rule in cost.costs(workflow_plan.build(config, environ))}
    assert rules["evaluate"].gpu_seconds == pytest.approx(2 * (overhead + 10 * 256 * per_token))
    assert rules["evaluate"].bound_seconds == pytest.approx(2 * (overhead + 10 * 1024 * per_token))
    assert "total" in cost.render(list(rules.values()))
    # a job per point, each in 4 shards: the decoding over the shard jobs (each its overhead),
    # then each point's own job merges and scores them
    config["tasks"]["gsm8k"].update(jobs="point", shards=4)
    rules = {rule.rule: rule for rule in cost.costs(workflow_plan.build(config, environ))}
    assert (rules["evaluate_shard"].jobs, rules["evaluate"].jobs) == (12, 3)
    assert rules["evaluate_shard"].gpu_seconds == pytest.approx(
        2 * (12 * cost.JOB_OVERHEAD_S + 10 * 256 * per_token)
    )
    assert rules["evaluate"].gpu_seconds == pytest.approx(2 * 3 * cost.JOB_OVERHEAD_S)


def test_setdlm_plan_prints_the_bill(capsys):
    from setdlm.cli import main

    config = str(Path(__file__).resolve().parents[1] / "workflows" / "config" / "paper.yaml")
    assert main(["plan", config, "--cost"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["rule", "jobs", "GPUs/job", "GPU", "hours", "bound"]
    assert "evaluate_shard" in out and "total" in out and " 468 " in out
