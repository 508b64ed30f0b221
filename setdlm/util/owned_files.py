"""Files a command writes into a folder it may share with others: it replaces only its own.

``setdlm report tables RUN --out DIR`` (and ``report figures``, ``report curves``) writes fixed
names (``gsm8k_pareto.md``, ...) into a folder the user names, which may hold the user's own
files or another run's tables. Each such folder keeps a manifest, ``.setdlm-outputs.json``, of
what the command wrote there: per file, the run it was written for and its sha256. Before
writing anything, ``claim`` refuses the whole command when one of its files already exists and
is not in the manifest (someone else's), was written for another run (one folder per run), or
was changed since it was written (someone edited it). ``record`` adds the files written to the
manifest, under a lock, since the workflow's table jobs write into one folder at once.

A folder the project writes by default (``results/tables/<run>``) that predates the manifest
is adopted: its files are taken for the command's own (``adopt=True``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_json, sha256_file

MANIFEST = ".setdlm-outputs.json"
ABOUT = (
    "Files `setdlm report` wrote into this folder: per file, the run it was written for and "
    "its sha256. `setdlm report` replaces only these, and only unchanged."
)


class ForeignFileError(UserError):
    """A file the command would replace but did not write (or that changed since)."""


def claim(folder: Path, names, owner: str, flag: str = "--out", adopt: bool = False) -> None:
    """Refuse, before anything is written, when ``folder`` is a file or holds a file of
    ``names`` that this command may not replace for ``owner``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ForeignFileError(
            f"{flag} {folder}: is a file; expected a folder (a new one, or one this command "
            "wrote before)"
        )
    manifest = read_manifest(folder)
    known = manifest.get("files", {})
    adopting = adopt and not (folder / MANIFEST).exists()
    nothing = f"nothing was written; move it away, or choose another {flag}"
    for name in names:
        path = folder / name
        if not (path.exists() or path.is_symlink()):
            continue
        entry = known.get(name)
        if entry is None:
            if adopting:
                continue
            raise ForeignFileError(
                f"{path}: exists and was not written by this command (it is not in "
                f"{folder / MANIFEST}); {nothing}"
            )
        if entry.get("owner") != owner:
            raise ForeignFileError(
                f"{path}: written for {entry.get('owner')}, not for {owner} (one folder per "
                f"run); {nothing}"
            )
        if not path.is_file() or path.is_symlink() or sha256_file(path) != entry.get("sha256"):
            raise ForeignFileError(
                f"{path}: changed since this command wrote it (its sha256 is not the one in "
                f"{folder / MANIFEST}); {nothing}"
            )


def record(folder: Path, paths, owner: str) -> None:
    """Add ``paths`` (written into ``folder`` for ``owner``) to the folder's manifest."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        manifest = read_manifest(folder)
        files = dict(manifest.get("files", {}))
        for path in paths:
            path = Path(path)
            files[path.name] = {"owner": owner, "sha256": sha256_file(path)}
        atomic_write_json(folder / MANIFEST, {"about": ABOUT, "files": dict(sorted(files.items()))})


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ForeignFileError(
            f"{path}: not a readable manifest ({error}); expected the JSON this command "
            "writes (remove it to start the folder's record over)"
        ) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
        raise ForeignFileError(
            f"{path}: expected an object with a 'files' object of {{'owner', 'sha256'}} "
            "entries (remove it to start the folder's record over)"
        )
    return manifest


@contextlib.contextmanager
def _locked(folder: Path):
    """The folder itself locked (no lock file left among the outputs)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock
