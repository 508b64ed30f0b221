"""A real MLflow server on localhost, the one `setdlm ui` starts (the end-to-end tier: each
start takes about 8 s on AMD EPYC): a sync that found it down printed the command to replay;
replayed through the real command line, it fills that server's store, one finished run per
result with its artifacts stored by the server; SIGTERM to setdlm ui then stops the server and
its workers, and so does SIGKILL, which setdlm ui cannot catch."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from mlflow_helpers import free_port, result_runs, setdlm_ui, stops_serving, write_small_results

from setdlm.results.reader import find_results
from setdlm.tracking import sync_main
from setdlm.tracking.record import IDENTITY_TAG, SYNCED_TAG

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_a_real_mlflow_server_receives_the_replayed_sync_and_stops_on_sigterm(tmp_path, capsys):
    results = write_small_results(tmp_path / "results")
    folder = results / "runs" / "tiny"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    assert sync_main([str(folder), "--tracking-uri", url]) == 1  # not started yet
    replay = capsys.readouterr().err.splitlines()[-1].strip()
    served = tmp_path / "served"  # the server's results folder: its store and artifacts
    served.mkdir()
    with setdlm_ui(served, port) as ui:
        # The exact command the failure printed, through the real command line.
        command = shlex.split(replay)
        assert command[:2] == ["setdlm", "sync"]
        done = subprocess.run(
            [sys.executable, "-m", "setdlm.cli", *command[1:]],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        finished = find_results(folder).finished
        assert sync_main([str(folder), "--tracking-uri", url]) == 0
        assert f"{len(finished)} unchanged" in capsys.readouterr().out
        client = MlflowClient(url)
        runs = {r.data.tags[IDENTITY_TAG]: r for rs in result_runs(client).values() for r in rs}
        assert len(runs) == len(finished)
        for point in finished:
            run = runs[point.metrics["config_hash"]]
            assert run.info.status == "FINISHED" and SYNCED_TAG in run.data.tags, point.folder
        run = next(iter(runs.values()))
        assert {"samples.jsonl", "metrics.json"} <= {
            a.path for a in client.list_artifacts(run.info.run_id)
        }
        assert any((served / "mlartifacts").rglob("samples.jsonl"))  # stored by the server
        stops_serving(ui, signal.SIGTERM, port)
    assert not (results / "mlflow.db").exists()  # the local store was not used


def test_killing_setdlm_ui_outright_stops_the_mlflow_server_and_its_workers(tmp_path):
    port = free_port()
    with setdlm_ui(write_small_results(tmp_path / "results"), port) as ui:
        stops_serving(ui, signal.SIGKILL, port)
