"""The workflow's failure paths through a real SLURM cluster (marker ``slurm``).

They run only against the cluster named in ``SETDLM_SLURM_TEST_CLUSTER``, and only once its
controller says it is that cluster: .ci/run starts a single-node one with
../shared/tools/local-slurm/local-slurm.sh (fake GPUs, no accounting database) and names it;
elsewhere these tests skip, saying so (tests/slurm_guard.py keeps every other test away from
SLURM). Every process they start is stopped, and every job they submitted cancelled, however
they end. The paper's matrix through SLURM (the rehearsal's stand-ins), its no-op rerun and
its baseline are checked by .ci/rehearsal-stage.

One workflow run (a tiny AR trained here, then GSM8K on 200 questions) meets three
faults: the training job gets the preemption warning SIGUSR1 (``scancel --signal=USR1``, what
``sbatch --signal=USR1@<s>`` sends), its retry gets SIGTERM (what SLURM sends at the time limit
and on preemption), and the evaluation job is cancelled in the middle (``scancel``).
Snakemake's retries resubmit each with more memory and time; the training resumes from the
checkpoint it wrote on each signal, the evaluation from the samples it had written, and the
results equal those of an undisturbed local-executor run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_guard import CLUSTER_VARIABLE, answering_cluster, given_cluster
from workflow_env import environ

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Enough steps and questions that each signal lands mid-way (the training is signalled at
# step 20, its retry at step 60; the evaluation after 5 answers, and a cancelled job writes a
# few more while it dies), and no more: the SLURM jobs and the undisturbed local run both run
# them (400 questions and 150 steps until issue 47).
STEPS = 100
EXAMPLES = 200

# the end-to-end tier: a whole workflow twice, one of them through SLURM (.ci/run keeps the
# cluster up for make test-e2e)
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]


def _cluster_or_skip() -> None:
    """Run only against the cluster named for the tests, after checking that it is the one
    answering: these tests submit, signal and cancel real jobs."""
    named = given_cluster()
    if named is None:
        pytest.skip(
            f"no SLURM cluster given ({CLUSTER_VARIABLE} is unset); .ci/run starts a local one "
            "with ../shared/tools/local-slurm/local-slurm.sh and names it"
        )
    answering = answering_cluster()
    if answering != named:
        pytest.fail(
            f"{CLUSTER_VARIABLE}={named}, but the SLURM controller answering here is "
            f"{answering or 'none'}: refusing to submit to it"
        )


CONFIG = {
    "name": "faults",
    "data": {"sources": {"gsm8k": "dir", "wikitext2": "dir"}},
    "train": {"steps": STEPS, "warmup_steps": 15},
    "models": {"ar": {"family": "ar", "train": {}}},
    "tasks": {"gsm8k": {"models": ["ar"], "limit": EXAMPLES, "max_new_tokens": 24}},
    "resources": {"default": {"cpus": 1, "mem_mb": 700, "runtime": 7, "gpus": 0}},
}


def _snakemake(work: Path, config: Path, *extra: str) -> list[str]:
    return [
        str(BIN / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(work),
        *extra,
        "all_evaluations",  # before the options that take several values
        "--configfile",
        str(config),
        "--config",
        "results=out",
    ]


def _jobs(ids: list[str]) -> dict[str, dict]:
    """SLURM's view of ``ids``: comment (the rule), state, memory (MB) and time limit (min)."""
    listing = subprocess.run(
        ["squeue", "--states=all", "-h", "-j", ",".join(ids), "-o", "%i|%k|%T|%m|%l"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    jobs = {}
    for line in listing.splitlines():
        job_id, comment, state, memory, limit = line.split("|")
        minutes, _ = limit.split(":")  # "14:00"
        jobs[job_id] = {
            "rule": comment,
            "state": state,
            "mem_mb": int(memory.rstrip("M")),
            "minutes": int(minutes),
        }
    return jobs


def _running_job(driver_log: Path, rule: str) -> str | None:
    submitted = re.findall(r"submitted with SLURM jobid (\d+)", driver_log.read_text())
    if not submitted:
        return None
    for job_id, job in _jobs(submitted).items():
        if job["rule"].startswith(f"rule_{rule}") and job["state"] == "RUNNING":
            return job_id
    return None


def _lines(path: Path) -> list[str]:
    """The complete lines of ``path`` (a line being written has no newline yet)."""
    text = path.read_text() if path.exists() else ""
    return text[: text.rfind("\n") + 1].splitlines()


def _wait(what: str, condition, driver: subprocess.Popen, log: Path, seconds: float = 240):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if driver.poll() is not None:
            pytest.fail(f"snakemake ended while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


@pytest.fixture
def started():
    """What a test starts: ``processes`` (each in its own process group) and ``driver_logs``
    (snakemake logs naming the SLURM jobs submitted). However the test ends, each process
    group still running is stopped (SIGINT, on which snakemake cancels its SLURM jobs, then
    SIGKILL) and every job named in a log is cancelled: the jobs run under slurmd, outside
    these process groups."""
    record = {"processes": [], "driver_logs": []}
    yield record
    _stop_all(record["processes"], record["driver_logs"])


def _stop_all(processes: list[subprocess.Popen], driver_logs: list[Path]) -> None:
    for process in processes:
        if process.poll() is not None:
            continue
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    submitted = [
        job
        for log in driver_logs
        if log.exists()
        for job in re.findall(r"submitted with SLURM jobid (\d+)", log.read_text())
    ]
    if submitted:
        subprocess.run(["scancel", *submitted], capture_output=True, timeout=60)


def test_a_preempted_training_and_a_cancelled_evaluation_are_retried_and_resume(
    tmp_path, data_dir, started
):
    _cluster_or_skip()
    env = environ(data_dir, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    subprocess.run(
        [str(BIN / "setdlm"), "profile", "install", "slurm"], env=env, check=True, timeout=60
    )
    config = tmp_path / "faults.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    work = tmp_path / "slurm"
    run = work / "out" / "runs" / "faults"
    losses = run / "models" / ".training" / "ar" / "train" / "losses.jsonl"
    samples = run / "gsm8k" / "ar" / "tau-1e+06" / "samples.jsonl"
    log = tmp_path / "driver.log"
    command = ["timeout", "-s", "INT", "-k", "30", "480"] + _snakemake(
        work, config, "--profile", "slurm", "--profile", str(REPO / ".ci" / "slurm")
    )
    # The same configuration, undisturbed, through the local executor, meanwhile (one thread
    # per job either way, so the results do not depend on the load).
    local = tmp_path / "local"
    local_log = tmp_path / "local.log"
    with open(local_log, "w") as output:
        undisturbed = subprocess.Popen(
            _snakemake(local, config, "--profile", str(REPO / "workflows" / "profiles" / "local")),
            cwd=REPO,
            env=env,
            stdout=output,
            stderr=output,
            start_new_session=True,  # its own process group, stopped as a whole
        )
    started["processes"].append(undisturbed)
    started["driver_logs"].append(log)
    with open(log, "w") as output:
        driver = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=output, stderr=output, start_new_session=True
        )
    started["processes"].append(driver)
    # The training, 20 of its 100 steps done: SIGUSR1, what `--signal=USR1@<s>` sends.
    train_job = _wait(
        "the training to log step 20",
        lambda: len(_lines(losses)) >= 2 and _running_job(log, "train_model"),
        driver,
        log,
    )
    subprocess.run(["scancel", "--signal=USR1", train_job], check=True, timeout=30)
    # Its retry, 40 steps further: SIGTERM, what SLURM sends at the time limit or on
    # preemption (and the profile's `--signal=TERM@120` warning).
    retry_job = _wait(
        "the retried training to log 40 more steps",
        lambda: (
            (job := _running_job(log, "train_model")) not in (None, train_job)
            and len(_lines(losses)) >= 6
            and job
        ),
        driver,
        log,
    )
    subprocess.run(["scancel", "--signal=TERM", retry_job], check=True, timeout=30)
    # The evaluation, a few answers written: cancelled outright.
    eval_job = _wait(
        "the evaluation to write 5 samples",
        lambda: len(_lines(samples)) >= 5 and _running_job(log, "evaluate"),
        driver,
        log,
    )
    subprocess.run(["scancel", eval_job], check=True, timeout=30)
    written_before = _lines(samples)
    assert len(written_before) < EXAMPLES, "the evaluation finished before it was cancelled"
    returncode = driver.wait(timeout=480)
    assert returncode == 0, log.read_text()[-4000:]

    submitted = re.findall(r"submitted with SLURM jobid (\d+)", log.read_text())
    jobs = _jobs(submitted)
    trains = [i for i in submitted if jobs[i]["rule"].startswith("rule_train_model")]
    evals = [i for i in submitted if jobs[i]["rule"].startswith("rule_evaluate")]
    assert trains[:2] == [train_job, retry_job] and evals[0] == eval_job
    # Each failed attempt was retried, asking for 2x, then 3x the memory and time.
    assert [jobs[i]["state"] for i in trains] == ["FAILED", "FAILED", "COMPLETED"]
    assert [jobs[i]["state"] for i in evals] == ["CANCELLED", "COMPLETED"]
    assert [(jobs[i]["mem_mb"], jobs[i]["minutes"]) for i in trains] == [
        (700, 7),
        (1400, 14),
        (2100, 21),
    ]
    assert [(jobs[i]["mem_mb"], jobs[i]["minutes"]) for i in evals] == [(700, 7), (1400, 14)]

    # Each signal stopped the training with a checkpoint, and each retry went on from it.
    marker = json.loads((run / "models" / "ar" / "checkpoint.json").read_text())
    attempts = [
        (a["job"]["job_id"], a["from_step"], a["to_step"], a["stopped_by"])
        for a in marker["attempts"]
    ]
    first, second = attempts[0][2], attempts[1][2]
    assert attempts == [
        (trains[0], 0, first, "SIGUSR1"),
        (trains[1], first, second, "SIGTERM"),
        (trains[2], second, STEPS, None),
    ]
    assert 20 <= first < second < STEPS
    assert marker["job"]["job_id"] == trains[2]

    # The evaluation kept what the cancelled job had written, byte for byte (timings included,
    # so nothing was recomputed), and the retry wrote only the rest.
    written = _lines(samples)
    assert written[: len(written_before)] == written_before
    assert len(written) == EXAMPLES
    # The cancelled job may write a few more lines while it dies: those are kept too.
    job_of_line = [json.loads(line)["job_id"] for line in written]
    kept = job_of_line.count(evals[0])
    assert len(written_before) <= kept < EXAMPLES
    assert job_of_line == [evals[0]] * kept + [evals[1]] * (len(written) - kept)
    metrics = json.loads((samples.parent / "metrics.json").read_text())
    assert metrics["jobs"] == evals and metrics["scheduler"]["job_id"] == evals[1]

    # The undisturbed local-executor run computed the same results.
    assert undisturbed.wait(timeout=600) == 0, local_log.read_text()[-3000:]
    compared = subprocess.run(
        [str(BIN / "setdlm"), "compare", str(local / "out" / "runs" / "faults"), str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "1 result points compared: identical results" in compared.stdout
