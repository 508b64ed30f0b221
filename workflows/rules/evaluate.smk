# Evaluation: every point's <run>/<task>/<model>/<point>/ (or <point>/seed-<k>/ for a model
# trained once per seed: samples.jsonl, metrics.json, run.json), filled by `setdlm eval`.
# Points are spread over jobs by each task's `jobs` setting (setdlm/workflow/jobs.py): one per
# point, one per model of the task, or one per model for all the tasks that say so; a job runs
# its points one after the other in one process (`python -m setdlm.workflow.points job`), with
# the guards of setdlm/workflow/points.py around each: a folder left by another configuration
# or code version starts over while the same point's interrupted samples are resumed, and a
# result is accepted only when metrics.json covers every sample exactly once. One rule per
# job, since a rule's outputs are fixed patterns.

import re

from setdlm.workflow.config import digest
from setdlm.workflow.jobs import (
    aggregations,
    evaluation_jobs,
    job_priority,
    job_resources,
    shard_jobs,
)

SHARD_JOBS = shard_jobs(PLAN, RUN)


def take_profile_resources(rule_name):
    """What a profile sets for the rule `evaluate` (`set-resources: evaluate: gpu_model: ...`),
    given to an evaluation rule of another name: every evaluation job takes it. Snakemake
    applies a rule's own `set-resources` when it defines the rule, in the form this (pinned)
    version parses them into, which is what is added here."""
    settings = workflow.resource_settings._parsed_overwrite_resources.get("evaluate")
    if settings:
        workflow.get_rule(rule_name).resources.update(settings)


def job_rule_resources(job):
    """The job's generic resources: memory and runtime grow with the attempt, so a profile's
    retries ask for more each time."""
    return {
        "mem_mb": lambda wildcards, attempt: job_resources(PLAN, job)["mem_mb"] * attempt,
        "runtime": lambda wildcards, attempt: job_resources(PLAN, job)["runtime"] * attempt,
        "gpu": job_resources(PLAN, job)["gpus"],
    }


def job_threads(job):
    threads = workflow.resource_settings.overwrite_threads.get("evaluate")
    return threads if threads is not None else job_resources(PLAN, job)["cpus"]


for _job in evaluation_jobs(PLAN).values():

    rule:
        name:
            _job.rule_name
        input:
            list(_job.inputs().values()),
        output:
            [ensure(path, non_empty=True) for path in _job.outputs()],
        params:
            key=_job.key,
            config_hash=digest([point.config_hash for point in _job.points]),
            code_version=CODE_VERSION,
        log:
            f"{RUN}/logs/{_job.log_name}",
        benchmark:
            f"{RUN}/benchmarks/{_job.log_name.removesuffix('.log')}.tsv"
        threads: job_threads(_job)
        # the longest first (setdlm/workflow/jobs.py), after every training
        priority: job_priority(PLAN, _job)
        resources:
            **job_rule_resources(_job),
        shell:
            "SETDLM_DATA_DIR={RUN:q}/data {PYTHON:q} -m setdlm.workflow.points job {RUN:q} "
            "{params.key:q} {params.code_version:q} --threads {threads} > {log:q} 2>&1"

    take_profile_resources(_job.rule_name)


# A point split into shards (a task's `shards` with `jobs: point`): each shard is a job of this
# one rule, so that a SLURM profile could submit a point's shards as a job array
# (`slurm-array-jobs: evaluate_shard`; off in ours, its config says why), and a killed shard is
# rerun alone; the point's own job
# above merges them.
def shard_of(wildcards):
    return SHARD_JOBS[(wildcards.where, wildcards.shard)]


def shard_threads(wildcards):
    threads = workflow.resource_settings.overwrite_threads.get("evaluate")
    return threads if threads is not None else PLAN.resources(shard_of(wildcards).point.task)["cpus"]


if SHARD_JOBS:

    rule evaluate_shard:
        input:
            lambda wildcards: list(shard_of(wildcards).point.inputs.values()),
        output:
            ensure(f"{RUN}/{{where}}/shards/{{shard}}/shard.json", non_empty=True),
        wildcard_constraints:
            where="|".join(sorted({re.escape(where) for where, _ in SHARD_JOBS})),
            shard=r"\d+-of-\d+",
        params:
            config_hash=lambda wildcards: shard_of(wildcards).point.config_hash,
            code_version=CODE_VERSION,
        log:
            f"{RUN}/logs/evaluate_shard/{{where}}/{{shard}}.log",
        benchmark:
            f"{RUN}/benchmarks/evaluate_shard/{{where}}/{{shard}}.tsv"
        threads: shard_threads
        resources:
            **resources_of(lambda wildcards: shard_of(wildcards).point.task),
        shell:
            "SETDLM_DATA_DIR={RUN:q}/data {PYTHON:q} -m setdlm.workflow.points shard {RUN:q} "
            "{wildcards.where:q} {wildcards.shard} {params.code_version:q} --threads {threads} "
            "> {log:q} 2>&1"

    take_profile_resources("evaluate_shard")


# A model trained once per seed: each point's metrics.json is the aggregate over its seeds'
# (`setdlm aggregate`: the mean over the seeds with a two-level bootstrap interval, and each
# seed's values), which the tables, figures, check and MLflow read like any point's. One job
# per task and model, for all its points: each takes a fraction of a second.
for (_task, _model), _points in aggregations(PLAN).items():

    rule:
        name:
            f"aggregate_{_task}_{_model}".replace("-", "_")
        input:
            [path for point in _points for path in point.inputs.values()],
        output:
            [ensure(f"{point.folder}/metrics.json", non_empty=True) for point in _points],
        params:
            folders=[point.folder for point in _points],
            config_hash=digest([point.config_hash for point in _points]),
            code_version=CODE_VERSION,
        log:
            f"{RUN}/logs/aggregate_{_task}_{_model}.log",
        benchmark:
            f"{RUN}/benchmarks/aggregate_{_task}_{_model}.tsv"
        localrule: True
        shell:
            "{SETDLM:q} aggregate {params.folders:q} > {log:q} 2>&1"
