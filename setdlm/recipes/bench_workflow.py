"""``setdlm bench workflow``: where a workflow run's time went, stage by stage.

Every rule of the workflow has a Snakemake ``benchmark:`` file, ``<run>/benchmarks/<job>.tsv``:
the job's wall seconds and the CPU seconds of its processes, measured by Snakemake around the
job's command (process start, imports and model loading included). Every evaluated point's
``metrics.json`` also records when its evaluation started and finished. From those this prints,
per stage (data, train or reference copy, evaluate, aggregate, tables, figures, learning curves,
MLflow), the jobs, their wall and CPU seconds and the seconds per job; per task, the points and
the seconds per point; and what the evaluation jobs spent outside their points (starting
Python, loading models, featurizers and scorers).

A benchmark, not a test: the machines are shared and noisy, so compare two runs' figures on one
machine, and say which CPU gave them. ``--fresh`` first runs the default from nothing into a
scratch results folder (the committed reference models copied, not trained), so that the next
change that makes the default slower shows in one command:

    setdlm bench workflow --fresh          # make bench-workflow
    setdlm bench workflow results/runs/tiny
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from setdlm.util.errors import UserError

BENCHMARKS = "benchmarks"
# A job's stage, by the start of its benchmark file's name (the rules' own naming).
STAGES = (
    ("data", "data"),
    ("train", "train / reference copy"),
    ("fetch", "fetch"),
    ("evaluate", "evaluate"),
    ("aggregate", "aggregate seeds"),
    ("table", "tables"),
    ("figures", "figures"),
    ("learning_curves", "learning curves"),
    ("mlflow-sync", "MLflow sync"),
)


class BenchWorkflowError(UserError, ValueError):
    """A run folder without the files the summary reads."""


@dataclass(frozen=True)
class JobTime:
    name: str  # the benchmark file's stem
    stage: str
    wall_seconds: float
    cpu_seconds: float


def job_times(run: Path) -> list[JobTime]:
    folder = run / BENCHMARKS
    files = sorted(folder.rglob("*.tsv")) if folder.is_dir() else []  # shards: in subfolders
    if not files:
        raise BenchWorkflowError(
            f"{folder}: no benchmark files (expected <job>.tsv, written by the workflow's rules "
            "for each job they ran); run the workflow first, or pass --fresh"
        )
    return [_job_time(path, path.relative_to(folder).with_suffix("").as_posix()) for path in files]


def _job_time(path: Path, name: str) -> JobTime:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        wall = sum(float(row["s"]) for row in rows)
        cpu = sum(float(row["cpu_time"]) for row in rows if row.get("cpu_time") not in ("", "-"))
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise BenchWorkflowError(
            f"{path}: not a Snakemake benchmark file (expected a tab-separated header with "
            f"columns s and cpu_time, and a row per run): {error}"
        ) from None
    stage = next((label for prefix, label in STAGES if name.startswith(prefix)), "other")
    return JobTime(name, stage, wall, cpu)


@dataclass(frozen=True)
class PointTime:
    task: str
    key: str  # task/model/point[/seed-k]
    seconds: float


def point_times(run: Path) -> list[PointTime]:
    """Every evaluated point's own time (its ``metrics.json`` times: the evaluation's claim
    on its folder to its end), seeds one by one; aggregates over seeds have none."""
    found = []
    for metrics in sorted(run.glob("*/*/*/metrics.json")) + sorted(
        run.glob("*/*/*/seed-*/metrics.json")
    ):
        times = json.loads(metrics.read_text(encoding="utf-8")).get("times") or {}
        if not (times.get("started_at") and times.get("finished_at")):
            continue
        start = datetime.datetime.fromisoformat(times["started_at"])
        end = datetime.datetime.fromisoformat(times["finished_at"])
        key = metrics.parent.relative_to(run).as_posix()
        shard_jobs = sorted((run / BENCHMARKS / "evaluate_shard" / key).glob("*.tsv"))
        if shard_jobs:
            # A point merged from shards spans from its first shard's start to the merge, queue
            # waits included: its time is its shard jobs' (process start included) instead.
            seconds = sum(_job_time(path, key).wall_seconds for path in shard_jobs)
        else:
            seconds = (end - start).total_seconds()
        found.append(PointTime(key.split("/")[0], key, seconds))
    return found


def summary(run: Path) -> str:
    jobs = job_times(run)
    points = point_times(run)
    lines = [
        f"Workflow run {run}: {len(jobs)} jobs, {len(points)} evaluated points (seeds one by one)"
    ]
    lines += ["", "| stage | jobs | wall s | CPU s | wall s per job |", "|---|---:|---:|---:|---:|"]
    for _, label in [*STAGES, ("", "other")]:
        chosen = [job for job in jobs if job.stage == label]
        if chosen:
            wall = sum(job.wall_seconds for job in chosen)
            cpu = sum(job.cpu_seconds for job in chosen)
            lines.append(
                f"| {label} | {len(chosen)} | {wall:.1f} | {cpu:.1f} | {wall / len(chosen):.2f} |"
            )
    wall = sum(job.wall_seconds for job in jobs)
    cpu = sum(job.cpu_seconds for job in jobs)
    lines.append(f"| all | {len(jobs)} | {wall:.1f} | {cpu:.1f} | {wall / len(jobs):.2f} |")
    if points:
        lines += ["", "| task | points | s | s per point | slowest point (s) |"]
        lines.append("|---|---:|---:|---:|---|")
        for task in sorted({p.task for p in points}):
            chosen = [p for p in points if p.task == task]
            total = sum(p.seconds for p in chosen)
            slowest = max(chosen, key=lambda p: p.seconds)
            lines.append(
                f"| {task} | {len(chosen)} | {total:.1f} | {total / len(chosen):.2f} | "
                f"{slowest.key} ({slowest.seconds:.1f}) |"
            )
        evaluate = [job for job in jobs if job.stage == "evaluate"]
        inside = sum(p.seconds for p in points)
        outside = sum(job.wall_seconds for job in evaluate) - inside
        lines += [
            "",
            f"Evaluation jobs: {inside:.1f} s inside their points, {outside:.1f} s outside them "
            f"(process start, imports, loading models, featurizers and scorers: "
            f"{outside / max(len(evaluate), 1):.1f} s per job).",
        ]
    lines.append(f"CPU: {cpu_name()}; wall and CPU seconds are sums over jobs, which overlap.")
    return "\n".join(lines)


def cpu_name() -> str:
    """The CPU model, as the tables' hardware notes name it."""
    from setdlm.eval.fingerprint import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores ({platform.machine()})"


