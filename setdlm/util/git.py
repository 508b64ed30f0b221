"""Read-only git queries about a checkout, for the code versions results record."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_output(folder: str | Path, *args: str, check: bool = True) -> str | None:
    """``git ARGS`` run in ``folder``: its stdout, or None when git is missing, times out or
    (with ``check``) fails, e.g. outside a checkout."""
    try:
        return subprocess.run(
            ["git", *args],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
            check=check,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def head_commit(folder: str | Path) -> str | None:
    output = git_output(folder, "rev-parse", "HEAD")
    return None if output is None else output.strip()
