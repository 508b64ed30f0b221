"""The empty MLflow store, migrated once per MLflow version and then copied.

MLflow creates a SQLite store by running its whole schema migration: dozens of alembic steps,
0.9-1.7 s on an AMD EPYC core, each time a sync, a test or a repair starts a new store. Two
stores it migrates differ only in their default experiment's times (and in the order of a few
index statements in the schema's text). So the first creation keeps its freshly migrated file
in the cache (``setdlm.util.paths.cache_dir()``), and every later one copies it in
milliseconds, then dates the default experiment now and locates it where MLflow would have:
under ./mlruns/0 of the working directory (setdlm/tracking/store.py opens and checks the copy).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

from setdlm.util.paths import cache_dir


def cached_empty_store() -> Path | None:
    """Where this MLflow version's empty store is kept (it may not exist yet); None where no
    cache folder can be named (no home folder and no SETDLM_CACHE_DIR)."""
    import mlflow

    try:
        folder = cache_dir()
    except (RuntimeError, KeyError):  # Path.home() without a home
        return None
    return folder / f"mlflow-{mlflow.__version__}-empty.db"


def keep_empty_store(migrated: Path) -> None:
    """A copy of a freshly migrated, still empty store as the cached one: written aside and
    renamed, so no reader sees half a file. A cache that cannot be written is left as it is."""
    cached = cached_empty_store()
    if cached is None:
        return
    with contextlib.suppress(OSError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = cached.with_name(f".{cached.name}.{os.getpid()}")
        shutil.copyfile(migrated, staging)
        os.replace(staging, cached)


def date_the_default_experiment(store: Path) -> None:
    """Experiment 0 of a copied store as MLflow's migration writes it from here: created now,
    its artifacts under ./mlruns/0 of the working directory."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.utils.time import get_current_time_millis
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    location = append_to_uri_path(resolve_uri_if_local(DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH), "0")
    now = get_current_time_millis()
    with contextlib.closing(sqlite3.connect(store)) as database, database:
        changed = database.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, "
            "last_update_time = ? WHERE experiment_id = 0",
            (location, now, now),
        ).rowcount
    if changed != 1:
        raise sqlite3.DatabaseError(f"{store} has no default experiment")
