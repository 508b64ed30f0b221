"""``setdlm sync`` and ``setdlm ui``: the command lines of the tracking package."""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from setdlm.results.reader import RESULTS_DIR_ENV, ResultError, find_results, results_root
from setdlm.tracking.record import run_record
from setdlm.tracking.store import (
    StoreUnavailable,
    open_client,
    resolve_store,
    sqlite_path,
    writer_lock,
)
from setdlm.util.errors import ArgumentParser
from setdlm.util.files import atomic_write_json
from setdlm.util.validation import option, output_path

SYNC_HELP = """Mirror the finished results under RESULTS_DIR into MLflow: one experiment per task,
one run per point (identified by its config hash), params, metrics, tags and artifacts.
Idempotent: a replay creates nothing and duplicates no metric history. Tracking URI:
--tracking-uri, else $MLFLOW_TRACKING_URI, else sqlite:///<results>/mlflow.db, where <results>
is the folder above the `runs` folder RESULTS_DIR is in (or holds), else $SETDLM_RESULTS_DIR,
else RESULTS_DIR itself."""


def sync_main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="setdlm sync", description=SYNC_HELP)
    parser.add_argument("results_dir", type=Path, metavar="RESULTS_DIR")
    parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI")
    parser.add_argument(
        "--marker",
        type=output_path,
        default=None,
        help="file listing the synced runs, written last",
    )
    args = parser.parse_args(argv)
    results_dir = args.results_dir.resolve()
    try:
        scan = find_results(results_dir)
    except ResultError as error:
        print(f"setdlm sync: {error}", file=sys.stderr)
        return 2
    store = resolve_store(results_root(results_dir), args.tracking_uri)
    for reason in scan.ignored:
        print(f"skipped {reason}", file=sys.stderr)
    if scan.unfinished:
        print(
            f"{len(scan.unfinished)} unfinished result folder(s) (no metrics.json yet) left for "
            f"a later sync, e.g. {scan.unfinished[0]}"
        )
    if not scan.finished:
        print(f"no finished results under {results_dir}: nothing to sync")
        _write_marker(args.marker, store.uri, results_dir, [], scan.unfinished)
        return 0
    print(f"syncing {len(scan.finished)} finished result(s) under {results_dir} to {store.uri}")
    records = [(point.folder, run_record(point)) for point in scan.finished]
    synced, current = [], results_dir
    try:
        with writer_lock(store):
            client = open_client(store)
            from setdlm.tracking.sync import sync_run

            for current, record in records:
                run = sync_run(client, record, str(current), store.artifact_root)
                print(f"  {run.action:9s} {run.experiment}: {run.run_name}  (run {run.run_id})")
                synced.append(run)
    except Exception as error:  # any failure to reach or write MLflow; the files are untouched
        print(_failure_message(error, args, results_dir, current, store.uri), file=sys.stderr)
        return 1
    counts = {a: sum(r.action == a for r in synced) for a in ("created", "updated", "unchanged")}
    print(f"synced {len(synced)} run(s): " + ", ".join(f"{n} {a}" for a, n in counts.items()))
    _write_marker(args.marker, store.uri, results_dir, synced, scan.unfinished)
    return 0


def _write_marker(marker: Path | None, uri: str, results_dir: Path, synced, unfinished) -> None:
    """For Snakemake: written (atomically) only after a successful sync."""
    if marker is None:
        return
    atomic_write_json(
        marker.resolve(),
        {
            "tracking_uri": uri,
            "results_dir": str(results_dir),
            "synced_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "runs": [asdict(run) for run in synced],
            "unfinished": [str(folder) for folder in unfinished],
        },
    )


def _failure_message(error, args, results_dir: Path, current: Path, uri: str) -> str:
    replay = ["setdlm", "sync", str(results_dir), "--tracking-uri", uri]
    if args.marker is not None:
        replay += ["--marker", str(args.marker.resolve())]
    what = str(error) if isinstance(error, StoreUnavailable) else f"{type(error).__name__}: {error}"
    where = f" (while syncing {current})" if current != results_dir else ""
    return (
        f"setdlm sync: MLflow sync failed{where}: {what}\n"
        f"The results are safe on disk in {results_dir}: nothing there was changed, and MLflow "
        "only mirrors those files.\n"
        f"Replay the sync once the tracking store is reachable (it completes, never duplicates):\n"
        f"  {shlex.join(replay)}"
    )


def ui_main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="setdlm ui", description="Open the MLflow UI on the local tracking store."
    )
    parser.add_argument("--port", type=option("$defs/port"), default=5000)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--tracking-uri", default=None, help="default: the results' SQLite store")
    parser.add_argument(
        "--results",
        type=Path,
        default=Path(os.environ.get(RESULTS_DIR_ENV, "results")),
        help=f"results folder holding mlflow.db (default: ${RESULTS_DIR_ENV} or ./results)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the `mlflow ui` command, start nothing"
    )
    args = parser.parse_args(argv)
    store = resolve_store(results_root(args.results), args.tracking_uri)
    if store.is_remote:
        print(f"MLflow UI: {store.uri} (the tracking server serves it; nothing to start)")
        return 0
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store.uri]
    if store.artifact_root is not None:
        command += ["--default-artifact-root", store.artifact_root]
    command += ["--host", args.host, "--port", str(args.port), "--workers", "1"]
    print(f"MLflow UI on {store.uri}: http://{args.host}:{args.port}")
    print("  " + shlex.join(["mlflow", *command[3:]]))
    if args.dry_run:
        return 0
    if sqlite_path(store.uri) is not None:
        # Create the schema under the writers' lock: `mlflow ui` migrating a fresh database
        # while a sync does the same fails.
        try:
            with writer_lock(store):
                open_client(store)
        except StoreUnavailable as error:
            print(f"setdlm ui: {error}", file=sys.stderr)
            return 1
    # Background job execution is not used here and costs memory.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    return serve_until_stopped(command, env)


def serve_until_stopped(command: list[str], env: dict) -> int:
    """Run the server in its own process group and stop the whole group (its workers too)
    when this process is stopped: Ctrl-C, SIGTERM or SIGHUP, or any error here. Killed
    outright (SIGKILL), this process cannot clean up: on Linux the server is then sent
    SIGTERM by the kernel (its parent-death signal) and stops its workers itself."""
    server = subprocess.Popen(
        command, env=env, start_new_session=True, preexec_fn=_terminate_with_parent
    )

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop_group(server)


def _terminate_with_parent() -> None:
    """In the server's process, before it runs: ask Linux for SIGTERM when its parent dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _stop_group(process: subprocess.Popen, grace_seconds: float = 10) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_seconds)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers that outlived their parent
    process.wait()
