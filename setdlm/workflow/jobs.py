"""How a plan's evaluation points are spread over jobs: the ``jobs`` setting of each task.

Starting a Python process with torch, a model, a featurizer and a scorer costs seconds, more
than decoding a point of the tiny default; on a cluster every job also waits for the scheduler.
So points that take seconds share a job, while a point that takes hours has one of its own:

- ``point``: one job per point (and training seed);
- ``task``: one job per model (and seed) of the task: all its τ points and decoding policies;
- ``task-all-seeds``: the same for every seed of the model at once;
- ``model``: one job per model (and seed) for all the tasks that say so: every such task's
  points of the model in one process;
- ``model-all-seeds``: the same for every seed of the model at once.

Grouping seeds loads what a process needs once (torch, the judge of sampled problems, the
featurizer and its reference features, the scorer) per model instead of once per seed; fewer,
longer jobs also pack less evenly on a few cores, which is why the default keeps two jobs per
model (its sampling task apart).

A job runs its points one after the other (``python -m setdlm.workflow.points job``), each with
the same guards and ``setdlm eval`` command line as a job of its own: a finished point is never
computed again, and an interrupted job resumes at its first unfinished point (within it, at its
first unfinished example). A job's resources are the largest its tasks ask for, and its
runtime the sum of theirs.

With ``jobs: point``, a task's ``shards: N`` splits each point further: N shard jobs each decode
a contiguous slice of the examples into ``<point>/shards/<i>-of-<N>/`` (``setdlm eval
--shard i/N``), and the point's own job merges them (``merge_shards``) into the samples and
metrics one job would have written. A killed shard is rerun alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

JOB_KINDS = ("point", "task", "task-all-seeds", "model", "model-all-seeds")
DEFAULT_KIND = "task"


@dataclass(frozen=True)
class EvalJob:
    """One evaluation job: the points (of one seed, or of a model trained once) it fills."""

    key: str  # what it evaluates, e.g. "setdlm-smax8-arith/seed-0": the command's argument
    model: str
    points: tuple  # setdlm.workflow.plan.Point, in the configuration's order (seed by seed)
    shards: int = 1  # a point job whose point is decoded in this many shard jobs first

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(point.task for point in self.points))

    @property
    def rule_name(self) -> str:
        """A Snakemake rule name (an identifier) naming what the job evaluates."""
        return "evaluate_" + re.sub(r"\W", "_", self.key)

    @property
    def log_name(self) -> str:
        return "evaluate_" + self.key.replace("/", "_") + ".log"

    def outputs(self) -> list[str]:
        return [f"{point.folder}/metrics.json" for point in self.points]

    def shard_jobs(self) -> list[ShardJob]:
        if self.shards == 1:
            return []
        return [ShardJob(self.points[0], index, self.shards) for index in range(self.shards)]

    def inputs(self) -> dict[str, str]:
        """Every file one of its points needs (model markers, data manifests, the evaluator),
        and its shards' markers."""
        needed: dict[str, str] = {}
        for point in self.points:
            for path in point.inputs.values():
                needed.setdefault(path, path)
        for shard in self.shard_jobs():
            needed.setdefault(shard.marker, shard.marker)
        return {f"input{index}": path for index, path in enumerate(needed)}


@dataclass(frozen=True)
class ShardJob:
    """One slice of a point's examples, decoded by a job of its own."""

    point: object  # setdlm.workflow.plan.Point
    index: int
    count: int

    @property
    def name(self) -> str:
        return shard_name(self.index, self.count)

    @property
    def folder(self) -> str:
        return f"{self.point.folder}/{SHARDS}/{self.name}"

    @property
    def marker(self) -> str:
        return f"{self.folder}/shard.json"

    @property
    def args(self) -> tuple[str, ...]:
        """The point's ``setdlm eval`` arguments, into the shard's folder, for its slice."""
        args = list(self.point.args)
        args[args.index("--out") + 1] = self.folder
        return (*args, "--shard", f"{self.index}/{self.count}")


SHARDS = "shards"  # a sharded point's folder of shard folders


def shard_name(index: int, count: int) -> str:
    return f"{index}-of-{count}"


def shard_folders(point_folder: str, count: int) -> list[str]:
    return [f"{point_folder}/{SHARDS}/{shard_name(index, count)}" for index in range(count)]


def job_kind(config: dict, task: str) -> str:
    return config["tasks"][task].get("jobs", DEFAULT_KIND)


