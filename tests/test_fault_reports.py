"""What the main job says after a fault: whether a lock's holder is alive, a full disk."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from setdlm.workflow.locks import lock_report
from setdlm.workflow.plan import disk_full_report, set_aside_unreadable


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
        # bash's own argv ("bash -c 'exec -a snakemake ...'") already contains the word: wait
        # until the exec has replaced it, with "snakemake" as argv[0]
        while not Path(f"/proc/{live.pid}/cmdline").read_bytes().startswith(b"snakemake\0"):
            assert time.monotonic() < deadline, "the stand-in process never exec'd"
            time.sleep(0.01)
        report = lock_report(tmp_path)
        assert f"locked by a running snakemake (pid {live.pid})" in report
        assert "Do not --unlock" in report
        # started with --nolock, Snakemake will not refuse: the message must not say "wait"
        beside = lock_report(tmp_path, nolock=True)
        assert f"(pid {live.pid}); with --nolock this run goes on beside it" in beside
        assert "wait" not in beside
        link = tmp_path.parent / f"{tmp_path.name}-link"  # the same folder by another name
        link.symlink_to(tmp_path)
        assert f"(pid {live.pid})" in lock_report(link)
    finally:
        live.kill()
        live.wait(timeout=10)
    assert "was killed" in lock_report(tmp_path)
    assert lock_report(tmp_path, nolock=True) is None  # a dead lock does not stop --nolock


def test_the_command_line_says_whether_the_lock_is_skipped():
    from setdlm.workflow.invocation import command_line_skips_the_lock

    assert command_line_skips_the_lock(["--nolock", "-n", "all_tables"])
    assert not command_line_skips_the_lock(["all_tables"])
    assert not command_line_skips_the_lock(["--no-such-option"])  # not a Snakemake command line


def test_a_failure_on_a_full_disk_says_no_space_left(tmp_path):
    plan = SimpleNamespace(run=tmp_path / "results" / "runs" / "tiny")  # not created yet
    assert disk_full_report(plan) is None  # this disk has room
    report = disk_full_report(plan, low=2**62)  # every disk is "full" below 4 EiB
    assert report.startswith(f"no space left on {tmp_path}") and "MiB free" in report


def test_an_unreadable_result_is_named_and_set_aside_to_be_recomputed(tmp_path):
    good, garbage, wrong = (tmp_path / name / "metrics.json" for name in ("a", "b", "c"))
    marker = tmp_path / "models" / "m" / "checkpoint.json"
    for path in (good, garbage, wrong, marker):
        path.parent.mkdir(parents=True)
    good.write_text('{"quality": {}}')
    garbage.write_bytes(b"\\x89PNG\\r\\n\\x1a\\n\\xff\\xfe")  # binary garbage: not even UTF-8
    wrong.write_text("[1, 2]")
    marker.write_text('{"source": "trained"}')  # no file list
    plan = SimpleNamespace(
        all_metrics=lambda: [str(good), str(garbage), str(wrong), str(tmp_path / "d.json")],
        model_markers=lambda: [str(marker)],
        seed_metrics=lambda: [],
    )
    messages = set_aside_unreadable(plan)
    assert len(messages) == 3 and good.exists()
    for path in (garbage, wrong, marker):
        assert not path.exists() and list(path.parent.glob(f"{path.name}.unreadable-*"))
        assert any(message.startswith(f"{path}: unreadable result") for message in messages)
    assert "not valid JSON" in next(m for m in messages if m.startswith(str(garbage)))
    assert set_aside_unreadable(plan) == []  # what is left reads fine (or is missing)


def test_the_reader_names_a_binary_garbage_metrics_file(tmp_path):
    from setdlm.results.reader import ResultError, read_point

    folder = tmp_path / "runs" / "tiny" / "gsm8k" / "ar" / "tau-1e+06"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_bytes(b"\x89PNG\xff\xfe")
    named = re.escape(str(folder / "metrics.json"))
    for checked in (True, False):  # for the report (in the layout) and the sync (anywhere)
        with pytest.raises(ResultError, match=f"{named}: not valid JSON"):
            read_point(folder, checked=checked)


def test_a_result_whose_samples_no_longer_back_it_is_set_aside(tmp_path):
    """Samples lost, cut short, torn or written twice under a finished metrics.json: the
    metrics are moved aside, so that the evaluation resumes from the complete samples."""
    lines = [json.dumps({"id": str(i), "output": i}) + "\n" for i in range(4)]
    cases = {
        "whole": "".join(lines),
        "missing": None,
        "short": "".join(lines[:3]),
        "torn": "".join(lines[:3]) + lines[3][:5],
        "twice": "".join(lines + lines[:1]),
    }
    plan = SimpleNamespace(
        all_metrics=lambda: [str(tmp_path / name / "metrics.json") for name in cases],
        model_markers=lambda: [],
        seed_metrics=lambda: [],
    )
    for name, samples in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text('{"quality": {}, "examples": 4}')
        if samples is not None:
            (tmp_path / name / "samples.jsonl").write_text(samples)
    messages = set_aside_unreadable(plan)
    assert (tmp_path / "whole" / "metrics.json").exists() and len(messages) == 4
    problems = {
        "missing": "samples.jsonl is missing",
        "short": "samples.jsonl holds 3 of its 4 examples",
        "torn": "samples.jsonl has torn or repeated lines",
        "twice": "samples.jsonl has torn or repeated lines",
    }
    for name, problem in problems.items():
        assert not (tmp_path / name / "metrics.json").exists()
        path = tmp_path / name / "metrics.json"
        assert any(m.startswith(f"{path}: incomplete result ({problem})") for m in messages)
    assert (tmp_path / "torn" / "samples.jsonl").read_text().endswith(lines[3][:5])  # untouched


def test_samples_unchanged_since_their_metrics_are_not_parsed_again_and_changed_ones_are(
    tmp_path, monkeypatch
):
    """metrics.json records the sha256 of the log it was computed from: a log still equal to
    it is not scanned at a workflow's start; any other is scanned as before, recorded hash or
    not."""
    from setdlm.eval.records import SampleLog
    from setdlm.util.files import sha256_file

    lines = [json.dumps({"id": str(i), "output": i}) + "\n" for i in range(4)]
    recorded = tmp_path / "recorded.jsonl"
    recorded.write_text("".join(lines))
    digest = sha256_file(recorded)
    cases = {"unchanged": "".join(lines), "twice": "".join(lines + lines[:1])}
    for name, samples in cases.items():
        (tmp_path / name).mkdir()
        metrics = {"quality": {}, "examples": 4, "samples_sha256": digest}
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
        (tmp_path / name / "samples.jsonl").write_text(samples)
    scanned = []
    original_scan = SampleLog.scan
    monkeypatch.setattr(
        SampleLog, "scan", lambda log: scanned.append(log.path) or original_scan(log)
    )
    plan = SimpleNamespace(
        all_metrics=lambda: [str(tmp_path / name / "metrics.json") for name in cases],
        model_markers=lambda: [],
        seed_metrics=lambda: [],
    )
    messages = set_aside_unreadable(plan)
    assert scanned == [tmp_path / "twice" / "samples.jsonl"]
    assert (tmp_path / "unchanged" / "metrics.json").exists()
    path = tmp_path / "twice" / "metrics.json"
    assert messages == [
        f"{path}: incomplete result (samples.jsonl has torn or repeated lines); moved to "
        f"{next(path.parent.glob('metrics.json.unreadable-*')).name}, and the job that writes it "
        "runs again"
    ]


def test_a_model_whose_files_changed_after_its_marker_is_set_aside(tmp_path):
    from setdlm.util.files import sha256_file

    markers = {}
    for name in ("kept", "flipped", "truncated", "missing", "touched"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(bytes(range(256)) * 4)
        marker = folder / "checkpoint.json"
        files = {"model.safetensors": sha256_file(folder / "model.safetensors")}
        marker.write_text(json.dumps({"source": "trained", "files": files}))
        os.utime(marker, ns=(10**18, 10**18))  # written after the weights
        markers[name] = marker
    weights = {name: marker.parent / "model.safetensors" for name, marker in markers.items()}
    with open(weights["flipped"], "r+b") as handle:  # a few flipped bytes, in place
        handle.seek(100)
        handle.write(b"\xff\xff\xff")
    weights["truncated"].write_bytes(weights["truncated"].read_bytes()[:300])
    weights["missing"].unlink()
    later = 2 * 10**18
    for name in ("flipped", "truncated", "touched"):  # modified after the marker
        os.utime(weights[name], ns=(later, later))
    plan = SimpleNamespace(
        all_metrics=lambda: [],
        model_markers=lambda: [str(m) for m in markers.values()],
        seed_metrics=lambda: [],
    )
    messages = set_aside_unreadable(plan)
    assert len(messages) == 3  # the same bytes with a new time are the same model
    for name, problem in {
        "flipped": "model.safetensors does not match the sha256 recorded in checkpoint.json",
        "truncated": "model.safetensors does not match the sha256 recorded in checkpoint.json",
        "missing": "model.safetensors is missing",
    }.items():
        assert any(m.startswith(f"{markers[name]}: changed model ({problem})") for m in messages)
        assert not markers[name].exists()
    assert markers["kept"].exists() and markers["touched"].exists()


def test_a_lost_or_overwritten_mlflow_store_is_synced_again(tmp_path):
    from setdlm.workflow.plan import resync_lost_store

    run = tmp_path / "results" / "runs" / "tiny"
    run.mkdir(parents=True)
    database = tmp_path / "results" / "mlflow.db"
    plan = SimpleNamespace(run=str(run), tracking_uri=lambda environ: f"sqlite:///{database}")
    marker = run / "mlflow.synced"
    assert resync_lost_store(plan, {}) == []  # never synced: the sync runs anyway
    for state, content in (("gone", None), ("not an SQLite database", b"garbage" * 10)):
        marker.write_text("synced\n")
        if content is not None:
            database.write_bytes(content)
        assert resync_lost_store(plan, {}) == [
            f"{database} is {state}: syncing the results into MLflow again"
        ]
        assert not marker.exists()
    database.unlink()
    with contextlib.closing(sqlite3.connect(database)) as db:  # a sound store's tables
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
        db.commit()
    marker.write_text("synced\n")
    assert resync_lost_store(plan, {}) == [] and marker.exists()
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("DROP TABLE alembic_version")  # a migration cut before its stamp
        db.commit()
    assert resync_lost_store(plan, {}) == [
        f"{database} is half-migrated: syncing the results into MLflow again"
    ]
    marker.write_text("synced\n")
    with open(database, "r+b") as handle:  # the header kept, the schema page overwritten
        handle.seek(100)
        handle.write(b"\xff" * 3000)
    (message,) = resync_lost_store(plan, {})
    assert message.startswith(f"{database} is corrupted (") and not marker.exists()
    marker.write_text("synced\n")
    server = SimpleNamespace(run=str(run), tracking_uri=lambda environ: "http://127.0.0.1:9")
    assert resync_lost_store(server, {}) == [] and marker.exists()  # the sync reports a server
