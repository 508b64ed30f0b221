"""Checks on a workflow run through the local SLURM cluster (called by .ci/rehearsal-stage).

    python .ci/check_slurm_run.py --slurm-run results/runs/paper-rehearsal --jobs 61 \
        --baseline results/baselines/rehearsal.json \
        --tracking-uri sqlite:///results/rehearsal/mlflow.db

1. Every job of a rule that is not local ran as a SLURM job: each data part from the Hub
   (a data directory's file is copied by a local rule, and records no job), model marker,
   evaluation (its metrics) and sample records a job id; a job that evaluates several points
   gives them one id, a point split into shards has its samples from the shards' jobs; there
   are as many distinct ids as such jobs, and SLURM's own history (squeue, else sacct) knows
   every one of them.
2. The results hold the committed baseline (`setdlm check`: every quality and counted speed,
   exactly on the numerics it was written with, by its across-numerics rules elsewhere), or,
   with --local-run, equal a local-executor run of the same configuration (setdlm compare).
3. MLflow holds exactly one run per result, tagged with its SLURM jobs.
Prints what it checked; exits 1 on the first failed group.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from setdlm.report.compare import compare_runs, result_folders
from setdlm.tracking.record import IDENTITY_TAG


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def recorded_jobs(run: Path) -> dict[str, str]:
    """What each non-local job wrote -> the SLURM job id it recorded; the aggregates over seeds
    are made by a local rule and record none."""
    jobs = {}
    for part in sorted(run.glob("data/*/manifest.json")):
        prepared = json.loads(part.read_text())
        if all(entry["source"]["kind"] == "dir" for entry in prepared["files"]):
            if prepared.get("job"):  # copy_data, a local rule: it ran where Snakemake did
                fail(f"{part}: a data directory's copy ran as SLURM job {prepared['job']}")
            continue
        jobs[f"prepare_data {part.parent.name}"] = prepared.get("job") or {}
    markers = [
        *run.glob("models/*/checkpoint*.json"),
        *run.glob("models/*/seed-*/checkpoint.json"),
    ]
    for marker in sorted(markers):
        name = marker.relative_to(run / "models").as_posix()
        jobs[f"model {name}"] = json.loads(marker.read_text()).get("job") or {}
    for name, folder in result_folders(run).items():
        if not (folder / "samples.jsonl").exists() and any(folder.glob("seed-*/metrics.json")):
            continue  # an aggregate over seeds
        metrics = json.loads((folder / "metrics.json").read_text())
        jobs[f"evaluate {name}"] = metrics.get("scheduler") or {}
        samples = [json.loads(line) for line in (folder / "samples.jsonl").open()]
        unmarked = [sample["id"] for sample in samples if not sample.get("job_id")]
        if unmarked:
            fail(f"{folder}/samples.jsonl: samples {unmarked[:3]} record no SLURM job")
        for job_id in sorted({str(sample["job_id"]) for sample in samples}):
            jobs[f"samples {name} {job_id}"] = {"job_id": job_id}
        if not metrics.get("jobs"):
            fail(f"{folder}/metrics.json lists no SLURM jobs")
    missing = sorted(name for name, job in jobs.items() if not job.get("job_id"))
    if missing:
        fail(f"no SLURM job recorded by: {missing}")
    return {name: str(job["job_id"]) for name, job in jobs.items()}


def slurm_history() -> set[str]:
    """Job ids SLURM still knows: squeue keeps finished jobs for MinJobAge; sacct, where an
    accounting database exists, keeps them all. A job array's tasks are <array>_<task>."""
    known = set()
    for command in (
        ["squeue", "--states=all", "-h", "-o", "%i"],
        ["squeue", "--states=all", "-h", "-r", "-o", "%A"],  # array tasks by their own job id
        ["sacct", "-n", "-X", "-P", "-o", "JobID", "-S", "now-1days"],
    ):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            known |= {line.strip() for line in done.stdout.splitlines() if line.strip()}
    return known


def check_jobs(run: Path, expected_jobs: int) -> None:
    jobs = recorded_jobs(run)
    ids = sorted(set(jobs.values()))
    # as many distinct jobs as the DAG's non-local jobs: no job ran twice, none wrote another's
    if len(ids) != expected_jobs:
        fail(f"{len(ids)} SLURM jobs recorded by {len(jobs)} outputs, the DAG has {expected_jobs}")
    unknown = sorted(set(ids) - slurm_history())
    if unknown:
        fail(f"SLURM's history (squeue/sacct) does not know jobs {unknown}")
    print(f"ok: {len(ids)} non-local jobs ran as SLURM jobs {ids[0]}..{ids[-1]}")


def check_baseline(run: Path, baseline: Path) -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("setdlm")),
            "check",
            "--baseline",
            str(baseline),
            str(run),
        ],
        capture_output=True,
        text=True,
    )
    print(done.stdout[-2000:], end="")
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        fail(f"the run differs from the baseline {baseline}")
    print(f"ok: the results hold the baseline {baseline}")


def check_equal(slurm_run: Path, local_run: Path) -> None:
    compared, differences = compare_runs(local_run, slurm_run)
    for difference in differences[:20]:
        print(f"  {difference}", file=sys.stderr)
    if differences or not compared:
        fail(f"the SLURM run differs from the local run in {len(differences)} place(s)")
    print(f"ok: {compared} result points and the trained models equal the local-executor run")


def check_mlflow(run: Path, tracking_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = client.search_experiments()
    runs = [r for e in experiments for r in client.search_runs([e.experiment_id], max_results=5000)]
    runs = [r for r in runs if IDENTITY_TAG in r.data.tags]  # not the sweeps' parent runs
    by_identity: dict[str, list] = {}
    for mlflow_run in runs:
        by_identity.setdefault(mlflow_run.data.tags.get(IDENTITY_TAG), []).append(mlflow_run)
    results = result_folders(run)
    for name, folder in results.items():
        config_hash = json.loads((folder / "metrics.json").read_text())["config_hash"]
        matching = by_identity.get(config_hash, [])
        if len(matching) != 1:
            fail(f"{name}: {len(matching)} MLflow runs with {IDENTITY_TAG}={config_hash}")
        evaluated = (folder / "samples.jsonl").exists()  # not an aggregate over seeds
        if evaluated and not matching[0].data.tags.get("setdlm.slurm_jobs"):
            fail(f"{name}: its MLflow run has no setdlm.slurm_jobs tag")
    if len(runs) != len(results):
        fail(f"MLflow holds {len(runs)} runs for {len(results)} results")
    print(f"ok: MLflow ({tracking_uri}) holds exactly one run per result ({len(runs)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slurm-run", type=Path, required=True)
    parser.add_argument("--jobs", type=int, required=True, help="non-local jobs in the DAG")
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--baseline", type=Path, help="a `setdlm check` baseline to hold")
    parser.add_argument("--local-run", type=Path, help="a local-executor run to equal")
    args = parser.parse_args()
    check_jobs(args.slurm_run, args.jobs)
    if args.baseline is not None:
        check_baseline(args.slurm_run, args.baseline)
    if args.local_run is not None:
        check_equal(args.slurm_run, args.local_run)
    check_mlflow(args.slurm_run, args.tracking_uri)


if __name__ == "__main__":
    main()
