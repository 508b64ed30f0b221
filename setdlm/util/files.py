"""Durable file writes: nothing already computed is lost when a process dies mid-write.

Every write goes to a temporary file beside its target, is flushed and fsynced, then renamed
over the target with ``os.replace`` (atomic on POSIX), and the folder entry is fsynced too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a rename or new entry in ``path`` durable (a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def naming_write_errors(path: Path):
    """An OSError without a file name (a write, flush or fsync that failed: a full disk, a
    quota) raised again naming ``path``, and alone: closing the file fails the same way, and
    the chain of both said no path twice."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise OSError(error.errno, os.strerror(error.errno), str(path)) from None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: temp file beside it, fsync, ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_beside(path)
    try:
        with naming_write_errors(path), open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_dir(path.parent)


def temporary_beside(path: Path) -> Path:
    """Where this process stages a new ``path``: hidden, beside it, named by its PID."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _is_staging(path: Path) -> bool:
    """Named as ``temporary_beside`` names a staging file: ``.<name>.tmp-<pid>``."""
    return path.name.startswith(".") and path.name.rpartition(".tmp-")[2].isdigit()


def leftover_temporaries(path: Path) -> list[Path]:
    """Staging files or folders of ``path`` that a killed writer left (a SIGKILL skips every
    ``finally``). Only for paths with one writer at a time: another live writer's staging
    file would be listed too."""
    return sorted(p for p in path.parent.glob(f".{path.name}.tmp-*") if _is_staging(p))


def remove_leftover_temporaries(folder: Path) -> list[Path]:
    """Remove the staging files and folders that writers killed mid-write left anywhere under
    ``folder``; return them. Only for folders with one writer at a time (a training's work
    folder): another live writer's staging file would be removed too."""
    stale = [path for path in folder.rglob(".*.tmp-*") if _is_staging(path)]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=1, sort_keys=True) + "\n")


def read_json(path: Path, error: type[Exception], unreadable: str = "") -> Any:
    """The value in a JSON file, or ``error`` naming the file and what is wrong with it;
    ``unreadable``: what to do when the file cannot be read (a command that writes it, what the
    folder should hold), added to that message."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as problem:
        advice = f"; {unreadable}" if unreadable else ""
        raise error(f"{path}: cannot read it ({problem.strerror or problem}){advice}") from None
    except ValueError as problem:  # not JSON, or not UTF-8 text
        raise error(f"{path}: not valid JSON ({problem})") from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def move_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to ``<name>.<why>-<time>`` beside it (kept, never deleted); returns it."""
    import time

    aside = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%dT%H%M%S')}")
    os.replace(path, aside)
    return aside