def fresh_run(work: Path, repository: Path, cores: int | None = None) -> tuple[Path, float]:
    """The default's ``all_tables`` from nothing, its results in ``work`` (the committed
    reference models copied, as ``make run`` does); returns the run folder and the wall
    seconds of the whole Snakemake run."""
    snakemake = Path(sys.executable).with_name("snakemake")
    results = work / "results"
    command = [
        str(snakemake),
        "--profile",
        str(repository / "workflows" / "profiles" / "local"),
        "-s",
        str(repository / "Snakefile"),
        "all_tables",
        "--configfile",
        str(repository / "workflows" / "config" / "tiny.yaml"),
        "--config",
        f"results={results}",
        f"reference_models={repository / 'results' / 'reference' / 'models'}",
    ]
    if cores is not None:
        command += ["--cores", str(cores)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=repository, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchWorkflowError(
            f"the default's workflow run in {work} exited {done.returncode}; its logs are in "
            f"{results}/runs/tiny/logs/"
        )
    return results / "runs" / "tiny", seconds


def main(args) -> int:
    if args.fresh:
        work = Path(args.work or tempfile.mkdtemp(prefix="setdlm-bench-workflow-"))
        if args.work and work.exists():
            shutil.rmtree(work / "results", ignore_errors=True)
        repository = Path(__file__).resolve().parents[2]
        run, seconds = fresh_run(work, repository, args.cores)
        print(summary(run))
        print(f"The whole run (Snakemake included): {seconds:.0f} s wall.")
        return 0
    print(summary(Path(args.run)))
    return 0
