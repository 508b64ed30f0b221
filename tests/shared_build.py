"""Work that the pytest-xdist workers of one session do once between them: a claim is an
exclusive create, so exactly one worker gets each; the others wait for its marker."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def claim(path: Path) -> bool:
    """True for the one caller that creates ``path``."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def wait_for(paths: list[Path], what: str, seconds: float, failed: Path | None = None) -> None:
    """Until every one of ``paths`` exists; fails the test after ``seconds``, or at once when
    ``failed`` appears (the builder's error, written there)."""
    deadline = time.monotonic() + seconds
    while not all(path.exists() for path in paths):
        if failed is not None and failed.exists():
            pytest.fail(f"{what}: the worker building it failed: {failed.read_text()}")
        if time.monotonic() > deadline:
            missing = [str(path) for path in paths if not path.exists()]
            pytest.fail(f"waited {seconds:.0f} s for {what}: {missing} missing")
        time.sleep(0.5)


def built_once(folder: Path, build: Callable[[Path], None], what: str, seconds: float) -> Path:
    """``build(folder)`` by the first worker to get here; every other worker waits for it."""
    done = folder.with_name(folder.name + ".done")
    failed = folder.with_name(folder.name + ".failed")
    if claim(folder.with_name(folder.name + ".claim")):
        try:
            build(folder)
        except BaseException as error:
            failed.write_text(f"{type(error).__name__}: {error}"[:4000])
            raise
        done.touch()
        return folder
    wait_for([done], what, seconds, failed)
    return folder


def xdist_worker() -> int | None:
    """This pytest-xdist worker's number (gw0 -> 0), or None outside a distributed session."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return None if worker is None else int(worker.removeprefix("gw"))
