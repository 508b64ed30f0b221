"""Whether the run that locked a working directory is still alive.

Snakemake locks its working directory and, on a second run, says the same thing whether the
holder is running or was killed: "run --unlock". Unlocking under a live run lets two runs write
the same result folders. Before Snakemake checks its lock, the Snakefile asks this module and
says which case it is: a ``snakemake`` process of this machine working in the same directory
(alive: wait for it), or none (killed: unlocking is safe here).
"""

from __future__ import annotations

import os
from pathlib import Path


def lock_files(workdir: Path) -> list[Path]:
    locks = Path(workdir) / ".snakemake" / "locks"
    return sorted(locks.glob("*.lock")) if locks.is_dir() else []


def snakemake_processes(workdir: Path, exclude: set[int] = frozenset()) -> list[int]:
    """Pids of this machine's ``snakemake`` processes whose working directory is ``workdir``."""
    # The directory is compared by device and inode, not by the path /proc/<pid>/cwd reads
    # back, so that a folder reached through a symlink or a bind mount is still the same folder.
    here = os.stat(workdir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            names = [Path(arg.decode(errors="replace")).name for arg in argv[:2]]
            if "snakemake" not in names:
                continue
            cwd = os.stat(entry / "cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if (cwd.st_dev, cwd.st_ino) == (here.st_dev, here.st_ino):
            found.append(int(entry.name))
    return sorted(found)


def lock_holders(workdir: Path) -> list[int] | None:
    """None when ``workdir`` is not locked; else the pids of the live ``snakemake`` processes
    working there, other than this one and its parents (none: the holder was killed)."""
    if not lock_files(workdir):
        return None
    ancestors, pid = set(), os.getpid()
    while pid is not None and pid > 1:  # this snakemake process and whatever started it
        ancestors.add(pid)
        pid = parent_pid(pid)
    return snakemake_processes(workdir, exclude=ancestors)


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (from /proc/<pid>/stat); None when it is gone."""
    try:
        # the fields after the command name, which is in parentheses: state, ppid, ...
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def lock_report(workdir: Path, nolock: bool = False) -> str | None:
    """What to tell the user about a locked ``workdir``; None when it is not locked."""
    return lock_message(workdir, lock_holders(workdir), nolock)


def lock_message(workdir: Path, holders: list[int] | None, nolock: bool = False) -> str | None:
    """The message for ``workdir`` with these ``lock_holders``; ``nolock``: this run was
    started with ``--nolock``, so Snakemake will not refuse it."""
    if holders is None:
        return None
    if nolock:
        # The user chose to run beside the lock: say so only where another run is alive, since
        # that run owns the results it is writing (this one repairs none of them).
        if not holders:
            return None
        return (
            f"{workdir}: another snakemake runs here (pid {', '.join(map(str, holders))}); with "
            "--nolock this run goes on beside it, and repairs no result (the other run owns "
            "them). Its targets must not overlap the other run's."
        )
    if holders:
        return (
            f"{workdir} is locked by a running snakemake (pid {', '.join(map(str, holders))}): "
            "wait for it to finish. Do not --unlock: two runs would write the same results."
        )
    return (
        f"{workdir} is locked, but no snakemake process runs there on this machine: the run "
        "that locked it was killed. `snakemake --unlock` is safe (on a cluster, first check "
        "that no run of this folder is alive on another node), then run the same command again: "
        "it resumes where the killed run stopped."
    )