def job_key(kind: str, task: str, model: str, point: str, seed: int | None) -> str:
    seeded = "" if seed is None or kind.endswith("-all-seeds") else f"/seed-{seed}"
    if kind == "point":
        return f"{task}/{model}/{point}{seeded}"
    if kind.startswith("task"):
        return f"{task}/{model}{seeded}"
    return f"{model}{seeded}"


def evaluation_jobs(plan) -> dict[str, EvalJob]:
    """key -> job, for every evaluation the plan has (a seeded point once per seed)."""
    grouped: dict[str, list] = {}
    for (task, model, name), point in plan.points.items():
        per_seed = [plan.seed_point(task, model, name, seed) for seed in point.seeds] or [point]
        kind = job_kind(plan.config, task)
        for one in per_seed:
            grouped.setdefault(job_key(kind, task, model, name, one.seed), []).append(one)
    return {
        key: EvalJob(
            key,
            points[0].model,
            tuple(sorted(points, key=lambda point: point.seed or 0)),  # seed by seed (stable)
            point_shards(plan.config, points[0].task, points[0].model),
        )
        for key, points in grouped.items()
    }


def point_shards(config: dict, task: str, model: str) -> int:
    """How many shard jobs each of the model's points of the task is decoded in: the model's
    override, else the task's setting (only a job per point is split)."""
    if job_kind(config, task) != "point":
        return 1
    settings = config["tasks"][task]
    override = settings.get("overrides", {}).get(model, {})
    return override.get("shards", settings.get("shards", 1))


def shard_jobs(plan, run: str) -> dict[tuple[str, str], ShardJob]:
    """(point folder relative to ``run``, shard name) -> every shard job of the plan."""
    found = {}
    for job in evaluation_jobs(plan).values():
        for shard in job.shard_jobs():
            where = shard.point.folder.removeprefix(f"{run}/")
            found[(where, shard.name)] = shard
    return found


# What a point costs, roughly, relative to a decoded and scored point of another task at a
# confidence threshold (the default's seconds per point, issue 47, on its 2-core AMD EPYC):
# sampled problems are featurized for MAUVE and scored for gen-PPL (x4); a point without a
# threshold (τ >= 1) commits one token per forward, about 3x the forwards of a thresholded one;
# MDLM keeps no KV cache, so each of its forwards runs the whole sequence (x3).
TASK_WEIGHT = {"arithmetic-unconditional": 4, "unconditional": 4}
ONE_TOKEN_PER_FORWARD_WEIGHT = 3
FAMILY_WEIGHT = {"mdlm": 3}


def point_weight(plan, point) -> int:
    """The rough cost of one point (``point``: setdlm.workflow.plan.Point) for ordering jobs."""
    weight = TASK_WEIGHT.get(point.task, 1)
    if "--threshold" in point.args:
        tau = float(point.args[point.args.index("--threshold") + 1])
        weight *= ONE_TOKEN_PER_FORWARD_WEIGHT if tau >= 1 else 1
    family = plan.config["models"][point.model]["family"]
    return weight * FAMILY_WEIGHT.get(family, 1)


def job_priority(plan, job: EvalJob) -> int:
    """Snakemake's priority of an evaluation job (below every training's and model copy's):
    the rough cost of its points, so that on a few cores the longest jobs start first and the
    short ones fill in at the end (the default: MDLM's sampling job, about a third of the
    evaluation's CPU time, no longer starts last and holds up the tables)."""
    return sum(point_weight(plan, point) for point in job.points)


def job_resources(plan, job: EvalJob) -> dict[str, int]:
    """The largest of each resource its tasks ask for; runtime: the sum of theirs."""
    per_task = [plan.resources(task) for task in job.tasks]
    largest = {key: max(resources[key] for resources in per_task) for key in per_task[0]}
    return largest | {"runtime": sum(resources["runtime"] for resources in per_task)}


def aggregations(plan) -> dict[tuple[str, str], list]:
    """(task, model) -> the points of a model trained once per seed, each aggregated over its
    seeds (one job per task and model: ``setdlm aggregate`` over each point's seeds; per task,
    so that a table's target waits for its own tasks only)."""
    by_task: dict[tuple[str, str], list] = {}
    for (task, model, _), point in plan.points.items():
        if point.seeds:
            by_task.setdefault((task, model), []).append(point)
    return by_task
