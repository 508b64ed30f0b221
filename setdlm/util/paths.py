"""Where offline data lives, and where setdlm caches what it can make again.

Development and CI machines cannot reach the Hugging Face Hub, so datasets and tokenizers are
read from a local mirror named by ``SETDLM_DATA_DIR`` (laid out like ``../shared/data``).
Production code paths load the Hub originals and never need this setting.
"""

from __future__ import annotations

import os
from pathlib import Path

from setdlm.util.errors import UserError

DATA_DIR_ENV = "SETDLM_DATA_DIR"
CACHE_DIR_ENV = "SETDLM_CACHE_DIR"


class DataNotFoundError(UserError, FileNotFoundError):
    """A local data file the configuration asked for is missing."""


def data_dir() -> Path | None:
    """The local data mirror, or None when ``SETDLM_DATA_DIR`` is unset (use the Hub)."""
    value = os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser().resolve() if value else None


def cache_dir() -> Path:
    """Where setdlm keeps files it can always make again (the empty MLflow store of each MLflow
    version): ``SETDLM_CACHE_DIR``, else ``$XDG_CACHE_HOME/setdlm``, else ``~/.cache/setdlm``.
    Deleting it costs time, never a result."""
    value = os.environ.get(CACHE_DIR_ENV)
    if value:
        return Path(value).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "setdlm"


def data_path(*parts: str) -> Path:
    """A file or folder inside the data mirror; a clear error if the mirror or file is missing."""
    root = data_dir()
    if root is None:
        raise DataNotFoundError(
            f"{DATA_DIR_ENV} is not set: point it at the offline data folder "
            f"(for example ../shared/data) or use the Hub dataset instead"
        )
    path = root.joinpath(*parts)
    if not path.exists():
        raise DataNotFoundError(
            f"expected {'/'.join(parts)} inside {DATA_DIR_ENV}={root}, but {path} does not exist"
        )
    from setdlm.data.mirror import verify

    verify(path, root)  # against the sha256 the mirror lists (setdlm/data/mirror.py)
    return path
