"""Fault injection on the main job's DAG: all_tables, as `make run` runs it, on the embedded
default with the overlay workflows/config/tiny-quick.yaml (every model, task, decoding policy and
rule of tiny.yaml, each model trained and evaluated once per seed; fewer training steps, seeds,
problems and τ, because recovery is about files, locks and stores, not about the numbers). One
undisturbed run of it is made for the module.
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
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from configs import tiny_quick_config
from workflow_env import copy_of_run, environ

from setdlm.report.compare import compare_runs, result_folders
from setdlm.workflow.locks import parent_pid

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # make test-e2e, not make test

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PROFILE = REPO / "workflows" / "profiles" / "local"
NAME = "tiny-quick"  # the overlay's run name
RUN = Path("results/runs") / NAME  # inside a working directory
# Points and models the faults aim at, each cheap to recompute: a point aggregates its seeds'
# results (its metrics.json), each seed's result is its own folder (samples and metrics).
SOLVE = "arithmetic-solve/setdlm-smax8-arith/tau-0.5"
SOLVE_SEED = f"{SOLVE}/seed-0"
INFILL = "arithmetic-infill/bd3lm-s4-arith/tau-0.5"
INFILL_SEED = f"{INFILL}/seed-1"
DUAL_CACHE = "arithmetic-solve/bd3lm-s4-arith/dual-cache-tau-0.5"
DUAL_CACHE_SEED = f"{DUAL_CACHE}/seed-0"
AR_POINT = "arithmetic-infill/ar-arith/tau-1e+06"
AR_SEED = f"{AR_POINT}/seed-1"
MODEL = "ar-arith/seed-1"  # trains in seconds under the overlay, evaluated by two points
MODEL_WORK = "ar-arith-seed-1"  # its training state: models/.training/<this>


def command(workdir: Path, *extra: str) -> list[str]:
    """The main job's command (`make run`), on ``workdir``'s copy of the default config."""
    return [
        SNAKEMAKE,
        "all_tables",
        "--profile",
        str(PROFILE),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        *extra,
        "--configfile",  # last: it takes every value that follows
        str(workdir / "config.yaml"),
    ]


def run_main_job(workdir: Path, data_dir: Path, *extra: str, env: dict | None = None):
    return subprocess.run(
        command(workdir, *extra),
        capture_output=True,
        text=True,
        env=env or environ(data_dir),
        timeout=1800,
    )


@contextlib.contextmanager
def started_main_job(workdir: Path, data_dir: Path):
    """The main job running in the background, in its own process group, always stopped."""
    process = subprocess.Popen(
        command(workdir),
        env=environ(data_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # a job left running by a killed parent


def wait_until(condition, process, what: str, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        assert process.poll() is None, f"the main job ended before {what}"
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout} s")


def descendant(process, subcommand: str) -> int | None:
    """The pid of a ``setdlm <subcommand>`` process started (at any depth) by ``process``."""
    parents = {
        int(e.name): parent_pid(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()
    }
    for pid in sorted(parents):
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, process.pid):
            ancestor = parents.get(ancestor)
        if ancestor != process.pid:
            continue
        with contextlib.suppress(OSError):
            argv = (Path(f"/proc/{pid}") / "cmdline").read_bytes().decode().split("\0")
            names = [Path(arg).name for arg in argv]
            for program in ("setdlm", "setdlm.workflow.points"):  # evaluation jobs run the latter
                if program in names and subcommand in argv[names.index(program) + 1 :]:
                    return pid
    return None


def complete_lines(samples: Path) -> list[bytes]:
    if not samples.exists():
        return []
    return [line for line in samples.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]


def sample_files(workdir: Path) -> dict[str, Path]:
    found = [*(workdir / RUN).glob("*/*/*/samples.jsonl")]
    found += (workdir / RUN).glob("*/*/*/seed-*/samples.jsonl")
    return {str(path.parent.relative_to(workdir / RUN)): path for path in found}


@dataclass
class Outcome:
    fault: str
    said: str = ""  # what the first run of the command after the fault printed
    # it noticed: did work or stopped with a message (not "Nothing to be done")
    detected: bool = False
    unlocked: bool = False  # it stopped on the lock, and its advice (--unlock) was followed
    recovered: bool = False
    lost: list[str] = field(default_factory=list)  # sample lines gone since before recovery
    duplicated: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)  # setdlm compare, MLflow, leftovers

    @property
    def equal(self) -> bool:
        return self.recovered and not (self.lost or self.duplicated or self.differences)

    def report(self) -> None:
        path = os.environ.get("SETDLM_FAULT_REPORT")
        if path:
            row = {
                "fault": self.fault,
                "detected": self.detected,
                "unlocked": self.unlocked,
                "recovered": self.recovered,
                "lost": len(self.lost),
                "duplicated": len(self.duplicated),
                "equal": self.equal,
                "differences": self.differences[:5],
            }
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")


def mlflow_differences(workdir: Path) -> list[str]:
    """One active run per result folder, with its configuration hash; no history twice."""
    database = workdir / "results" / "mlflow.db"
    if not database.exists():
        return [f"{database} is missing"]
    folders = {}
    for folder in result_folders(workdir / RUN).values():
        folders[point_key(folder)] = json.loads((folder / "metrics.json").read_text())
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        runs = db.execute(
            "SELECT t1.value, t2.value FROM runs"
            " JOIN tags t1 ON t1.run_uuid = runs.run_uuid AND t1.key = 'setdlm.result_dir'"
            " JOIN tags t2 ON t2.run_uuid = runs.run_uuid AND t2.key = 'setdlm.config_hash'"
            " WHERE runs.lifecycle_stage = 'active'"
        ).fetchall()
        repeated = db.execute(
            "SELECT run_uuid, key, step, COUNT(*) FROM metrics"
            " GROUP BY run_uuid, key, step HAVING COUNT(*) > 1"
        ).fetchall()
    differences = [f"metric {key} step {step} logged {n} times" for _, key, step, n in repeated]
    by_folder: dict[str, list[str]] = {}
    for folder, config_hash in runs:  # the tag is the absolute folder of the run that synced it
        by_folder.setdefault(point_key(Path(folder)), []).append(config_hash)
    for folder, metrics in folders.items():
        hashes = by_folder.pop(folder, [])
        if hashes != [metrics["config_hash"]]:
            differences.append(f"MLflow runs of {folder}: {hashes}, not [{metrics['config_hash']}]")
    differences += [f"MLflow run of no result folder: {folder}" for folder in by_folder]
    return differences


def point_key(folder: Path) -> str:
    """task/model/setting[/seed-<k>]: the same result in the undisturbed run and its copies."""
    return "/".join(folder.parts[-4 if folder.name.startswith("seed-") else -3 :])


def leftovers(workdir: Path) -> list[str]:
    patterns = (f"{RUN}/models/**/.*.tmp-*", "results/.mlflow.db.creating-*")
    return [f"left behind: {p}" for pattern in patterns for p in workdir.glob(pattern)]


def check_recovery(
    fault: str, undisturbed: Path, workdir: Path, data_dir: Path, unlock: bool = False
) -> Outcome:
    """Run the same command (and where a hard kill left its lock, with ``unlock``, follow the
    advice: ``--unlock``, then the command again); then compare everything with the
    undisturbed run."""
    outcome = Outcome(fault)
    before = {name: complete_lines(path) for name, path in sample_files(workdir).items()}
    first = run_main_job(workdir, data_dir)
    outcome.said = said = first.stdout + first.stderr
    outcome.detected = first.returncode != 0 or "Nothing to be done" not in said
    second = first
    if first.returncode != 0 and "Directory cannot be locked" in said and unlock:
        outcome.unlocked = True
        unlocked = run_main_job(workdir, data_dir, "--unlock")
        assert unlocked.returncode == 0, (unlocked.stdout + unlocked.stderr)[-2000:]
        second = run_main_job(workdir, data_dir)
    outcome.recovered = second.returncode == 0
    if not outcome.recovered:
        outcome.differences.append((second.stdout + second.stderr)[-3000:])
        outcome.report()
        return outcome
    after = {name: complete_lines(path) for name, path in sample_files(workdir).items()}
    for name, lines in before.items():
        kept = set(after.get(name, []))
        first_of_id = {}
        for line in lines:  # what the recovery must keep: the first complete line of each id
            with contextlib.suppress(ValueError, KeyError, TypeError):
                first_of_id.setdefault(str(json.loads(line)["id"]), line)
        outcome.lost += [f"{name}: {i}" for i, line in first_of_id.items() if line not in kept]
    for name, lines in after.items():
        ids = [str(json.loads(line)["id"]) for line in lines]
        outcome.duplicated += [f"{name}: {i}" for i in sorted(set(ids)) if ids.count(i) > 1]
    compared, differences = compare_runs(undisturbed / RUN, workdir / RUN)
    if compared != len(result_folders(undisturbed / RUN)):
        differences.append(f"only {compared} result points compared")
    outcome.differences += differences + mlflow_differences(workdir) + leftovers(workdir)
    third = run_main_job(workdir, data_dir, "-n")
    if "Nothing to be done" not in third.stdout + third.stderr:
        outcome.differences.append("the next run still has jobs to do")
    outcome.report()
    return outcome


def assert_equal(outcome: Outcome) -> None:
    assert outcome.recovered, outcome.differences
    assert not outcome.lost, outcome.lost[:5]
    assert not outcome.duplicated, outcome.duplicated[:5]
    assert not outcome.differences, outcome.differences[:10]


def assert_unlock_was_advised(outcome: Outcome) -> None:
    """A run stopped by a killed run's lock says that the holder is gone and unlocking safe."""
    if outcome.unlocked:
        assert "was killed. `snakemake --unlock` is safe" in outcome.said, outcome.said[-2000:]


