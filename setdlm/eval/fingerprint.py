"""What a result was computed with: hardware, software versions and code version."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

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
        "cpu": _cpu_model(),
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


def _cpu_model() -> str:
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
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return commit + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return importlib.metadata.version("setdlm")
