"""How a plan's points are spread over evaluation jobs (setdlm/workflow/jobs.py): each task's
`jobs` setting, on the embedded default's plan (built in-process: no Snakemake, no model)."""

from __future__ import annotations

import copy
import os
import re
from collections import Counter

import pytest
from configs import tiny_config

from setdlm.workflow.jobs import evaluation_jobs, job_priority, job_resources
from setdlm.workflow.plan import TRAINING_PRIORITY, build


def _plan(config: dict):
    return build(config, os.environ, log=lambda message: None)


def _with_jobs(kinds: dict[str, str]) -> dict:
    config = copy.deepcopy(tiny_config())
    for task, kind in kinds.items():
        config["tasks"][task]["jobs"] = kind
    return config


def _every_seed_point_once(plan, jobs) -> None:
    filled = Counter(point.folder for job in jobs.values() for point in job.points)
    assert set(filled) == {point.folder for point in plan.seed_points.values()}
    assert set(filled.values()) == {1}


def test_the_default_evaluates_each_model_in_two_jobs_of_all_its_seeds():
    config = tiny_config()
    plan = _plan(config)
    jobs = evaluation_jobs(plan)
    seeds = config["models"]["ar-arith"]["train"]["seeds"]
    sampling = "arithmetic-unconditional"
    sampled = config["tasks"][sampling]["models"]
    assert "mdlm-arith" not in sampled  # left out of sampling (tiny.yaml says why): one job
    assert set(jobs) == {*config["models"], *(f"{sampling}/{model}" for model in sampled)}
    _every_seed_point_once(plan, jobs)
    assert jobs[f"{sampling}/bd3lm-s4-arith"].tasks == (sampling,)
    setdlm = jobs["setdlm-smax8-arith"]
    # every other task, in the configuration's order
    assert setdlm.tasks == tuple(task for task in config["tasks"] if task != sampling)
    assert [point.seed for point in setdlm.points] == sorted(
        seed for seed in seeds for _ in range(len(setdlm.points) // len(seeds))
    )  # seed by seed
    solve = [p.point for p in setdlm.points if p.task == "arithmetic-solve" and p.seed == 3]
    assert solve == ["tau-1e+06", "tau-0.9", "tau-0.7", "tau-0.5", "tau-0.3", "tau-0.1"]


def test_the_default_starts_its_costliest_jobs_first():
    # The order the default's jobs took on 2 cores (issue 47): MDLM's sampling job, about a
    # third of the evaluation's CPU time (no KV cache, 63 one-token forwards per sample),
    # started last and held up the tables; the model copies, which open every job of their
    # model, waited behind evaluations. With MDLM no longer sampled, its own job (no cache for
    # its solve and infill points either) is the costliest by the plan's estimate.
    plan = _plan(tiny_config())
    priority = {key: job_priority(plan, job) for key, job in evaluation_jobs(plan).items()}
    order = sorted(priority, key=priority.get, reverse=True)
    assert order[0] == "mdlm-arith"
    assert order[-1] == "ar-arith"  # solve, infill and likelihood of the cheapest family
    # a point without a threshold (one token per forward) outweighs one with
    sampling = evaluation_jobs(plan)["arithmetic-unconditional/setdlm-smax8-arith"]
    assert priority["arithmetic-unconditional/ar-arith"] < priority[sampling.key]
    assert max(priority.values()) < TRAINING_PRIORITY


def test_a_job_per_model_and_seed_holds_every_task_of_one_seed():
    plan = _plan(_with_jobs({task: "model" for task in tiny_config()["tasks"]}))
    jobs = evaluation_jobs(plan)
    _every_seed_point_once(plan, jobs)
    seeds = tiny_config()["models"]["ar-arith"]["train"]["seeds"]
    assert set(jobs) == {f"{m}/seed-{s}" for m in tiny_config()["models"] for s in seeds}
    assert {point.seed for point in jobs["mdlm-arith/seed-2"].points} == {2}


def test_a_job_per_task_holds_every_tau_and_policy_of_one_model_and_seed():
    plan = _plan(_with_jobs({task: "task" for task in tiny_config()["tasks"]}))
    jobs = evaluation_jobs(plan)
    _every_seed_point_once(plan, jobs)
    bd3lm = jobs["arithmetic-solve/bd3lm-s4-arith/seed-0"]
    names = [point.point for point in bd3lm.points]
    assert len(names) == 12 and "dual-cache-tau-0.5" in names and "tau-0.5" in names
    assert jobs["likelihood-arithmetic/ar-arith/seed-4"].tasks == ("likelihood-arithmetic",)


def test_kinds_mix_and_a_job_per_point_holds_one_point():
    plan = _plan(
        _with_jobs(
            {
                "arithmetic-solve": "point",
                "arithmetic-infill": "task",
                "arithmetic-unconditional": "model",
                "likelihood-arithmetic": "model",
            }
        )
    )
    jobs = evaluation_jobs(plan)
    _every_seed_point_once(plan, jobs)
    one = jobs["arithmetic-solve/setdlm-smax8-arith/tau-0.5/seed-2"]
    assert [point.folder for point in one.points] == [
        plan.seed_point("arithmetic-solve", "setdlm-smax8-arith", "tau-0.5", 2).folder
    ]
    assert "arithmetic-infill/mdlm-arith/seed-1" in jobs
    # the other two tasks still share the model's job
    assert jobs["bd3lm-s4-arith/seed-1"].tasks == (
        "arithmetic-unconditional",
        "likelihood-arithmetic",
    )


def test_rule_and_log_names_are_unique_identifiers():
    jobs = evaluation_jobs(_plan(_with_jobs({"arithmetic-solve": "point"})))
    rules = [job.rule_name for job in jobs.values()]
    assert len(set(rules)) == len(rules)
    assert all(re.fullmatch(r"[A-Za-z_]\w*", rule) for rule in rules)
    assert len({job.log_name for job in jobs.values()}) == len(jobs)


def test_a_job_over_several_tasks_asks_for_the_most_of_each_and_their_summed_runtime():
    config = tiny_config()
    config["resources"]["arithmetic-unconditional"] = {"mem_mb": 6000, "runtime": 45, "cpus": 2}
    config["tasks"]["arithmetic-unconditional"]["jobs"] = "model-all-seeds"
    plan = _plan(config)
    job = evaluation_jobs(plan)["ar-arith"]
    default = config["resources"]["default"]
    assert job_resources(plan, job) == {
        "cpus": 2,
        "mem_mb": 6000,
        "gpus": 0,
        "runtime": 45 + 3 * default["runtime"],
    }


def test_jobs_is_not_a_setting_of_a_point():
    """Regrouping points changes no point's identity: no result is recomputed for it."""
    before = _plan(tiny_config())
    after = _plan(_with_jobs({task: "point" for task in tiny_config()["tasks"]}))
    assert {k: p.config_hash for k, p in before.seed_points.items()} == {
        k: p.config_hash for k, p in after.seed_points.items()
    }
    assert all("--jobs" not in point.args for point in after.seed_points.values())


def test_an_unknown_kind_is_refused_naming_the_key():
    from setdlm.workflow.config import ConfigError

    with pytest.raises(ConfigError, match="jobs"):
        _plan(_with_jobs({"arithmetic-solve": "per-point"}))


def test_a_model_of_its_own_shards_splits_only_its_points_and_changes_no_identity():
    """`overrides.<model>.shards` shards that model's points only (the slow one's), over the
    task's `shards`; no point's identity moves, so nothing is recomputed for it."""
    from setdlm.workflow.config import ConfigError

    config = _with_jobs({"arithmetic-solve": "point"})
    solve = config["tasks"]["arithmetic-solve"]
    solve.setdefault("overrides", {}).setdefault("mdlm-arith", {})["shards"] = 3
    plan = _plan(config)
    jobs = evaluation_jobs(plan)
    sharded = {job.key: job.shards for job in jobs.values() if job.shards > 1}
    assert sharded and all(key.startswith("arithmetic-solve/mdlm-arith/") for key in sharded)
    assert set(sharded.values()) == {3}
    assert {k: p.config_hash for k, p in plan.seed_points.items()} == {
        k: p.config_hash
        for k, p in _plan(_with_jobs({"arithmetic-solve": "point"})).seed_points.items()
    }
    solve["jobs"] = "task"  # a job over several points cannot be split
    with pytest.raises(
        ConfigError, match=r"overrides\.mdlm-arith\.shards: 3 shards .* `jobs: point`"
    ):
        _plan(config)