# ----------------------------------------------------------------------------- the runs
@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, data_dir) -> Path:
    """The main job on the default with its quick overlay, run once, never modified
    afterwards."""
    workdir = tmp_path_factory.mktemp("undisturbed")
    config = tiny_quick_config()
    assert config["name"] == NAME
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    result = run_main_job(workdir, data_dir)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert mlflow_differences(workdir) == []
    return workdir


@pytest.fixture
def faulted(undisturbed, tmp_path) -> Path:
    return copy_of_run(undisturbed, tmp_path)


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
    """A kill during a model's export: a staging folder with weights, the marker not yet written."""
    folder = run / "models" / MODEL
    shutil.copytree(folder, folder.with_name(f".{folder.name}.tmp-424242"))
    (folder / "checkpoint.json").unlink()


FINISHED_RUN_FAULTS = {
    "point folder deleted (every seed)": lambda run: shutil.rmtree(run / SOLVE),
    "one seed's folder deleted": lambda run: shutil.rmtree(run / INFILL_SEED),
    "the aggregate over seeds deleted": lambda run: (run / INFILL / "metrics.json").unlink(),
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
# recovery costs a whole run of the command (about a minute on 2 cores), and the faults of a
# group touch different files (a group's faults per target: one model fault, at most one
# MLflow fault, at most one fault per seed folder). An unnoticed fault still fails its group: the
# recovered run is compared with the undisturbed one file by file, and the next run must have
# nothing to do. SETDLM_FAULTS_ONE_BY_ONE=1 recovers each fault alone, as the groups' first
# versions did.
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
    ),
    ("kill during a model's export (staging left)", "the aggregate over seeds deleted"),
]
if os.environ.get("SETDLM_FAULTS_ONE_BY_ONE") == "1":
    FAULT_GROUPS = [(fault,) for fault in sorted(FINISHED_RUN_FAULTS)]


