"""Keep the test suite away from every SLURM cluster it was not given.

The SLURM tests submit real jobs. They run only against the cluster named in
``SETDLM_SLURM_TEST_CLUSTER`` (``.ci/run`` sets it after starting its own single-node cluster),
and only after checking that the cluster answering is that one. When no cluster is named, the
conftest puts these guards first on ``PATH`` for the whole session: every command that submits,
cancels or changes jobs (``sbatch``, ``srun``, ``salloc``, ``scancel``, ``scontrol`` other than
its read-only queries) is refused and recorded, and a session in which anything tried is failed;
read-only queries are answered "no cluster" without reaching one.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

CLUSTER_VARIABLE = "SETDLM_SLURM_TEST_CLUSTER"
REFUSED = ("sbatch", "srun", "salloc", "scancel", "sattach", "strigger", "sbcast")
# scontrol subcommands that only read; the rest (requeue, update, hold, ...) change jobs.
READ_ONLY_SCONTROL = ("show", "ping", "version", "-V", "--version", "--help", "help")


def _refuse(name: str, log: Path) -> str:
    """Shell lines that record the call and refuse it."""
    return f"""echo "{name} $*" >> {shlex.quote(str(log))}
echo "{name}: refused by the setdlm test suite: no SLURM cluster was given to it \\
(set {CLUSTER_VARIABLE} to the name of a cluster the tests may submit to)" >&2
exit 97
"""


def _scontrol(log: Path) -> str:
    """Read-only queries get "no cluster" (exit 1) without being recorded: they change no job,
    but they would still reach a cluster nobody gave the suite, and where a SLURM client is
    installed with no controller answering, each one hangs for seconds (Snakemake's SLURM
    plugin runs `scontrol show config` at every start). The rest are refused and recorded."""
    return f"""case "$1" in
  {" | ".join(READ_ONLY_SCONTROL)})
    echo "scontrol: no SLURM cluster was given to the setdlm test suite" >&2
    exit 1 ;;
esac
{_refuse("scontrol", log)}"""


def install_guard(folder: Path) -> tuple[Path, Path]:
    """Write the guard commands into ``folder``; returns (the bin folder to put first on PATH,
    the log of refused calls, one line each)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = folder / "refused.log"
    log.touch()
    scripts = {name: _refuse(name, log) for name in REFUSED}
    scripts["scontrol"] = _scontrol(log)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    return bin_dir, log


def given_cluster() -> str | None:
    return os.environ.get(CLUSTER_VARIABLE) or None


def answering_cluster() -> str | None:
    """The ClusterName of the SLURM controller that answers here, or None if none answers."""
    try:
        answer = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if answer.returncode != 0:
        return None
    for line in answer.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return None
