"""Fault injection on the main job's DAG: all_tables, as `make run` runs it, on the embedded
default with the overlay workflows/config/tiny-quick.yaml (every model, task, decoding policy and
rule of tiny.yaml, each model trained or copied, and evaluated, once per seed; ar-arith trained
on fewer steps, the others copied from the reference models; fewer seeds, problems and τ,
because recovery is about files, locks and stores, not about the numbers). One
undisturbed run of it is made per session (tests/fault_runs.py), shared with the interrupted
runs of tests/test_fault_interrupts.py.
Each fault then works on its own copy of it (``.snakemake`` metadata and modification times
included): it loses, corrupts or duplicates files of the finished run, or starts the same
command on a run with work left and kills, interrupts or doubles it at a chosen moment. Then the
same command runs again (after following the advice it printed, where it stops and says what to
do), and the run must equal the undisturbed one:

- ``setdlm compare`` finds no difference (samples, quality, counted speed, model files);
- every sample line that was complete before the recovery is still there, byte for byte, and
  no example id is written twice;
- MLflow holds exactly one active run per result folder, with that folder's configuration
  hash, and no metric history entry twice;
- nothing is left to do, and no staging folder or temporary store is left behind.

Each fault's outcome (detected, recovered, lost, duplicated, equal) is also written as one JSON
line to $SETDLM_FAULT_REPORT when that variable is set, for the table in the fault report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from fault_runs import (
    AR_POINT,
    AR_SEED,
    DUAL_CACHE,
    DUAL_CACHE_SEED,
    INFILL,
    INFILL_SEED,
    MODEL,
    MODEL_SEED_0,
    NAME,
    RUN,
    SOLVE,
    SOLVE_SEED,
    assert_equal,
    assert_unlock_was_advised,
    check_recovery,
    descendant,
    evaluation_started,
    run_main_job,
    started_main_job,
    wait_until,
)
from workflow_env import environ

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # make test-e2e, not make test


# ---------------------------------------------------------------- faults on a finished run
def _rewrite(path: Path, change) -> None:
    path.write_bytes(change(path.read_bytes()))


def _flip_bytes(path: Path, offset_fraction: float = 0.5) -> None:
    with open(path, "r+b") as handle:
        handle.seek(int(path.stat().st_size * offset_fraction))
        handle.write(b"\xa5\x5a\xa5\x5a")


def _drop_alembic_version(database: Path) -> None:
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("DROP TABLE alembic_version")  # a migration cut before its stamp
        db.commit()


def _halve_lines(data: bytes) -> bytes:
    lines = data.splitlines(keepends=True)
    return b"".join(lines[: len(lines) // 2])


def _tear_last_line(data: bytes) -> bytes:
    return data[: len(data) - len(data.splitlines(keepends=True)[-1]) // 2]


def _interleave_twice(data: bytes) -> bytes:
    return b"".join(line + line for line in data.splitlines(keepends=True))


def _export_staging(run: Path) -> None:
    """A kill during a model's export: a staging folder with weights, the marker not yet written
    (the other trained seed's model, so that a group can hold it beside a fault of MODEL)."""
    folder = run / "models" / MODEL_SEED_0
    shutil.copytree(folder, folder.with_name(f".{folder.name}.tmp-424242"))
    (folder / "checkpoint.json").unlink()


LOCK_FAULT = "a lock left by a killed run"


def _lock_left_by_a_killed_run(run: Path) -> None:
    """What a killed run's lock lists: outputs the next run writes too (relative, as Snakemake
    records them); and one of them lost, so that the next run has work to do."""
    locks = run.parents[2] / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.output.lock").write_text(
        f"{RUN / SOLVE_SEED / 'metrics.json'}\n{RUN}/mlflow.synced\n"
    )
    shutil.rmtree(run / SOLVE)


