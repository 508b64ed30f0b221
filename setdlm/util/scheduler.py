"""The batch-scheduler job a process runs in, recorded beside every result it writes.

Under SLURM (a job submitted by Snakemake's slurm executor, or by hand with sbatch/srun) the
job's variables say which job, attempt and node computed a result, so a result file can be
traced to ``squeue``/``sacct`` history and a resumed evaluation shows which job wrote which
sample. Outside a scheduler there is no job: ``current_job()`` is None.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Our name -> the variable sbatch/srun set in the job's environment.
SLURM_VARIABLES = {
    "job_id": "SLURM_JOB_ID",
    "step_id": "SLURM_STEP_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    # > 0 once SLURM requeued the job; Snakemake's job step does not pass it on, so it is only
    # seen by commands submitted without Snakemake (sbatch/srun by hand)
    "restart_count": "SLURM_RESTART_COUNT",
    "cluster": "SLURM_CLUSTER_NAME",
    "partition": "SLURM_JOB_PARTITION",
    "node": "SLURMD_NODENAME",
    "gpus": "SLURM_JOB_GPUS",
}


def current_job(environ: Mapping[str, str] | None = None) -> dict | None:
    """``{"scheduler": "slurm", "job_id": ..., ...}`` (only the variables that are set), or
    None outside a SLURM job."""
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    job = {"scheduler": "slurm"}
    for name, variable in SLURM_VARIABLES.items():
        if environ.get(variable):
            job[name] = environ[variable]
    job["job_id"] = job_id
    return job


def current_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    job = current_job(environ)
    return None if job is None else job["job_id"]
