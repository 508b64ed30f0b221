"""What the main job says after a fault: whether a lock's holder is alive, a full disk."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from setdlm.workflow.locks import lock_report
from setdlm.workflow.plan import disk_full_report


def test_a_lock_left_by_a_killed_run_and_one_held_by_a_live_run_are_told_apart(tmp_path):
    assert lock_report(tmp_path) is None  # nothing locked: nothing to say
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("results/runs/tiny/config.yaml\n")
    assert "was killed. `snakemake --unlock` is safe" in lock_report(tmp_path)
    # a process named snakemake working in that folder (what a live run looks like)
    live = subprocess.Popen(["bash", "-c", "exec -a snakemake sleep 60"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 10
        while b"snakemake" not in Path(f"/proc/{live.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the stand-in process never exec'd"
            time.sleep(0.01)
        report = lock_report(tmp_path)
        assert f"locked by a running snakemake (pid {live.pid})" in report
        assert "Do not --unlock" in report
    finally:
        live.kill()
        live.wait(timeout=10)
    assert "was killed" in lock_report(tmp_path)


def test_a_failure_on_a_full_disk_says_no_space_left(tmp_path):
    plan = SimpleNamespace(run=tmp_path / "results" / "runs" / "tiny")  # not created yet
    assert disk_full_report(plan) is None  # this disk has room
    report = disk_full_report(plan, low=2**62)  # every disk is "full" below 4 EiB
    assert report.startswith(f"no space left on {tmp_path}") and "MiB free" in report