def test_the_fault_groups_hold_every_fault_once():
    grouped = [fault for group in FAULT_GROUPS for fault in group]
    assert sorted(grouped) == sorted(FINISHED_RUN_FAULTS)


@pytest.mark.parametrize("group", FAULT_GROUPS, ids=[" + ".join(g) for g in FAULT_GROUPS])
def test_faults_in_a_finished_run_are_repaired(undisturbed, faulted, data_dir, group):
    for fault in group:
        FINISHED_RUN_FAULTS[fault](faulted / RUN)
    outcome = check_recovery(" + ".join(group), undisturbed, faulted, data_dir)
    assert outcome.detected, "the run did not notice: Nothing to be done"
    assert_equal(outcome)


def test_a_lock_left_by_a_killed_run_is_named_and_unlocking_recovers(
    undisturbed, faulted, data_dir
):
    locks = faulted / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    # what a killed run's lock lists: outputs the next run writes too (relative, as Snakemake
    # records them)
    (locks / "0.output.lock").write_text(
        f"{RUN / SOLVE_SEED / 'metrics.json'}\n{RUN}/mlflow.synced\n"
    )
    shutil.rmtree(faulted / RUN / SOLVE)
    outcome = check_recovery(
        "lock left by a killed run", undisturbed, faulted, data_dir, unlock=True
    )
    assert outcome.unlocked  # it did stop on the lock
    assert_unlock_was_advised(outcome)
    assert_equal(outcome)


