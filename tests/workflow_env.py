"""The environment the workflow tests run `snakemake` and `setdlm` subprocesses in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def environ(data_dir: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(
        SETDLM_DATA_DIR=str(data_dir),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        # commits landing while the suite runs must not look like new code
        SETDLM_CODE_VERSION="test-suite",
        **extra,
    )
    env.pop("MLFLOW_TRACKING_URI", None)  # each test's store is its own
    return env


def copy_of_run(workdir: Path, into: Path) -> Path:
    """A private copy of a workflow's working directory (``into/run``): ``.snakemake``
    metadata and modification times included, so Snakemake sees the same finished run."""
    copy = into / "run"
    shutil.copytree(workdir, copy, symlinks=True)
    return copy