FINISHED_RUN_FAULTS = {
    "point folder deleted (every seed)": lambda run: shutil.rmtree(run / SOLVE),
    "one seed's folder deleted": lambda run: shutil.rmtree(run / INFILL_SEED),
    "the aggregate over seeds deleted": lambda run: (run / DUAL_CACHE / "metrics.json").unlink(),
    "metrics.json deleted": lambda run: (run / INFILL_SEED / "metrics.json").unlink(),
    "metrics.json binary garbage": lambda run: (run / SOLVE_SEED / "metrics.json").write_bytes(
        b"\x89PNG\r\n\x1a\n\xff\xfe\x00"
    ),
    "metrics.json truncated": lambda run: _rewrite(
        run / DUAL_CACHE_SEED / "metrics.json", lambda data: data[: len(data) // 2]
    ),
    "metrics.json emptied": lambda run: (run / AR_SEED / "metrics.json").write_bytes(b""),
    "samples.jsonl deleted": lambda run: (run / INFILL_SEED / "samples.jsonl").unlink(),
    "samples.jsonl cut to half its lines": lambda run: _rewrite(
        run / SOLVE_SEED / "samples.jsonl", _halve_lines
    ),
    "samples.jsonl last line torn": lambda run: _rewrite(
        run / DUAL_CACHE_SEED / "samples.jsonl", _tear_last_line
    ),
    "samples.jsonl written twice (two writers)": lambda run: _rewrite(
        run / INFILL_SEED / "samples.jsonl", _interleave_twice
    ),
    "model marker deleted": lambda run: (run / "models" / MODEL / "checkpoint.json").unlink(),
    "model marker garbage": lambda run: (run / "models" / MODEL / "checkpoint.json").write_text(
        "{not json"
    ),
    "weights bytes flipped in place": lambda run: _flip_bytes(
        run / "models" / MODEL / "model.safetensors"
    ),
    "weights truncated": lambda run: _rewrite(
        run / "models" / MODEL / "model.safetensors", lambda data: data[: len(data) // 2]
    ),
    "kill during a model's export (staging left)": _export_staging,
    LOCK_FAULT: _lock_left_by_a_killed_run,
    "mlflow.db deleted": lambda run: (run.parents[1] / "mlflow.db").unlink(),
    "mlflow.db overwritten with garbage": lambda run: (run.parents[1] / "mlflow.db").write_bytes(
        b"garbage" * 1000
    ),
    "mlflow.db half-migrated": lambda run: _drop_alembic_version(run.parents[1] / "mlflow.db"),
    "a table and a figure deleted": lambda run: [
        path.unlink()
        for path in (
            run.parents[1] / "tables" / NAME / "arithmetic_pareto.csv",
            run.parents[1] / "figures" / NAME / "arithmetic-solve_pareto.png",
        )
    ],
}


# The faults above, applied a group at a time to one copy and recovered by one run: each
# recovery costs a whole run of the command (20-40 s on 2 cores), and the faults of a group touch
# different files (a group's faults per target: at most one fault per model, per seed folder and
# per point's aggregate, at most one MLflow fault). An unnoticed fault still fails its group: the
# recovered run is compared with the undisturbed one file by file, and the next run must have
# nothing to do. A group with the lock recovers as its advice says (--unlock, then the command
# again). SETDLM_FAULTS_ONE_BY_ONE=1 recovers each fault alone, as the groups' first versions did.
FAULT_GROUPS = [
    (
        "point folder deleted (every seed)",
        "metrics.json truncated",
        "one seed's folder deleted",
        "model marker deleted",
        "mlflow.db deleted",
    ),
    (
        "metrics.json deleted",
        "samples.jsonl last line torn",
        "metrics.json emptied",
        "model marker garbage",
        "mlflow.db overwritten with garbage",
        LOCK_FAULT,
    ),
    (
        "samples.jsonl deleted",
        "samples.jsonl cut to half its lines",
        "weights bytes flipped in place",
        "mlflow.db half-migrated",
    ),
    (
        "samples.jsonl written twice (two writers)",
        "metrics.json binary garbage",
        "weights truncated",
        "a table and a figure deleted",
        "kill during a model's export (staging left)",
        "the aggregate over seeds deleted",
    ),
]
if os.environ.get("SETDLM_FAULTS_ONE_BY_ONE") == "1":
    FAULT_GROUPS = [(fault,) for fault in sorted(FINISHED_RUN_FAULTS)]
# The first group's recovery runs under a locale and a time zone unlike the undisturbed run's
# (dotless i, UTC+14): what it recomputes (a point, a seed, a model and the whole MLflow store)
# must still equal the undisturbed run, and the next run, in the ordinary locale, must find
# nothing to do.
ODD_LOCALE = {"LC_ALL": "tr_TR.UTF-8", "LANG": "tr_TR.UTF-8", "TZ": "Pacific/Kiritimati"}


def test_the_fault_groups_hold_every_fault_once():
    grouped = [fault for group in FAULT_GROUPS for fault in group]
    assert sorted(grouped) == sorted(FINISHED_RUN_FAULTS)


@pytest.mark.parametrize("group", FAULT_GROUPS, ids=[" + ".join(g) for g in FAULT_GROUPS])
def test_faults_in_a_finished_run_are_repaired(undisturbed, faulted, data_dir, group):
    for fault in group:
        FINISHED_RUN_FAULTS[fault](faulted / RUN)
    odd = group == FAULT_GROUPS[0]
    outcome = check_recovery(
        " + ".join(group) + (" (recovered in an odd locale and time zone)" if odd else ""),
        undisturbed,
        faulted,
        data_dir,
        unlock=LOCK_FAULT in group,
        env=environ(data_dir, **ODD_LOCALE) if odd else None,
    )
    assert outcome.detected, "the run did not notice: Nothing to be done"
    if LOCK_FAULT in group:
        assert outcome.unlocked  # it did stop on the lock
        assert_unlock_was_advised(outcome)
    assert_equal(outcome)


def test_a_sync_killed_mid_way_is_completed(undisturbed, faulted, data_dir):
    (faulted / "results" / "mlflow.db").unlink()  # the whole store to write again: seconds
    with started_main_job(faulted, data_dir) as process:
        pid = wait_until(lambda: descendant(process, "sync"), process, "the sync started")
        time.sleep(2.0)  # inside MLflow's schema creation or the first runs
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        process.wait(timeout=300)
    outcome = check_recovery("sync: SIGKILL mid-way", undisturbed, faulted, data_dir, unlock=True)
    assert_equal(outcome)


def test_a_second_run_started_during_the_first_waits_and_writes_nothing(
    undisturbed, faulted, data_dir
):
    # enough work left that the first run is still running when the second starts (with only
    # one point it could finish first on a loaded machine: seen once)
    for point in (SOLVE, INFILL, DUAL_CACHE, AR_POINT):
        shutil.rmtree(faulted / RUN / point)
    with started_main_job(faulted, data_dir) as process:
        started = evaluation_started(faulted, SOLVE_SEED)
        wait_until(started, process, "the evaluation wrote samples")
        second = run_main_job(faulted, data_dir)
        assert second.returncode != 0
        said = second.stdout + second.stderr
        assert f"locked by a running snakemake (pid {process.pid})" in said, said[-2000:]
        assert process.wait(timeout=600) == 0
    assert_equal(check_recovery("two runs at once", undisturbed, faulted, data_dir))
