"""What a result was computed with: hardware, software versions and code version."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from pathlib import Path

import torch

from setdlm.util.git import git_output, head_commit
from setdlm.util.scheduler import current_job, current_job_id

PACKAGES = (
    "setdlm",
    "torch",
    "transformers",
    "tokenizers",
    "lm_eval",
    "datasets",
    "mauve-text",
    "rouge_score",
    "safetensors",
    "numpy",
)


def software_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def hardware(device: torch.device | None = None) -> dict:
    info = {
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_devices": torch.cuda.device_count(),
    }
    if device is not None and device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
    else:
        info["device"] = "cpu"
    return info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@functools.cache
def code_version() -> str:
    """The git commit of this checkout (with "-dirty" for uncommitted changes), else the
    package version."""
    root = Path(__file__).resolve().parents[2]
    commit = head_commit(root)
    changes = git_output(root, "status", "--porcelain", "--untracked-files=no", check=False)
    if commit is None or changes is None:
        return importlib.metadata.version("setdlm")
    return commit + ("-dirty" if changes.strip() else "")


def sample_provenance() -> dict:
    """Stamped on every sample line: the code that computed it and the scheduler job that ran
    it (None outside SLURM), so a resumed run shows which job wrote which sample."""
    return {"code_version": code_version(), "job_id": current_job_id()}


def run_provenance(records: list[dict]) -> dict:
    """For metrics.json: the code versions and scheduler jobs behind ``records``, and the job
    writing the metrics."""
    return {
        "code_versions": sorted({r["code_version"] for r in records}),
        "jobs": sorted({r["job_id"] for r in records if r.get("job_id")}, key=_job_order),
        "scheduler": current_job(),
    }


def _job_order(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)