# ------------------------------------------------------------- faults on a run in progress
def _evaluation_started(workdir: Path, point: str):
    samples = workdir / RUN / point / "samples.jsonl"
    return lambda: samples.exists() and samples.read_bytes().count(b"\n") >= 2


def _kill_during_evaluation(workdir: Path, data_dir: Path, how: str) -> None:
    shutil.rmtree(workdir / RUN / SOLVE)  # work left: one point to evaluate again
    with started_main_job(workdir, data_dir) as process:
        started = _evaluation_started(workdir, SOLVE_SEED)
        wait_until(started, process, "the evaluation wrote samples")
        if how == "SIGKILL to the whole run":
            os.killpg(process.pid, signal.SIGKILL)
        elif how == "Ctrl-C (SIGINT to the process group)":
            os.killpg(process.pid, signal.SIGINT)
        elif how == "SIGTERM to snakemake":
            process.send_signal(signal.SIGTERM)
        else:  # one job's own process, the rest of the run alive
            evaluation = descendant(process, "job") or descendant(process, "eval")
            os.kill(evaluation, signal.SIGKILL)
        process.wait(timeout=300)


@pytest.mark.parametrize(
    "how",
    [
        "SIGKILL to the whole run",
        "Ctrl-C (SIGINT to the process group)",
        "SIGTERM to snakemake",
        "SIGKILL to the evaluation's process",
    ],
)
def test_an_evaluation_interrupted_mid_way_resumes(undisturbed, faulted, data_dir, how):
    _kill_during_evaluation(faulted, data_dir, how)
    outcome = check_recovery(f"evaluation: {how}", undisturbed, faulted, data_dir, unlock=True)
    assert_unlock_was_advised(outcome)
    assert_equal(outcome)


def _training_checkpointed(workdir: Path):
    manifest = workdir / RUN / "models" / ".training" / MODEL_WORK / "train" / "checkpoints"
    return lambda: manifest.is_dir() and any(manifest.glob("step-*"))


@pytest.mark.parametrize(
    "how",
    [
        "SIGKILL to the whole run",
        "Ctrl-C (SIGINT to the process group)",
        "SIGTERM to the training's process (preemption)",
        "SIGKILL to the training's process",
    ],
)
def test_a_training_interrupted_mid_way_resumes(undisturbed, faulted, data_dir, how):
    run = faulted / RUN
    shutil.rmtree(run / "models" / MODEL)  # the model and its training state lost: trained anew
    shutil.rmtree(run / "models" / ".training" / MODEL_WORK)
    with started_main_job(faulted, data_dir) as process:
        wait_until(_training_checkpointed(faulted), process, "the training checkpointed")
        if how == "SIGKILL to the whole run":
            os.killpg(process.pid, signal.SIGKILL)
        elif how.startswith("Ctrl-C"):
            os.killpg(process.pid, signal.SIGINT)
        else:
            pid = descendant(process, "train")
            os.kill(pid, signal.SIGTERM if "SIGTERM" in how else signal.SIGKILL)
        process.wait(timeout=300)
    outcome = check_recovery(f"training: {how}", undisturbed, faulted, data_dir, unlock=True)
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
        started = _evaluation_started(faulted, SOLVE_SEED)
        wait_until(started, process, "the evaluation wrote samples")
        second = run_main_job(faulted, data_dir)
        assert second.returncode != 0
        said = second.stdout + second.stderr
        assert f"locked by a running snakemake (pid {process.pid})" in said, said[-2000:]
        assert process.wait(timeout=600) == 0
    assert_equal(check_recovery("two runs at once", undisturbed, faulted, data_dir))


def test_odd_locale_and_time_zone_change_nothing(undisturbed, faulted, data_dir):
    (faulted / RUN / SOLVE_SEED / "metrics.json").unlink()  # recomputed under them
    env = environ(data_dir, LC_ALL="tr_TR.UTF-8", LANG="tr_TR.UTF-8", TZ="Pacific/Kiritimati")
    result = run_main_job(faulted, data_dir, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_equal(check_recovery("odd locale and time zone", undisturbed, faulted, data_dir))
