"""Fault injection on a run in progress: the main job's DAG (its quick overlay, as in
tests/test_fault_injection.py) with work left, killed or interrupted while an evaluation or a
training runs, then run again: the run must equal the undisturbed one (tests/fault_runs.py says
how it is compared). A module of its own so that pytest-xdist runs it beside the faults on a
finished run; both compare with the same undisturbed run, made once per session."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from fault_runs import (
    MODEL,
    MODEL_WORK,
    RUN,
    SOLVE,
    SOLVE_SEED,
    assert_equal,
    assert_unlock_was_advised,
    check_recovery,
    descendant,
    evaluation_started,
    started_main_job,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # make test-e2e, not make test


# ------------------------------------------------------------- faults on a run in progress
def _kill_during_evaluation(workdir: Path, data_dir: Path, how: str) -> None:
    shutil.rmtree(workdir / RUN / SOLVE)  # work left: one point to evaluate again
    with started_main_job(workdir, data_dir) as process:
        started = evaluation_started(workdir, SOLVE_SEED)
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
