"""The data files read from ``SETDLM_DATA_DIR``, checked against the sha256 their folder lists.

The offline mirror ships ``SHA256SUMS`` (``sha256sum``'s format), and a folder the workflow
prepared (``<run>/data``) its ``manifest.json``. A file whose content no longer matches what its
folder lists (edited, truncated, replaced by another file of the same name) used to be read
anyway, and the results computed from other data than they say; or it failed later with a
UnicodeDecodeError that named no file. Every file ``setdlm.util.paths.data_path`` returns is
checked here once per process (and again when its size or modification time changes).
"""

from __future__ import annotations

import json
from pathlib import Path

from setdlm.util.errors import DataError

SUMS = "SHA256SUMS"
MANIFEST = "manifest.json"  # setdlm/workflow/datasets.py's prepared folder
_verified: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime) when it last matched


def listed_sha256(root: Path, relative: str) -> tuple[str, Path] | None:
    """(sha256, the file listing it) for ``relative`` inside ``root``: its SHA256SUMS line,
    else its manifest.json entry; None when the folder lists no hash for it."""
    sums = root / SUMS
    if sums.is_file():
        for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
            digest, _, listed = line.strip().partition("  ")
            if listed.lstrip("*").removeprefix("./") == relative:
                return digest.lower(), sums
    manifest = root / MANIFEST
    if manifest.is_file():
        try:
            entries = json.loads(manifest.read_text(encoding="utf-8")).get("files") or []
        except (ValueError, AttributeError):
            raise DataError(
                f"{manifest}: not the manifest `setdlm data prepare` writes (expected JSON with "
                "a 'files' list)"
            ) from None
        for entry in entries:
            if isinstance(entry, dict) and entry.get("path") == relative:
                return str(entry.get("sha256")), manifest
    return None


def verify(path: Path, root: Path) -> None:
    """Refuse ``path`` (a file inside ``root``) when its sha256 is not the one listed."""
    from setdlm.util.files import sha256_file

    path = Path(path)
    if not path.is_file():
        return
    stat = path.stat()
    if _verified.get(path) == (stat.st_size, stat.st_mtime_ns):
        return
    listed = listed_sha256(root, path.relative_to(root).as_posix())
    if listed is not None:
        expected, source = listed
        found = sha256_file(path)
        if found != expected:
            raise DataError(
                f"{path}: sha256 {found[:16]}..., but {source} lists {expected[:16]}...: the "
                "file was changed or damaged since; restore it (its folder's README says "
                "where it comes from), nothing was computed from it"
            )
    _verified[path] = (stat.st_size, stat.st_mtime_ns)


def read_text(path: Path) -> str:
    """A data file's text; a DataError naming it when it is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8(path, error) from None


def not_utf8(path: Path, error: UnicodeDecodeError) -> DataError:
    return DataError(
        f"{path}: not UTF-8 text (byte {error.start}: {error.reason}); expected the data "
        "file as its source publishes it"
    )
