"""Progress bars for long work: examples done, rate and time left, on a terminal only.

A bar is drawn on stderr when it is a terminal, and never with ``setdlm --quiet`` (which sets
``SETDLM_QUIET=1``, so the commands a workflow job starts stay quiet too) or in logs and pipes.
"""

from __future__ import annotations

import os

QUIET_ENV = "SETDLM_QUIET"


def quiet() -> bool:
    return os.environ.get(QUIET_ENV, "").lower() in ("1", "true", "yes", "on")


def progress_bar(total: int, what: str, done: int = 0, unit: str = "example", enabled: bool = True):
    """A tqdm bar over ``total`` items of which ``done`` are already finished (a resumed run
    starts there); disabled off a terminal (tqdm's ``disable=None``), when quiet, or when the
    caller says so (another process draws it)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=done,
        desc=what,
        unit=unit,
        disable=True if quiet() or not enabled else None,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def progress_range(count: int, what: str, unit: str = "example"):
    """``range(count)`` with a bar."""
    with progress_bar(count, what, unit=unit) as bar:
        for index in range(count):
            yield index
            bar.update()
