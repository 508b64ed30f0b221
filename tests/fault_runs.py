"""What the fault-injection modules share (tests/test_fault_injection.py, the faults on a
finished run; tests/test_fault_interrupts.py, the runs interrupted mid-way): the main job's
command, the undisturbed run they are compared with (made once per session, by one pytest-xdist
worker, for all of them) and the check of a recovery."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from configs import tiny_quick_config
from shared_build import built_once, xdist_worker
from workflow_env import environ

from setdlm.report.compare import compare_runs, result_folders
from setdlm.workflow.locks import parent_pid

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
MODEL_SEED_0 = "ar-arith/seed-0"  # the same model's other seed, trained as well
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


def evaluation_started(workdir: Path, point: str):
    """A condition: the point's evaluation has written two samples."""
    samples = workdir / RUN / point / "samples.jsonl"
    return lambda: samples.exists() and samples.read_bytes().count(b"\n") >= 2


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
    fault: str,
    undisturbed: Path,
    workdir: Path,
    data_dir: Path,
    unlock: bool = False,
    env: dict | None = None,
) -> Outcome:
    """Run the same command (and where a hard kill left its lock, with ``unlock``, follow the
    advice: ``--unlock``, then the command again), in ``env`` if given; then compare everything
    with the undisturbed run."""
    outcome = Outcome(fault)
    before = {name: complete_lines(path) for name, path in sample_files(workdir).items()}
    first = run_main_job(workdir, data_dir, env=env)
    outcome.said = said = first.stdout + first.stderr
    outcome.detected = first.returncode != 0 or "Nothing to be done" not in said
    second = first
    if first.returncode != 0 and "Directory cannot be locked" in said and unlock:
        outcome.unlocked = True
        unlocked = run_main_job(workdir, data_dir, "--unlock", env=env)
        assert unlocked.returncode == 0, (unlocked.stdout + unlocked.stderr)[-2000:]
        second = run_main_job(workdir, data_dir, env=env)
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


UNDISTURBED_WAIT_S = 1800  # a worker waits this long for the run another worker makes


def undisturbed_run(tmp_path_factory, data_dir: Path) -> Path:
    """The main job on the default with its quick overlay, run once per session (by the first
    worker that needs it when pytest-xdist distributes the modules), never modified afterwards:
    every fault works on a copy of it."""

    def build(workdir: Path) -> None:
        workdir.mkdir()
        config = tiny_quick_config()
        assert config["name"] == NAME
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
        result = run_main_job(workdir, data_dir)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        assert mlflow_differences(workdir) == []

    if xdist_worker() is None:
        workdir = tmp_path_factory.mktemp("undisturbed")
        workdir.rmdir()
        build(workdir)
        return workdir
    shared = tmp_path_factory.getbasetemp().parent / "undisturbed"  # the workers' common
    return built_once(shared, build, "the undisturbed run", UNDISTURBED_WAIT_S)
