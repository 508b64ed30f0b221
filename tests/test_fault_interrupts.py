"""Fault injection on a run in progress: the main job's DAG (its quick overlay, as in
tests/test_fault_injection.py) with work left, killed or interrupted while an evaluation or a
training runs, then run again: the run must equal the undisturbed one (tests/fault_runs.py says
how it is compared). A module of its own so that pytest-xdist runs it beside the faults on a
finished run; both compare with the same undisturbed run, made once per session.

The interruptions come in two chains of four, one for the evaluations and one for a training:
the first stops a run, the same command resumes it and the next interrupts that resuming run
mid-way (new samples written, a later checkpoint), and so on; then one recovery, compared as a
single interruption's would be. The last of a chain is the one that leaves Snakemake's lock (a
SIGKILL to the whole run), after which only the advised `--unlock` lets the next run start.
2 recoveries instead of 8 (issue 47; the module's times are in docs/checks-and-ci.md).
SETDLM_FAULTS_ONE_BY_ONE=1 recovers each interruption alone.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from fault_runs import (
    AR_POINT,
    DUAL_CACHE,
    INFILL,
    MODEL,
    MODEL_WORK,
    RUN,
    SOLVE,
    assert_equal,
    assert_unlock_was_advised,
    check_recovery,
    complete_lines,
    descendant,
    started_main_job,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # make test-e2e, not make test

WHOLE_RUN_KILL = "SIGKILL to the whole run"
CTRL_C = "Ctrl-C (SIGINT to the process group)"
EVALUATION_INTERRUPTS = [
    ("SIGKILL to the evaluation's process", CTRL_C, "SIGTERM to snakemake", WHOLE_RUN_KILL),
]
TRAINING_INTERRUPTS = [
    (
        "SIGTERM to the training's process (preemption)",
        "SIGKILL to the training's process",
        CTRL_C,
        WHOLE_RUN_KILL,
    ),
]
if os.environ.get("SETDLM_FAULTS_ONE_BY_ONE") == "1":
    EVALUATION_INTERRUPTS = [(how,) for chain in EVALUATION_INTERRUPTS for how in chain]
    TRAINING_INTERRUPTS = [(how,) for chain in TRAINING_INTERRUPTS for how in chain]


# the processes a one-process interruption aims at: an evaluation job runs `points job` (an
# evaluation alone, `setdlm eval`), a training `setdlm train`
JOB_PROCESSES = {"eval": ("job", "eval"), "train": ("train",)}


def _ids(chains) -> list[str]:
    return [" then ".join(chain) for chain in chains]


def _interrupt(process, how: str, job: str) -> None:
    """Send ``how`` to the running main job (``job``: the subcommand of the job process the
    one-process interruptions aim at) and wait for the run to end."""
    if how == WHOLE_RUN_KILL:
        os.killpg(process.pid, signal.SIGKILL)
    elif how == CTRL_C:
        os.killpg(process.pid, signal.SIGINT)
    elif how == "SIGTERM to snakemake":
        process.send_signal(signal.SIGTERM)
    else:  # one job's own process, the rest of the run alive
        pid = next(filter(None, (descendant(process, name) for name in JOB_PROCESSES[job])), None)
        assert pid, f"no running {' or '.join(JOB_PROCESSES[job])} process to interrupt"
        os.kill(pid, signal.SIGTERM if "SIGTERM" in how else signal.SIGKILL)
    process.wait(timeout=300)


def _interrupted_run(workdir: Path, data_dir: Path, how: str, progress, job: str) -> None:
    """A fresh run of the main job, interrupted by ``how`` once it has made ``progress`` beyond
    what the previous runs left."""
    with started_main_job(workdir, data_dir) as process:
        wait_until(progress.made, process, f"progress before {how}")
        _interrupt(process, how, job)


# ------------------------------------------------------------- faults on a run in progress
class _NewSamples:
    """An evaluation's progress: two complete sample lines more in the points' seed folders
    than the previous runs left."""

    def __init__(self, run: Path, points: tuple[str, ...]):
        self.files = [
            run / point / f"seed-{k}" / "samples.jsonl" for point in points for k in (0, 1)
        ]
        self.before = 0

    def count(self) -> int:
        return sum(len(complete_lines(path)) for path in self.files)

    def made(self) -> bool:
        return self.count() >= self.before + 2

    def mark(self) -> None:
        self.before = self.count()


# The points an evaluation's chain loses before each of its runs, of two models each. Each run
# gets work of its own: a point of the quick overlay takes 1-3 s, and a graceful stop (SIGTERM
# to snakemake lets the running jobs end; a Ctrl-C at times lands as they end) can leave the
# next run too few of the first points' samples to be interrupted in.
EVALUATION_LOSSES = (
    (SOLVE, INFILL),
    (DUAL_CACHE, AR_POINT),
    ("arithmetic-solve/mdlm-arith/tau-0.5", "arithmetic-infill/setdlm-smax8-arith/tau-0.5"),
    ("arithmetic-infill/mdlm-arith/tau-0.5", "arithmetic-solve/ar-arith/tau-1e+06"),
)


@pytest.mark.parametrize("chain", EVALUATION_INTERRUPTS, ids=_ids(EVALUATION_INTERRUPTS))
def test_an_evaluation_interrupted_mid_way_resumes(undisturbed, faulted, data_dir, chain):
    run = faulted / RUN
    progress = _NewSamples(run, tuple(point for lost in EVALUATION_LOSSES for point in lost))
    for how, lost in zip(chain, EVALUATION_LOSSES[: len(chain)], strict=True):
        for point in lost:
            shutil.rmtree(run / point)
        progress.mark()
        _interrupted_run(faulted, data_dir, how, progress, "eval")
    outcome = check_recovery(
        f"evaluation: {' then '.join(chain)}", undisturbed, faulted, data_dir, unlock=True
    )
    assert_unlock_was_advised(outcome)
    assert_equal(outcome)


class _NewCheckpoint:
    """A training's progress: a checkpoint of a later step than the previous runs left."""

    def __init__(self, workdir: Path):
        self.checkpoints = workdir / RUN / "models" / ".training" / MODEL_WORK / "train"
        self.checkpoints /= "checkpoints"
        self.before = 0

    def step(self) -> int:
        names = [path.name for path in self.checkpoints.glob("step-*")]
        return max((int(name[5:]) for name in names if name[5:].isdigit()), default=0)

    def made(self) -> bool:
        return self.step() > self.before

    def mark(self) -> None:
        self.before = self.step()


@pytest.mark.parametrize("chain", TRAINING_INTERRUPTS, ids=_ids(TRAINING_INTERRUPTS))
def test_a_training_interrupted_mid_way_resumes(undisturbed, faulted, data_dir, chain):
    run = faulted / RUN
    shutil.rmtree(run / "models" / MODEL)  # the model and its training state lost: trained anew
    shutil.rmtree(run / "models" / ".training" / MODEL_WORK)
    progress = _NewCheckpoint(faulted)
    for how in chain:  # each resumes from the checkpoints the one before left
        _interrupted_run(faulted, data_dir, how, progress, "train")
        progress.mark()
    outcome = check_recovery(
        f"training: {' then '.join(chain)}", undisturbed, faulted, data_dir, unlock=True
    )
    assert_unlock_was_advised(outcome)
    assert_equal(outcome)
