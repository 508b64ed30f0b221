"""The suite never submits to a SLURM cluster it was not given.

A stand-in "foreign" cluster (commands on PATH that answer like a healthy controller named
``production`` and record every call) answers while the SLURM tests run: with no cluster named
they skip without a single call, and with another cluster named they refuse before submitting.
Outside the SLURM tests the session guard refuses every submitting command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_guard import CLUSTER_VARIABLE, install_guard

REPO = Path(__file__).resolve().parents[1]
# What a foreign controller answers; every call is appended to $CALLS.
FOREIGN = {
    "sinfo": 'echo "debug* up infinite 1 idle node1"',
    "scontrol": 'if [ "$1" = show ]; then echo "ClusterName             = production"; fi',
    "squeue": "true",
    "sacct": "true",
    "sbatch": 'echo "Submitted batch job 4242"',
    "srun": "true",
    "salloc": "true",
    "scancel": "true",
}


def _foreign_cluster(folder: Path) -> tuple[Path, Path]:
    bin_dir = folder / "foreign-bin"
    bin_dir.mkdir(parents=True)
    calls = folder / "foreign-calls.log"
    calls.touch()
    for name, answer in FOREIGN.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n{answer}\n')
        path.chmod(0o755)
    return bin_dir, calls


def _slurm_tests(tmp_path: Path, bin_dir: Path, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != CLUSTER_VARIABLE}
    # Only the foreign cluster on PATH: none of this session's guards.
    path = [p for p in env["PATH"].split(os.pathsep) if "setdlm-slurm-guard-" not in p]
    env.update(PATH=os.pathsep.join([str(bin_dir), *path]), **variables)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_slurm.py"]
        + ["--basetemp", str(tmp_path / "inner")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _submissions(calls: Path) -> list[str]:
    submitting = ("sbatch", "srun", "salloc", "scancel")
    return [line for line in calls.read_text().splitlines() if line.split()[0] in submitting]


@pytest.mark.slow  # runs a pytest session in a subprocess
def test_with_no_cluster_named_the_slurm_tests_skip_without_calling_slurm(tmp_path):
    bin_dir, calls = _foreign_cluster(tmp_path)
    result = _slurm_tests(tmp_path, bin_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and CLUSTER_VARIABLE in result.stdout
    assert calls.read_text() == ""  # not even a query


@pytest.mark.slow  # runs a pytest session in a subprocess
def test_with_another_cluster_named_the_slurm_tests_refuse_before_submitting(tmp_path):
    bin_dir, calls = _foreign_cluster(tmp_path)
    result = _slurm_tests(tmp_path, bin_dir, **{CLUSTER_VARIABLE: "localci"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the SLURM controller answering here is production" in result.stdout
    assert _submissions(calls) == []
    assert calls.read_text().split()[:2] == ["scontrol", "show"]  # the one query it made


def test_the_session_guard_refuses_every_submitting_command(tmp_path):
    bin_dir, calls = _foreign_cluster(tmp_path)
    guard, refused = install_guard(tmp_path / "guard")
    env = {**os.environ, "PATH": os.pathsep.join([str(guard), str(bin_dir), os.environ["PATH"]])}
    commands = [
        ["sbatch", "--gpus=1", "--wrap", "true"],
        ["srun", "true"],
        ["salloc"],
        ["scancel", "--signal=USR1", "4242"],
        ["scontrol", "requeue", "4242"],
    ]
    for command in commands:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 97, command
        assert f"{command[0]}: refused by the setdlm test suite" in result.stderr
        assert CLUSTER_VARIABLE in result.stderr
    assert calls.read_text() == ""  # nothing reached the cluster
    assert [line.split()[0] for line in refused.read_text().splitlines()] == [
        c[0] for c in commands
    ]
    # Read-only queries reach no cluster either: answered "no cluster", fast, not recorded.
    query = subprocess.run(
        ["scontrol", "show", "config"], env=env, capture_output=True, text=True, timeout=30
    )
    assert query.returncode == 1 and "no SLURM cluster was given" in query.stderr
    assert calls.read_text() == "" and len(refused.read_text().splitlines()) == len(commands)
