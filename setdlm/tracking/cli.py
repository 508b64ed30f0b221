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
from setdlm.tracking.record import experiment_facts, run_record, sweep_records
from setdlm.tracking.serving import refuse_unservable
from setdlm.tracking.store import (
    PROXIED_ARTIFACTS,
    StoreUnavailable,
    open_client,
    resolve_store,
    sqlite_path,
    writer_lock,
)
from setdlm.tracking.views import saved_views
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
    pairs = [(point, run_record(point)) for point in scan.finished]
    synced, views, current = [], [], results_dir
    try:
        with writer_lock(store):
            client = open_client(store)
            from setdlm.tracking.sync import Known, sync_run, sync_sweep, sync_views

            # What this sync found or wrote, not searched for again; every sync of a local
            # database takes the lock held here, so no other sync adds runs meanwhile.
            known = Known(exclusive=sqlite_path(store.uri) is not None)
            for point, record in pairs:
                current = point.folder
                run = sync_run(
                    client,
                    record,
                    str(current),
                    store.artifact_root,
                    store.artifacts_destination,
                    known,
                )
                print(f"  {run.action:9s} {run.experiment}: {run.run_name}  (run {run.run_id})")
                synced.append(run)
            current = results_dir
            sweeps = [sync_sweep(client, sweep, known) for sweep in sweep_records(pairs)]
            facts = experiment_facts(pairs)
            ids = {experiment_id for experiment_id, _ in (sync_views(client, f) for f in facts)}
            experiments = [client.get_experiment(experiment_id) for experiment_id in sorted(ids)]
            views = saved_views(experiments)
            _warn_absolute_locations(experiments, store)
    except Exception as error:  # any failure to reach or write MLflow; the files are untouched
        print(_failure_message(error, args, results_dir, current, store.uri), file=sys.stderr)
        return 1
    counts = {a: sum(r.action == a for r in synced) for a in ("created", "updated", "unchanged")}
    print(f"synced {len(synced)} run(s): " + ", ".join(f"{n} {a}" for a, n in counts.items()))
    sweep_counts = ", ".join(f"{sweeps.count(a)} {a}" for a in ("created", "updated", "unchanged"))
    print(f"sweep summaries: {sweep_counts}")
    base = store.uri if store.is_remote else f"http://127.0.0.1:{DEFAULT_PORT}"
    if views:
        where = "" if store.is_remote else ", with `setdlm ui` running"
        print(f"saved views (open the first{where}):")
        _print_links(views, base)
    listed = [{"experiment": v.experiment, "name": v.name, "url": v.url(base)} for v in views]
    _write_marker(args.marker, store.uri, results_dir, synced, scan.unfinished, listed)
    return 0


DEFAULT_PORT = 5000  # setdlm ui's


def _warn_absolute_locations(experiments, store) -> None:
    """A store created before artifact locations were relative keeps absolute ones; where one
    lies outside this results folder (a copied store), nothing was written there."""
    from setdlm.tracking.sync import elsewhere

    if store.artifact_root != PROXIED_ARTIFACTS:
        return
    for experiment in experiments:
        location = experiment.artifact_location
        if location.startswith(PROXIED_ARTIFACTS):
            continue
        outside = elsewhere(location, store.artifacts_destination)
        print(
            f"warning: experiment {experiment.name} keeps its artifacts at {location}, a path "
            "(its store predates relative artifact locations): a copy of the results folder "
            "will not find them"
            + (", and this sync wrote none there, outside this results folder" if outside else "")
            + f". Move {store.uri.removeprefix('sqlite:///')} aside and sync again to rebuild "
            "the store with relative locations.",
            file=sys.stderr,
        )


def _write_marker(
    marker: Path | None, uri: str, results_dir: Path, synced, unfinished, views=()
) -> None:
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
            "views": list(views),
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
    parser.add_argument("--port", type=option("$defs/port"), default=DEFAULT_PORT)
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
        if not args.dry_run:
            with contextlib.suppress(Exception):  # the views are a convenience here
                _print_views(open_client(store), store.uri)
        return 0
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store.uri]
    if store.artifacts_destination is not None:
        # mlflow-artifacts:/<experiment> resolves here: the results folder's own mlartifacts/.
        command += ["--artifacts-destination", str(store.artifacts_destination)]
    command += ["--host", args.host, "--port", str(args.port), "--workers", "1"]
    base = f"http://{args.host}:{args.port}"
    if not args.dry_run:
        # Nothing is announced that cannot be served (setdlm/tracking/serving.py).
        refuse_unservable(args.host, args.port, store)
    print(f"MLflow UI on {store.uri}: {base}")
    print("  " + shlex.join(["mlflow", *command[3:]]))
    if args.dry_run:
        return 0
    if sqlite_path(store.uri) is not None:
        # Create the schema under the writers' lock: `mlflow ui` migrating a fresh database
        # while a sync does the same fails.
        try:
            with writer_lock(store):
                client = open_client(store)
        except StoreUnavailable as error:
            print(f"setdlm ui: {error}", file=sys.stderr)
            return 1
        _print_views(client, base)
    # Background job execution is not used here and costs memory.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    code = serve_until_stopped(command, env)
    if code is None:
        return 0  # stopped by the user
    # A server that ends by itself has stopped serving what was announced.
    print(
        f"setdlm ui: the MLflow server stopped by itself (exit status {code}): {base} is not "
        "served; its messages are above",
        file=sys.stderr,
    )
    return code or 1


def _print_views(client, base: str) -> None:
    """The link to open first (the main experiment's speed-quality charts), then the others."""
    views = saved_views(client.search_experiments())
    if not views:
        print("no saved views yet: `setdlm sync RESULTS_DIR` writes them")
        return
    first, rest = views[0], views[1:]
    print(f"Open {first.experiment}, {first.name}:\n  {first.url(base)}", flush=True)
    if rest:
        print("Other saved views (also in each experiment's Views menu):")
        _print_links(rest, base)


def _print_links(views, base: str) -> None:
    """One saved view per entry: its experiment and name, then its link on ``base``."""
    for view in views:
        print(f"  {view.experiment}: {view.name}\n    {view.url(base)}", flush=True)


def serve_until_stopped(command: list[str], env: dict) -> int | None:
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
        return server.wait()  # the server ended by itself
    except KeyboardInterrupt:
        return None
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
