"""Where runs are tracked and how a store is reached safely.

The tracking URI is ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else the SQLite file
``<results root>/mlflow.db`` (see ``results.results_root``). SQLite takes one writer: a fresh
database written by many processes at once fails in its schema migration, so every writer here
holds a file lock next to the store (``mlflow.db.lock``) from before the store is opened until
the sync ends. A server is asked for ``/health`` first, with a short timeout, and MLflow's own
retries are cut from minutes to seconds, so a server that is down fails the sync at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from setdlm.results.layout import ARTIFACTS_FOLDER
from setdlm.tracking.empty_store import (
    cached_empty_store,
    date_the_default_experiment,
    keep_empty_store,
)
from setdlm.util.errors import UserError
from setdlm.util.files import fsync_dir, move_aside

DEFAULT_STORE = "mlflow.db"
SERVER_LOCK = ".mlflow-sync.lock"  # in the results root, for a sync to a server
HEALTH_TIMEOUT_SECONDS = 5.0
# Where SQLite must not live (NOTES: never SQLite on NFS).
SHARED_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "fuse.sshfs"}
# MLflow's HTTP defaults (7 retries with backoff 2, 120 s timeout) block about 4 minutes on a
# server that is down; these bound a failing call to seconds. The user's own settings win.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class StoreUnavailable(UserError, RuntimeError):
    """The tracking store cannot be reached or written."""


# A new experiment's artifact location beside a local database: mlflow-artifacts:/<experiment>,
# which MLflow resolves against the serving UI's --artifacts-destination (setdlm ui: the
# database's folder's mlartifacts/). No path of this machine is stored, so a copied or archived
# results folder opens elsewhere with its artifacts.
PROXIED_ARTIFACTS = "mlflow-artifacts:"


@dataclass(frozen=True)
class Store:
    uri: str
    lock_path: Path
    # Where new experiments keep their artifacts (the location is <artifact_root>/<name>):
    # PROXIED_ARTIFACTS beside a local database; None for a server, which decides (its
    # --artifacts-destination).
    artifact_root: str | None
    # The default SQLite store of a results root: this project's own mirror of the result
    # files, which it may rebuild from them when it finds it broken.
    owned: bool = False
    # The folder that mlflow-artifacts:/ stands for beside a local database (mlartifacts/ next
    # to it): the sync writes the artifacts there, `setdlm ui` serves them from there.
    artifacts_destination: Path | None = None

    @property
    def is_remote(self) -> bool:
        return self.uri.startswith(("http://", "https://"))


# The tracking URIs MLflow can open (a database dialect may name its driver: postgresql+psycopg2).
KNOWN_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "file", "databricks")


def resolve_store(results_root: Path, tracking_uri: str | None = None) -> Store:
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or sqlite_uri(results_root)
    scheme = uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else ""
    if scheme not in KNOWN_SCHEMES:
        origin = "--tracking-uri" if tracking_uri else "MLFLOW_TRACKING_URI"
        raise StoreUnavailable(
            f"{origin} {uri!r}: not a tracking URI MLflow can open; expected sqlite:///PATH, "
            "http(s)://HOST:PORT or a database URI (postgresql://..., mysql://...)"
        )
    database = sqlite_path(uri)
    if database is not None:
        lock = database.with_name(database.name + ".lock")
        # however the URI spells it (the workflow passes a relative one): the same file
        owned = database == (results_root / DEFAULT_STORE).resolve()
        destination = database.parent / ARTIFACTS_FOLDER
        return Store(uri, lock, PROXIED_ARTIFACTS, owned, destination)
    # A server (or another backend: postgresql://..., databricks): it keeps the artifacts, and
    # the lock in the results root keeps this machine to one writer.
    return Store(uri.rstrip("/"), results_root / SERVER_LOCK, None)


def sqlite_uri(results_root: Path) -> str:
    return f"sqlite:///{(results_root / DEFAULT_STORE).resolve()}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()


@contextlib.contextmanager
def writer_lock(store: Store):
    """Hold the store's lock (one local writer); the OS releases it if the process dies."""
    store.lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(store.lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another writer of {store.uri} (lock {store.lock_path})", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_client(store: Store):
    """An ``MlflowClient`` on the store, which must be reachable: a server is checked first;
    a SQLite database is created (schema migrated) here, under the caller's lock."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if store.is_remote:
        check_server(store.uri)
    database = sqlite_path(store.uri)
    if database is not None:
        if store.owned and not_a_database(database):
            # this project's own store, overwritten with something else: rebuilt, kept aside
            _rebuild(database, "it is not an SQLite database")
        refuse_non_database(database)
        database.parent.mkdir(parents=True, exist_ok=True)
        kind = filesystem_type(database.parent)
        if kind in SHARED_FILESYSTEMS:
            print(
                f"warning: {database} is on a {kind} filesystem, where SQLite's file locks are "
                "unreliable and the store can be corrupted; put it on a local disk, or set "
                "MLFLOW_TRACKING_URI to a tracking server",
                file=sys.stderr,
            )
    from mlflow.tracking import MlflowClient

    _quiet_mlflow_logs()  # after the import: importing mlflow sets up its loggers

    if database is not None:
        _forget_open_store(store.uri)  # open the file as it is now, and check its schema again
        if not (database.is_file() and database.stat().st_size):
            _create_database(database)
    try:
        # Opens the store (checking its schema) and proves it answers.
        client = MlflowClient(tracking_uri=store.uri)
        client.search_experiments(max_results=1)
    except Exception as error:
        damage = None if database is None else damaged(database, error)
        if not (damage and store.owned):
            advice = ""
            if damage:
                advice = (
                    f" ({damage}; move {database} aside and sync again: the store is rebuilt "
                    "from the result files)"
                )
            raise StoreUnavailable(
                f"cannot use the tracking store {store.uri}: {error}{advice}"
            ) from error
        _rebuild(database, f"{damage} ({error})")
        _forget_open_store(store.uri)
        client = MlflowClient(tracking_uri=store.uri)
        client.search_experiments(max_results=1)
    return client


def _rebuild(database: Path, reason: str) -> None:
    """Move a broken owned store aside (kept, never deleted) and create a new one, which the
    sync then fills from the result files. Call under the lock, then forget the open store."""
    _forget_open_store(f"sqlite:///{database}")  # also open here under its absolute name
    aside = move_aside(database, "broken")
    print(
        f"{database}: {reason}; moved it to {aside.name} and rebuilding the store from the "
        "result files",
        file=sys.stderr,
    )
    _create_database(database)


def _forget_open_store(uri: str) -> None:
    """Drop the store and engine MLflow keeps for ``uri`` in this process (it caches both by
    URI): after the file was replaced or repaired, the next client must open the new file."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service import utils

    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()
    utils._tracking_store_registry._get_store_with_resolved_uri.cache_clear()


def _create_database(database: Path) -> None:
    """Create a new SQLite store in a temporary file, then rename it into place: a process
    killed during MLflow's schema migration (seconds, dozens of steps) leaves no store
    half-migrated, only a temporary file that the next creation removes. The migration runs
    once per MLflow version; later stores are copies of its result (setdlm/tracking/
    empty_store.py). Call under the lock."""
    for stale in database.parent.glob(f".{database.name}.creating-*"):
        stale.unlink(missing_ok=True)  # left by a killed creation (we hold the lock)
    staging = database.with_name(f".{database.name}.creating-{os.getpid()}")
    if not _copied_empty_store(staging):
        _open_and_forget(staging)  # MLflow migrates the new file
        keep_empty_store(staging)
    os.replace(staging, database)
    fsync_dir(database.parent)


def _copied_empty_store(staging: Path) -> bool:
    """The cached empty store copied to ``staging`` and checked as MLflow opens it; False when
    there is none, or when the copy does not open (the cached file is then dropped)."""
    cached = cached_empty_store()
    if cached is None or not cached.is_file():
        return False
    try:
        shutil.copyfile(cached, staging)
        date_the_default_experiment(staging)
        _open_and_forget(staging)
    # whatever a damaged cached file raises (sqlite3, SQLAlchemy or MLflow errors): it is only
    # a copy of what a migration makes again
    except Exception:  # noqa: BLE001
        staging.unlink(missing_ok=True)
        cached.unlink(missing_ok=True)
        return False
    return True


def _open_and_forget(database: Path) -> None:
    """Open ``database`` with MLflow (which migrates a new file and checks any file's schema),
    then drop the connection: the file is renamed next."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{database}"
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    finally:
        _forget_open_store(uri)


def damaged(database: Path, error: BaseException) -> str | None:
    """What is wrong with a store that failed to open, when the file itself is the problem:
    a schema migration cut short, or pages SQLite cannot read; None otherwise (a lock, a
    permission, a full disk, ...)."""
    if half_migrated(database, error):
        return "its schema migration was interrupted"
    text = str(error).lower()
    if any(sign in text for sign in ("malformed", "not a database", "file is encrypted")):
        return "it is corrupted"
    return None


def half_migrated(database: Path, error: BaseException) -> bool:
    """Whether opening ``database`` failed because a schema migration was cut short: alembic's
    temporary tables are left, its version table is missing or behind, or the migration
    tripped over what an earlier, interrupted run of it had already done."""
    import sqlite3

    text = str(error).lower()
    signs = ("duplicate column", "already exists", "_alembic_tmp_", "out-of-date database schema")
    if any(sign in text for sign in signs):
        return True
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error:
        return False
    return _unfinished_schema(tables)


def _unfinished_schema(tables: set[str]) -> bool:
    """Alembic's version stamp missing from a schema that has tables, or its temporary tables
    left: a migration did not finish."""
    return bool(tables) and (
        "alembic_version" not in tables or any(t.startswith("_alembic_tmp_") for t in tables)
    )


def file_problem(database: Path) -> str | None:
    """What is wrong with an SQLite store file, read with SQLite alone (no MLflow import, so a
    workflow's start stays quick): "gone", "not an SQLite database", "corrupted (...)" or
    "half-migrated"; None for a sound file."""
    import sqlite3

    if not (database.is_file() and database.stat().st_size):
        return "gone"
    if not_a_database(database):
        return "not an SQLite database"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as error:
        return f"corrupted ({error})"
    if check != "ok":
        return f"corrupted ({check})"
    return "half-migrated" if _unfinished_schema(tables) else None


SQLITE_HEADER = b"SQLite format 3\x00"


def not_a_database(database: Path) -> bool:
    """Whether ``database`` is a non-empty file that does not start as an SQLite database."""
    if not (database.is_file() and database.stat().st_size):
        return False
    with open(database, "rb") as handle:
        return handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER


def refuse_non_database(database: Path) -> None:
    """SQLite takes a file shorter than its header for an empty database and writes its schema
    over it: a URI that names someone's file would destroy it."""
    if database.is_dir():
        raise StoreUnavailable(f"{database} is a folder, not an SQLite database file")
    if not_a_database(database):
        raise StoreUnavailable(
            f"{database} exists and is not an SQLite database: refusing to write an MLflow "
            "store over it (name a new file, or an existing mlflow.db)"
        )


def check_server(uri: str, timeout_seconds: float = HEALTH_TIMEOUT_SECONDS) -> None:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=timeout_seconds) as response:
            if response.status != 200:
                raise StoreUnavailable(f"{uri}/health answered HTTP {response.status}")
    except urllib.error.HTTPError as error:
        raise StoreUnavailable(f"{uri}/health answered HTTP {error.code}") from error
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise StoreUnavailable(f"the MLflow server {uri} cannot be reached ({reason})") from error


def filesystem_type(path: Path, mounts_file: Path = Path("/proc/mounts")) -> str | None:
    """The type of the filesystem holding ``path`` (Linux), or None where it cannot be told."""
    try:
        lines = mounts_file.read_text().splitlines()
    except OSError:
        return None
    path_text, best, kind = str(path.resolve()), "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = path_text == mount or path_text.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def _quiet_mlflow_logs() -> None:
    # MLflow logs every schema migration step at INFO on stderr.
    import logging

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
