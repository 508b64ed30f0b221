"""MLflow tracking: real result folders mirrored into MLflow, one run per point, idempotently.

The result folders come from the real evaluations on the tiny trained models: CNN/DM at two
thresholds for SetDLM and BD3LM, held-out likelihood for SetDLM. Each test syncs a copy of them
into a SQLite store of its own (a real MLflow server: tests/test_mlflow_server.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from mlflow_helpers import free_port, result_runs, write_small_results

from setdlm.cli import main as setdlm_main
from setdlm.eval.records import config_hash
from setdlm.results.reader import read_point, results_root
from setdlm.tracking import empty_store as store_cache
from setdlm.tracking import sync_main, ui_main
from setdlm.tracking.record import (
    IDENTITY_TAG,
    STALE_TAG,
    SUPERSEDED_TAG,
    SWEEP_TAG,
    SYNCED_TAG,
    run_record,
)
from setdlm.tracking.store import filesystem_type, open_client, resolve_store, writer_lock
from setdlm.util.files import atomic_write_json, sha256_file

POINTS = {  # folder under runs/tiny -> experiment
    "cnndm/setdlm/tau-1e+06": "cnndm",
    "cnndm/setdlm/tau-0.9": "cnndm",
    "cnndm/bd3lm/tau-1e+06": "cnndm",
    "cnndm/bd3lm/tau-0.9": "cnndm",
    "cnndm/bd3lm/dual-cache-tau-0.9": "cnndm",
    "likelihood-wikitext2/setdlm/default": "likelihood-wikitext2",
}


@pytest.fixture(scope="module")
def finished_results(trained_tiny, tmp_path_factory) -> Path:
    """A results folder in the layout, from the real ``setdlm eval`` commands."""
    root = tmp_path_factory.mktemp("results")
    runs = root / "runs" / "tiny"
    # SetDLM as the workflow trains it: a model folder in the layout, with the checkpoint.json
    # marker `setdlm train` writes (every file's sha256); BD3LM from elsewhere, without one.
    models = runs / "models" / "setdlm"
    shutil.copytree(trained_tiny / "setdlm" / "model", models)
    files = {path.name: sha256_file(path) for path in sorted(models.iterdir())}
    atomic_write_json(models / "checkpoint.json", {"source": "trained", "files": files})
    for family in ("setdlm", "bd3lm"):
        model = str(models if family == "setdlm" else trained_tiny / family / "model")
        out = str(runs / "cnndm" / family)
        args = ["eval", "cnndm", "--model", model, "--out", out, "--limit", "2"]
        assert setdlm_main([*args, "--threshold", "1e6", "0.9"]) == 0
    # BD3LM with another decoding policy too: a curve (sweep) of its own
    dual = ["--model", str(trained_tiny / "bd3lm" / "model"), "--policy", "dual-cache"]
    out = str(runs / "cnndm" / "bd3lm")
    assert (
        setdlm_main(
            ["eval", "cnndm", *dual, "--out", out, "--limit", "2"] + ["--threshold", "0.9", "0.5"]
        )
        == 0
    )
    shutil.rmtree(runs / "cnndm" / "bd3lm" / "dual-cache-tau-0.5")  # one point is enough
    out = str(runs / "likelihood-wikitext2" / "setdlm" / "default")
    assert (
        setdlm_main(["eval", "likelihood", "--model", str(models), "--out", out, "--limit", "4"])
        == 0
    )
    # An unfinished point (killed before metrics.json) is left alone.
    (runs / "cnndm" / "ar" / "tau-0.9").mkdir(parents=True)
    (runs / "cnndm" / "ar" / "tau-0.9" / "samples.jsonl").write_text("")
    return root


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """A SQLite store with MLflow's schema, created once (migrating one costs seconds)."""
    root = tmp_path_factory.mktemp("store")
    store = resolve_store(root, f"sqlite:///{root / 'mlflow.db'}")
    with writer_lock(store):
        open_client(store)
    return root / "mlflow.db"


@pytest.fixture
def results(finished_results, empty_store, tmp_path, monkeypatch) -> Path:
    """A copy of the results with an empty store at its default place, results/mlflow.db."""
    copy = tmp_path / "results"
    shutil.copytree(finished_results, copy)
    shutil.copy(empty_store, copy / "mlflow.db")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # a stray ./mlruns would show up here
    return copy


def _client(results: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{results / 'mlflow.db'}")


def _artifacts(results: Path, run) -> Path:
    """The folder a local run's artifacts are in: its location, mlflow-artifacts:/<experiment>/
    <run id>/artifacts, stands for <results>/mlartifacts/<experiment>/<run id>/artifacts."""
    uri = run.info.artifact_uri
    assert uri.startswith("mlflow-artifacts:/"), uri  # no path of this machine in the store
    return results / "mlartifacts" / uri.removeprefix("mlflow-artifacts:/")


def _assert_one_finished_run_per_point(client: MlflowClient, results: Path) -> None:
    runs = result_runs(client)
    assert sorted(runs) == ["cnndm", "likelihood-wikitext2"]
    assert sum(len(r) for r in runs.values()) == len(POINTS)
    for folder, experiment in POINTS.items():
        metrics = json.loads((results / "runs" / "tiny" / folder / "metrics.json").read_text())
        matching = [
            r for r in runs[experiment] if r.data.tags[IDENTITY_TAG] == metrics["config_hash"]
        ]
        assert len(matching) == 1, folder
        assert matching[0].info.status == "FINISHED"
        assert SYNCED_TAG in matching[0].data.tags
        for key in matching[0].data.metrics:
            assert len(client.get_metric_history(matching[0].info.run_id, key)) == 1, key


def test_sync_mirrors_every_point_with_params_metrics_tags_and_artifacts(results, tmp_path):
    marker = tmp_path / "synced.json"
    assert sync_main([str(results / "runs" / "tiny"), "--marker", str(marker)]) == 0
    assert not (tmp_path / "mlruns").exists() and (results / "mlartifacts").is_dir()
    client = _client(results)
    _assert_one_finished_run_per_point(client, results)
    listed = json.loads(marker.read_text())
    assert len(listed["runs"]) == len(POINTS) and len(listed["unfinished"]) == 1

    by_hash = {r.data.tags[IDENTITY_TAG]: r for runs in result_runs(client).values() for r in runs}
    for folder in POINTS:
        point = results / "runs" / "tiny" / folder
        metrics = json.loads((point / "metrics.json").read_text())
        config = metrics["config"]
        run = by_hash[metrics["config_hash"]]
        params, logged, tags = run.data.params, run.data.metrics, run.data.tags
        family = config["model_config"]["family"]
        assert params["family"] == family and params["checkpoint"] == config["model_source"]
        assert len(params["checkpoint_config_hash"]) == 16
        if family == "setdlm":  # the weights' identity, from the checkpoint.json marker
            marker = json.loads((results / "runs/tiny/models/setdlm/checkpoint.json").read_text())
            assert params["checkpoint_sha256"] == config_hash(marker["files"])
        else:
            assert "checkpoint_sha256" not in params
        assert params["model"] == family and params["config_name"] == "tiny"
        assert all(isinstance(v, str) and len(v) <= 6000 for v in params.values())
        for name, entry in metrics["quality"].items():
            assert logged[f"quality.{name}"] == pytest.approx(entry["value"])
        assert tags["setdlm.result_dir"] == str(point)
        assert tags["mlflow.source.git.commit"] == metrics["code_versions"][-1]
        assert tags["hardware.cpu"] == metrics["hardware"]["cpu"]
        assert tags["software.torch"] == metrics["software"]["torch"]
        assert tags["mlflow.runName"] == "/".join(folder.split("/")[1:])
        artifacts = {a.name for a in _artifacts(results, run).iterdir()}
        assert {"samples.jsonl", "metrics.json"} <= artifacts
        copy = _artifacts(results, run) / "metrics.json"
        assert copy.read_bytes() == (point / "metrics.json").read_bytes()
        if "decode" not in config:  # likelihood: no decoding, no speed
            assert params["task.data"] == "wikitext2" and params["d"] == "4"
            assert not any(key.startswith("speed.") for key in logged)
            continue
        decode, speed = config["decode"], metrics["speed"]
        assert params["tau"] == json.dumps(decode["confidence_threshold"])
        own = {"setdlm": "sliding-window", "bd3lm": "block-cache"}[family]
        assert params["policy"] == ("dual-cache" if "dual-cache" in folder else own)
        assert params["decode.top_p"] == json.dumps(decode["top_p"])
        knobs = decode.get("options") or decode  # a named policy's own, or the flat layout
        if "policy" in decode:
            assert params["decode.options.block_size"] == json.dumps(knobs["block_size"])
        else:
            assert params["decode.fused_block_cache"] == json.dumps(decode["fused_block_cache"])
        assert params["task.max_new_tokens"] == str(config["task_settings"]["max_new_tokens"])
        if family == "setdlm":
            schedule = config["model_config"]["schedule"]
            assert params["W"] == str(knobs["window"]) and params["d"] == str(schedule["d"])
            assert params["M"] == str(schedule["M"])
        else:
            assert params["block_size"] == str(knobs["block_size"]) and params["W"] == "null"
        low, high = metrics["quality"]["rouge1"]["bootstrap_95"]
        assert logged["quality.rouge1.bootstrap_95.0"] == pytest.approx(low)
        assert logged["quality.rouge1.bootstrap_95.1"] == pytest.approx(high)
        for name in (
            "tokens_per_second_aggregate",
            "tokens_per_second_mean",
            "latency_seconds_p50",
            "latency_seconds_p95",
            "nfe_mean",
            "parallelism_mean",
        ):
            assert logged[f"speed.{name}"] == pytest.approx(speed[name])
        assert logged["speed.peak_memory.bytes"] == speed["peak_memory"]["bytes"]
        assert tags["speed.peak_memory.kind"] == speed["peak_memory"]["kind"]
        assert not any("settings" in key or "definition" in key for key in logged)


def test_a_second_sync_creates_nothing_and_a_remeasured_value_is_appended(results, capsys):
    folder = results / "runs" / "tiny"
    assert sync_main([str(folder)]) == 0
    assert sync_main([str(folder)]) == 0
    assert f"0 created, 0 updated, {len(POINTS)} unchanged" in capsys.readouterr().out
    client = _client(results)
    _assert_one_finished_run_per_point(client, results)

    # The same configuration measured again (new speed; a NaN and an infinity beside a value,
    # as some metrics report them; a NaN value itself is refused, tests/test_bad_inputs_sweep.py):
    # one run still, the new value appended once, unchanged values left alone.
    path = folder / "cnndm" / "setdlm" / "tau-0.9" / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["speed"]["tokens_per_second_mean"] *= 2
    metrics["quality"]["odd"] = {
        "value": 0.25,
        "std": math.nan,
        "upper": math.inf,
        "definition": "edge case",
    }
    path.write_text(json.dumps(metrics))
    assert sync_main([str(folder)]) == 0
    assert f"0 created, 1 updated, {len(POINTS) - 1} unchanged" in capsys.readouterr().out
    assert sync_main([str(folder)]) == 0
    assert f"0 created, 0 updated, {len(POINTS)} unchanged" in capsys.readouterr().out
    run = client.search_runs(
        [client.get_experiment_by_name("cnndm").experiment_id],
        filter_string=f"tags.`{IDENTITY_TAG}` = '{metrics['config_hash']}'",
    )[0]
    history = client.get_metric_history(run.info.run_id, "speed.tokens_per_second_mean")
    assert [m.step for m in history] == [0, 1]
    assert history[1].value == pytest.approx(metrics["speed"]["tokens_per_second_mean"])
    assert run.data.metrics["quality.odd"] == 0.25
    assert math.isnan(run.data.metrics["quality.odd.std"])
    assert len(client.get_metric_history(run.info.run_id, "quality.odd")) == 1
    assert len(client.get_metric_history(run.info.run_id, "quality.odd.std")) == 1
    assert len(client.get_metric_history(run.info.run_id, "speed.nfe_mean")) == 1
    assert sum(len(r) for r in result_runs(client).values()) == len(POINTS)


@pytest.mark.parametrize("step", ["create_run", "log_batch", "log_artifact", "set_terminated"])
def test_an_interrupted_sync_is_completed_by_the_next(results, monkeypatch, step):
    """The process dies right after one MLflow call (KeyboardInterrupt is not caught, like a
    kill): the run stays RUNNING, half written; the next sync completes that same run."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    # Beside a local database the artifacts are written by MLflow's local repository.
    owner = LocalArtifactRepository if step == "log_artifact" else MlflowClient
    original = getattr(owner, step)
    touched = []

    def die_after(self, *args, **kwargs):
        value = original(self, *args, **kwargs)
        if step == "set_terminated" and SWEEP_TAG in self.get_run(args[0]).data.tags:
            return value  # a new sweep's parent, finished before its first point: not a point
        if step == "create_run":
            touched.append(value.info.run_id)
        elif step == "log_artifact":  # <experiment>/<run id>/artifacts
            touched.append(Path(self.artifact_dir).parent.name)
        else:
            touched.append(args[0])
        raise KeyboardInterrupt

    folder = str(results / "runs" / "tiny")
    with monkeypatch.context() as patch:
        patch.setattr(owner, step, die_after)
        with pytest.raises(KeyboardInterrupt):
            sync_main([folder])
    client = _client(results)
    interrupted = client.get_run(touched[0])
    assert SYNCED_TAG not in interrupted.data.tags
    assert interrupted.info.status == ("FINISHED" if step == "set_terminated" else "RUNNING")

    assert sync_main([folder]) == 0
    _assert_one_finished_run_per_point(client, results)
    completed = client.get_run(touched[0])  # the same run, now complete
    assert completed.info.status == "FINISHED" and SYNCED_TAG in completed.data.tags
    assert {"samples.jsonl", "metrics.json"} <= {
        a.name for a in _artifacts(results, completed).iterdir()
    }


def test_a_sweep_parent_left_running_is_finished_by_the_next_sync(results, capsys):
    """A sync killed between a sweep parent's creation and its end leaves it RUNNING, its
    points already complete: a replay, which touches no point, still finishes it."""
    folder = str(results / "runs" / "tiny")
    assert sync_main([folder]) == 0
    client = _client(results)
    ids = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(ids, filter_string=f"tags.`{SWEEP_TAG}` != ''")
    assert parents
    client.update_run(parents[0].info.run_id, status="RUNNING")
    capsys.readouterr()
    assert sync_main([folder]) == 0
    out = capsys.readouterr().out
    assert f"0 created, 0 updated, {len(POINTS)} unchanged" in out
    assert f"sweep summaries: 0 created, 1 updated, {len(parents) - 1} unchanged" in out
    assert client.get_run(parents[0].info.run_id).info.status == "FINISHED"


KILLED_AFTER_CREATE_RUN = """
import os, signal, sys
from mlflow.tracking import MlflowClient
from setdlm.tracking import sync_main

create_run = MlflowClient.create_run

def create_run_then_die(self, *args, **kwargs):
    run = create_run(self, *args, **kwargs)
    print(run.info.run_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

MlflowClient.create_run = create_run_then_die
sys.exit(sync_main(sys.argv[1:]))
"""


def test_a_sync_killed_after_creating_a_run_is_completed_by_the_next(results):
    """A real ``kill -9`` (the OS drops the lock, SQLite rolls back what was in flight)."""
    folder = str(results / "runs" / "tiny")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_CREATE_RUN, folder],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_id = killed.stdout.split()[-1]
    client = _client(results)
    assert client.get_run(run_id).info.status == "RUNNING"
    assert sync_main([folder]) == 0
    _assert_one_finished_run_per_point(client, results)
    assert client.get_run(run_id).data.tags[SYNCED_TAG]


def test_a_down_server_fails_in_seconds_saying_the_results_are_safe(results, monkeypatch, capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    folder = results / "runs" / "tiny"
    marker = results / "synced.json"
    start = time.monotonic()
    assert sync_main([str(folder), "--marker", str(marker)]) == 1
    assert time.monotonic() - start < 10
    error = capsys.readouterr().err
    assert f"results are safe on disk in {folder}" in error
    replay = f"setdlm sync {folder} --tracking-uri {url} --marker {marker}"
    assert replay in error
    assert not marker.exists()


@pytest.mark.slow  # two processes importing MLflow, one migrating a fresh schema
def test_concurrent_syncs_of_one_folder_make_one_run_per_point(finished_results, tmp_path):
    """Two ``setdlm sync`` processes on a store that does not exist yet: the lock makes one
    create the schema and write, then the other finds every run synced."""
    results = tmp_path / "results"
    shutil.copytree(finished_results, results)
    # sync_main itself, without the full command line's imports (torch), to keep this quick.
    entry = "import sys; from setdlm.tracking import sync_main; sys.exit(sync_main(sys.argv[1:]))"
    command = [sys.executable, "-c", entry, str(results / "runs" / "tiny")]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=180)[0].decode() for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    created = [int(o.split("synced ")[1].split(": ")[1].split(" created")[0]) for o in outputs]
    assert sorted(created) == [0, len(POINTS)]
    _assert_one_finished_run_per_point(_client(results), results)


def test_results_root_rule(tmp_path, monkeypatch):
    monkeypatch.delenv("SETDLM_RESULTS_DIR", raising=False)
    point = tmp_path / "results" / "runs" / "tiny" / "cnndm" / "setdlm" / "default"
    point.mkdir(parents=True)
    for folder in (point, tmp_path / "results" / "runs", tmp_path / "results"):
        assert results_root(folder) == tmp_path / "results"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert results_root(elsewhere) == elsewhere
    monkeypatch.setenv("SETDLM_RESULTS_DIR", str(tmp_path / "store"))
    assert results_root(elsewhere) == tmp_path / "store"
    assert results_root(point) == tmp_path / "results"  # the layout wins
    uri = resolve_store(results_root(point)).uri
    assert uri == f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"


def test_quality_extras_are_flattened_to_numbers_and_settings_left_out(finished_results):
    point = read_point(
        finished_results / "runs" / "tiny" / "cnndm" / "setdlm" / "tau-0.9", checked=False
    )
    quality = {
        "mauve_bootstrap": {
            "value": 0.5,
            "definition": "text",
            "mean": 0.5,
            "std": 0.1,
            "values": [0.4, 0.6],
            "seeds": [25, 26],
            "featurizer": {"dimension": 384, "id": "x"},
            "mauve_settings": {"num_buckets": "auto", "scaling_factor": 5},
            "empty_generations": {"policy": "placeholder", "count": 2},
            "text_protocol": "clean",
        },
        "stop_reasons": {"value": 5, "counts": {"eos": 3, "max new/tokens!": 2}},
    }
    point = dataclasses.replace(point, metrics=point.metrics | {"quality": quality})
    logged = {k for k in run_record(point).metrics if k.startswith("quality.")}
    assert logged == {
        "quality.mauve_bootstrap",
        "quality.mauve_bootstrap.mean",
        "quality.mauve_bootstrap.std",
        "quality.mauve_bootstrap.values.0",
        "quality.mauve_bootstrap.values.1",
        "quality.mauve_bootstrap.empty_generations.count",
        "quality.stop_reasons",
        "quality.stop_reasons.counts.eos",
        "quality.stop_reasons.counts.max new/tokens_",
    }


def test_ui_command_opens_the_local_store(results, monkeypatch, capsys):
    assert ui_main(["--results", str(results), "--port", "5123", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:5123" in out
    assert f"mlflow ui --backend-store-uri sqlite:///{results / 'mlflow.db'}" in out
    # artifacts resolved against this results folder, wherever it is now
    assert f"--artifacts-destination {results / 'mlartifacts'} " in out
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert ui_main(["--results", str(results)]) == 0
    assert "http://tracking.example:5000" in capsys.readouterr().out


def test_nothing_finished_touches_no_store_and_other_metrics_files_are_skipped(tmp_path, capsys):
    training = tmp_path / "results" / "runs" / "tiny" / "train" / "setdlm"
    training.mkdir(parents=True)
    (training / "metrics.json").write_text(json.dumps({"loss": 1.0}))  # not an evaluation's
    marker = tmp_path / "synced.json"
    url = f"http://127.0.0.1:{free_port()}"  # down, and never asked
    assert (
        sync_main([str(tmp_path / "results"), "--tracking-uri", url, "--marker", str(marker)]) == 0
    )
    assert "not an evaluation result" in capsys.readouterr().err
    assert json.loads(marker.read_text())["runs"] == []
    assert not (tmp_path / "results" / "mlflow.db").exists()


def test_a_store_on_a_shared_filesystem_is_recognized(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\nserver:/export /shared nfs4 rw 0 0\n"
        "/dev/sdb1 /shared/local\\040disk ext4 rw 0 0\n"
    )
    assert filesystem_type(Path("/shared/results"), mounts) == "nfs4"
    assert filesystem_type(Path("/shared/local disk/results"), mounts) == "ext4"
    assert filesystem_type(Path("/sharedx/results"), mounts) == "ext4"


def test_key_metrics_times_and_sweeps_as_the_ui_shows_them(results):
    assert sync_main([str(results / "runs" / "tiny")]) == 0
    client = _client(results)
    experiment = client.get_experiment_by_name("cnndm").experiment_id
    everything = client.search_runs([experiment], max_results=100)
    parents = {r.info.run_id: r for r in everything if SWEEP_TAG in r.data.tags}
    # One parent per (task, model, policy) sweep, each point of the sweep its child: a model
    # decoded with another policy than its family's own is a curve of its own.
    assert sorted(r.data.tags[SWEEP_TAG] for r in parents.values()) == [
        "tiny/cnndm/bd3lm",
        "tiny/cnndm/bd3lm dual-cache",
        "tiny/cnndm/setdlm",
    ]
    assert {r.info.run_name for r in parents.values()} == {"bd3lm", "bd3lm dual-cache", "setdlm"}
    for run in result_runs(client)["cnndm"]:
        parent = parents[run.data.tags["mlflow.parentRunId"]]
        params = run.data.params
        curve = params["model"] + (" dual-cache" if params["policy"] == "dual-cache" else "")
        assert parent.data.tags[SWEEP_TAG].endswith("/" + curve)
        folder = Path(run.data.tags["setdlm.result_dir"])
        metrics = json.loads((folder / "metrics.json").read_text())
        # The key metrics under the same short names in every experiment.
        logged, speed = run.data.metrics, metrics["speed"]
        assert logged["quality"] == pytest.approx(metrics["quality"]["rougeL"]["value"])
        assert logged["tokens_per_second"] == pytest.approx(speed["tokens_per_second_mean"])
        assert logged["parallelism"] == pytest.approx(speed["parallelism_mean"])
        assert logged["tokens_per_forward"] == pytest.approx(speed["tokens_per_forward_mean"])
        assert logged["nfe"] == pytest.approx(speed["nfe_mean"])
        assert run.data.tags["setdlm.quality"].startswith("quality = quality.rougeL")
        # The run's start and end are the evaluation's, not the sync's.
        times = metrics["times"]
        started = datetime.datetime.fromisoformat(times["started_at"]).timestamp() * 1000
        finished = datetime.datetime.fromisoformat(times["finished_at"]).timestamp() * 1000
        assert run.info.start_time == int(started) and run.info.end_time == int(finished)
        assert run.info.end_time < time.time() * 1000 - 1  # before this sync
    likelihood = result_runs(client)["likelihood-wikitext2"][0]
    assert "quality" in likelihood.data.metrics  # its NLL
    assert "tokens_per_second" not in likelihood.data.metrics


def test_a_changed_configuration_supersedes_the_old_run(results, capsys):
    folder = results / "runs" / "tiny"
    assert sync_main([str(folder)]) == 0
    client = _client(results)
    point = folder / "cnndm" / "setdlm" / "tau-0.9"
    old_hash = json.loads((point / "metrics.json").read_text())["config_hash"]
    (old,) = [r for r in result_runs(client)["cnndm"] if r.data.tags[IDENTITY_TAG] == old_hash]
    # The same folder recomputed under another configuration.
    metrics = json.loads((point / "metrics.json").read_text())
    metrics["config_hash"] = "0123456789abcdef"
    (point / "metrics.json").write_text(json.dumps(metrics))
    assert sync_main([str(folder)]) == 0
    _assert_one_finished_run_per_point(client, results)  # the default (active) view
    replaced = client.get_run(old.info.run_id)
    assert replaced.info.lifecycle_stage == "deleted"  # out of the default view, restorable
    (new,) = [
        r for r in result_runs(client)["cnndm"] if r.data.tags[IDENTITY_TAG] == "0123456789abcdef"
    ]
    assert replaced.data.tags[SUPERSEDED_TAG] == new.info.run_id
    # The old configuration back: its run comes back, and the other one is superseded.
    metrics["config_hash"] = old_hash
    (point / "metrics.json").write_text(json.dumps(metrics))
    assert sync_main([str(folder)]) == 0
    _assert_one_finished_run_per_point(client, results)
    restored = client.get_run(old.info.run_id)
    assert restored.info.lifecycle_stage == "active" and SUPERSEDED_TAG not in restored.data.tags
    assert client.get_run(new.info.run_id).info.lifecycle_stage == "deleted"


KILLED_WHILE_CREATING = """
import os, signal, sys, threading
from pathlib import Path
from setdlm.tracking.store import open_client, resolve_store, writer_lock
if sys.argv[2] == "before-rename":  # the worst moment: the schema is migrated, not in place
    os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
else:  # somewhere inside MLflow's migration
    threading.Timer(float(sys.argv[2]), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
store = resolve_store(Path(sys.argv[1]))
with writer_lock(store):
    open_client(store)
print("finished before the kill")
"""


def test_a_sync_killed_while_creating_the_store_leaves_none_half_made(results, tmp_path):
    """Finding 1 of the fault report: 4 of 23 kills during the first schema migration broke
    the store for good. Now it is migrated in a temporary file and renamed into place."""
    (results / "mlflow.db").unlink()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # No cached empty store to copy (a cache that cannot be written): MLflow migrates each
    # time, as in a first creation, so the timed kills land inside its migration.
    (tmp_path / "not-a-folder").write_text("")
    migrating = env | {"SETDLM_CACHE_DIR": str(tmp_path / "not-a-folder" / "cache")}
    for moment in ("before-rename", "0.5", "1.0"):
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_WHILE_CREATING, str(results), moment],
            env=env if moment == "before-rename" else migrating,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if killed.returncode == 0:  # created before the timer fired: a complete store
            assert "finished before the kill" in killed.stdout
            (results / "mlflow.db").unlink()
            continue
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert not (results / "mlflow.db").exists()  # never a half-migrated store in place
    assert list(results.glob(".mlflow.db.creating-*"))  # what the kills left behind
    assert sync_main([str(results / "runs" / "tiny")]) == 0
    _assert_one_finished_run_per_point(_client(results), results)
    assert not list(results.glob(".mlflow.db.creating-*"))  # cleaned by the next creation


def _new_store(root: Path) -> Path:
    store = resolve_store(root, f"sqlite:///{root / 'mlflow.db'}")
    with writer_lock(store):
        open_client(store)
    return root / "mlflow.db"


def _contents(database: Path) -> list[str]:
    """A store's schema and rows, line by line and sorted (MLflow's migration writes a few
    index statements and constraints in another order from one run to the next), with the
    default experiment's times left out."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        lines = [line for statement in db.iterdump() for line in statement.splitlines()]
    return sorted(
        re.sub(r"^(INSERT INTO \"experiments\" VALUES\(0,.*),\d+,\d+,", r"\1,", line)
        for line in lines
    )


def _default_experiment(database: Path) -> tuple[str, int]:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return db.execute(
            "SELECT artifact_location, creation_time FROM experiments WHERE experiment_id = 0"
        ).fetchone()


def test_a_new_store_is_a_copy_of_the_one_mlflow_migrates(tmp_path, monkeypatch):
    """MLflow's schema migration (1-2 s) runs once per MLflow version: its empty store is kept
    in setdlm's cache and copied for every new store, which then holds what the migration
    makes, its default experiment dated now and located under the working directory. A
    damaged cached store is dropped and the migration runs; so it does with no usable cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SETDLM_CACHE_DIR", str(tmp_path / "cache"))
    migrated = _new_store(tmp_path / "first")  # nothing cached: migrated, then kept
    cached = store_cache.cached_empty_store()
    assert cached.parent == tmp_path / "cache" and cached.is_file()
    started = time.time() * 1000
    copied = _new_store(tmp_path / "second")
    assert _contents(copied) == _contents(migrated)
    location, created = _default_experiment(copied)
    assert location == _default_experiment(migrated)[0] == str(tmp_path / "mlruns" / "0")
    assert created >= started
    # copied indeed: a tag put into the cached store shows up in the next store
    with contextlib.closing(sqlite3.connect(cached)) as db, db:
        db.execute("INSERT INTO experiment_tags VALUES ('mark', 'copied', 0)")
    assert ("mark", "copied") in _tags_of_the_default_experiment(_new_store(tmp_path / "third"))

    cached.write_bytes(b"not a database")  # damaged: dropped, migrated, kept anew
    assert _contents(_new_store(tmp_path / "fourth")) == _contents(migrated)
    assert _contents(cached) == _contents(migrated)

    (tmp_path / "a-file").write_text("")  # a cache that cannot be written: migrated
    monkeypatch.setenv("SETDLM_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    assert _contents(_new_store(tmp_path / "fifth")) == _contents(migrated)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(store_cache, "cache_dir", no_home)  # no cache folder at all: migrated
    assert store_cache.cached_empty_store() is None
    assert _contents(_new_store(tmp_path / "sixth")) == _contents(migrated)


def _tags_of_the_default_experiment(database: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return db.execute(
            "SELECT key, value FROM experiment_tags WHERE experiment_id = 0"
        ).fetchall()


def test_a_half_migrated_store_is_rebuilt_from_the_results_or_named(results, tmp_path, capsys):
    folder = str(results / "runs" / "tiny")
    assert sync_main([folder]) == 0
    given = tmp_path / "given.db"  # a store the user named: reported, never moved
    shutil.copy(results / "mlflow.db", given)
    for database in (results / "mlflow.db", given):
        with contextlib.closing(sqlite3.connect(database)) as db:
            db.execute("DROP TABLE alembic_version")  # a migration cut before its stamp
            db.commit()
    capsys.readouterr()
    assert sync_main([folder, "--tracking-uri", f"sqlite:///{given}"]) == 1
    assert "migration was interrupted; move" in capsys.readouterr().err and given.exists()
    assert sync_main([folder]) == 0
    assert "rebuilding the store from the result files" in capsys.readouterr().err
    assert len(list(results.glob("mlflow.db.broken-*"))) == 1  # kept, not deleted
    _assert_one_finished_run_per_point(_client(results), results)


@pytest.mark.parametrize("damage", ["overwritten", "corrupted pages"])
def test_a_damaged_default_store_is_rebuilt_from_the_results(results, capsys, damage):
    """The project's own mlflow.db overwritten with other bytes, or with pages SQLite cannot
    read: moved aside (kept) and rebuilt from the result files; a named store is only named."""
    folder = str(results / "runs" / "tiny")
    assert sync_main([folder]) == 0
    database = results / "mlflow.db"
    if damage == "overwritten":
        database.write_bytes(b"\x89PNG garbage" * 100)
    else:
        with open(database, "r+b") as handle:  # the header kept, the first pages zeroed
            handle.seek(100)
            handle.write(bytes(8192))
    capsys.readouterr()
    # named as the workflow names it, relative to the working directory: still this store
    relative = f"sqlite:///{os.path.relpath(database)}"
    assert sync_main([folder, "--tracking-uri", relative]) == 0
    err = capsys.readouterr().err
    assert "rebuilding the store from the result files" in err, err
    assert len(list(results.glob("mlflow.db.broken-*"))) == 1  # kept, not deleted
    _assert_one_finished_run_per_point(_client(results), results)


# The record's chart fields, the sweeps' summaries, the saved views and the artifact locations,
# on small hand-written result folders (no model needed).


@pytest.fixture
def small_results(tmp_path) -> Path:
    return write_small_results(tmp_path / "results")


def _records(root: Path) -> list:
    from setdlm.results.reader import find_results

    return [(point, run_record(point)) for point in find_results(root).finished]


def test_chart_fields_levels_colours_and_the_direction_of_quality(small_results):
    from setdlm.families import family as family_info

    run = small_results / "runs" / "tiny"
    records = {str(p.folder.relative_to(run)): r for p, r in _records(small_results)}
    threshold = records["arithmetic-solve/setdlm-smax8-arith/tau-0.1"]
    assert threshold.metrics["tau_log10"] == pytest.approx(-1.0)
    assert threshold.metrics["no_threshold"] == 0.0
    # τ = 1e6 (no threshold) drawn at τ = 1, beside the thresholds, and marked
    none = records["arithmetic-solve/setdlm-smax8-arith/tau-1e+06"]
    assert none.metrics["tau_log10"] == 0.0 and none.metrics["no_threshold"] == 1.0
    assert none.params["tau"] == "1000000.0"  # the param keeps the value itself
    seed = records["arithmetic-solve/setdlm-smax8-arith/tau-1e+06/seed-2"]
    assert seed.metrics["training_seed"] == 2.0 and "training_seed" not in none.metrics
    assert {none.tags["setdlm.level"], seed.tags["setdlm.level"]} == {"point", "seed"}
    # AR decodes one token per step whatever τ is: no τ axis for it
    ar = records["arithmetic-solve/ar-arith/tau-1e+06"]
    assert "tau_log10" not in ar.metrics and "no_threshold" not in ar.metrics
    for record, family in ((none, "setdlm"), (ar, "ar")):
        colour = record.tags["mlflow.runColor"]
        assert colour.startswith("#") and len(colour) == 7
        assert colour == {"black": "#000000"}.get(c := family_info(family).colours[0], c)
    assert none.metrics["quality"] == none.metrics["accuracy"] == 0.95
    assert (none.metrics["quality_low"], none.metrics["quality_high"]) == (0.9, 0.99)
    assert none.tags["setdlm.quality_direction"] == "higher is better"
    assert none.tags["setdlm.quality"].endswith("(arithmetic-solve); higher is better")
    nll = records["likelihood-arithmetic/ar-arith/default"]
    assert nll.tags["setdlm.quality_direction"] == "lower is better"
    assert "tau_log10" not in nll.metrics and "parallelism" not in nll.metrics


def test_sweep_parents_carry_the_shared_params_and_a_summary(small_results):
    from setdlm.report.aup import aup
    from setdlm.tracking.record import sweep_records

    sweeps = {s.sweep: s for s in sweep_records(_records(small_results))}
    assert sorted(sweeps) == [
        "tiny/arithmetic-solve/ar-arith",
        "tiny/arithmetic-solve/bd3lm-s4-arith",
        "tiny/arithmetic-solve/bd3lm-s4-arith dual-cache",
        "tiny/arithmetic-solve/setdlm-smax8-arith",
        "tiny/likelihood-arithmetic/ar-arith",
        "tiny/likelihood-arithmetic/setdlm-smax8-arith",
    ]
    setdlm = sweeps["tiny/arithmetic-solve/setdlm-smax8-arith"]
    assert setdlm.run_name == "setdlm-smax8-arith"
    # what its points share; not what tells them apart
    assert setdlm.params["family"] == "setdlm" and setdlm.params["model"] == "setdlm-smax8-arith"
    assert setdlm.params["task"] == "arithmetic-solve" and setdlm.params["config_name"] == "tiny"
    assert not {"tau", "point", "decode.confidence_threshold"} & set(setdlm.params)
    assert setdlm.metrics["points"] == 2.0  # the seed's own run is not a point of the sweep
    assert setdlm.metrics["best_quality"] == setdlm.metrics["best_accuracy"] == 0.95
    # the AUP of the tables: the task's best point (AR, 0.99) is the reference
    expected = aup([(3.0, 0.9), (1.0, 0.95)], 0.99).value
    assert setdlm.metrics["aup"] == pytest.approx(expected)
    assert setdlm.tags["setdlm.level"] == "sweep" and setdlm.tags["setdlm.sweep"] == setdlm.sweep
    assert setdlm.tags["setdlm.points"] == "tau-0.1,tau-1e+06"
    assert setdlm.tags["mlflow.runColor"].startswith("#")
    assert sweeps["tiny/arithmetic-solve/ar-arith"].metrics["aup"] == pytest.approx(0.99)
    # likelihood: lower is better, nothing decoded, no AUP
    nll = sweeps["tiny/likelihood-arithmetic/setdlm-smax8-arith"]
    assert nll.metrics == {"points": 1.0, "best_quality": 0.36}
    assert nll.tags["setdlm.quality_direction"] == "lower is better"


def _store_contents(uri: str) -> dict:
    """Every run of a store by its identity (config hash, else sweep): its name, status,
    params, metrics and tags, its parent named by identity too; ids and times left out."""
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=1000)
    identity = {
        r.info.run_id: r.data.tags.get(IDENTITY_TAG, r.data.tags.get(SWEEP_TAG)) for r in runs
    }
    contents = {}
    for run in runs:
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
        parent = identity.get(run.data.tags.get("mlflow.parentRunId"))
        key = identity[run.info.run_id]
        assert key not in contents, f"two runs of {key}"
        contents[key] = (
            run.info.run_name,
            run.info.status,
            run.data.params,
            run.data.metrics,
            tags,
            parent,
        )
    return contents


def test_a_sync_into_a_new_store_searches_nothing_and_writes_what_searching_would(
    small_results, tmp_path, monkeypatch
):
    """Into a store it created, under the lock, a sync knows every run there: it skips the
    searches (issue 47) and must write exactly the runs, parents and tags it writes with them."""
    from setdlm.tracking import sync
    from setdlm.tracking.record import sweep_records

    folder = str(small_results / "runs" / "tiny")
    searches = []
    counted = MlflowClient.search_runs
    monkeypatch.setattr(
        MlflowClient,
        "search_runs",
        lambda self, *a, **k: searches.append(a) or counted(self, *a, **k),
    )
    fast, slow = f"sqlite:///{tmp_path / 'fast.db'}", f"sqlite:///{tmp_path / 'slow.db'}"
    assert sync_main([folder, "--tracking-uri", fast]) == 0
    sweeps = len(sweep_records(_records(small_results)))
    assert searches == []  # the sweeps' summaries too find their parents in the memo
    with monkeypatch.context() as patch:
        patch.setattr(sync.Known, "made_all_runs_of", lambda self, experiment_id: False)
        assert sync_main([folder, "--tracking-uri", slow]) == 0
    assert len(searches) > 3 * sweeps
    assert _store_contents(fast) == _store_contents(slow)


def test_saved_views_open_the_key_columns_and_the_speed_quality_charts(small_results):
    from setdlm.tracking.record import experiment_facts
    from setdlm.tracking.views import (
        COMPRESSED_PREFIX,
        MAX_ENVELOPE_CHARACTERS,
        experiment_views,
        read_view_tag,
        view_tag,
        view_url,
    )

    facts = {f.task: f for f in experiment_facts(_records(small_results))}
    solve, likelihood = facts["arithmetic-solve"], facts["likelihood-arithmetic"]
    assert (solve.quality, solve.headline) == ("accuracy", "strict_match")
    assert solve.higher_is_better and solve.decoding and solve.thresholds and solve.sweeps
    assert (likelihood.quality, likelihood.higher_is_better) == ("quality", False)
    assert not likelihood.decoding
    views = {v.key: v for v in experiment_views(solve)}
    assert sorted(views) == ["setdlm-tiny-charts", "setdlm-tiny-points", "setdlm-tiny-sweeps"]
    charts, points, sweeps = (views[f"setdlm-tiny-{k}"] for k in ("charts", "points", "sweeps"))
    assert (charts.mode, points.mode, sweeps.mode) == ("CHART", "TABLE", "TABLE")
    assert "higher is better" in charts.name
    state = charts.state
    # the points only (not the sweeps' parents, not the seeds), every one of them in the charts
    assert state["searchFilter"] == (
        "tags.`setdlm.level` = 'point' and params.config_name = 'tiny'"
    )
    assert state["runsHiddenMode"] == "SHOW_ALL" and state["useGroupedValuesInCharts"] is False
    assert state["groupBy"]["groupByKeys"] == [{"mode": "param", "groupByData": "family"}]
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`accuracy`", False)
    scatters = [(c["xaxis"]["key"], c["yaxis"]["key"]) for c in state["compareRunCharts"]]
    axes = ("parallelism", "tokens_per_forward", "tokens_per_second", "tau_log10")
    assert scatters == [(x, "accuracy") for x in axes]
    first = state["compareRunSections"][0]
    assert all(c["metricSectionId"] == first["uuid"] for c in state["compareRunCharts"])
    assert first["display"] and not any(s["display"] for s in state["compareRunSections"][1:])
    columns = points.state["selectedColumns"]
    assert columns[:3] == ["params.`model`", "params.`policy`", "params.`tau`"]
    key_metrics = ("accuracy", "quality_low", "quality_high", "parallelism", "tokens_per_forward")
    assert columns[3:10] == [f"metrics.`{m}`" for m in (*key_metrics, "tokens_per_second", "nfe")]
    assert points.state["columnOrder"][1:] == columns
    assert sweeps.state["searchFilter"].startswith("tags.`setdlm.level` = 'sweep'")
    assert "metrics.`aup`" in sweeps.state["selectedColumns"]
    assert "metrics.`aup_tokens_per_forward`" in sweeps.state["selectedColumns"]
    assert sweeps.state["orderByKey"] == "metrics.`aup`" and sweeps.state["orderByAsc"] is False
    # likelihood: lower is better, a bar chart, the best (lowest) first
    nll = {v.key: v for v in experiment_views(likelihood)}["setdlm-tiny-charts"]
    assert [c["type"] for c in nll.state["compareRunCharts"]] == ["BAR"]
    assert nll.state["orderByAsc"] is True and "lower is better" in nll.name

    # The tag: the front end's envelope around the state, read back as written.
    key, value = view_tag(charts, 1000, 2000)
    assert key == "mlflow.sharedViewState.setdlm-tiny-charts"
    envelope = json.loads(value)
    assert set(envelope) == {"name", "createdAt", "updatedAt", "state"}
    assert isinstance(envelope["state"], str) and isinstance(envelope["createdAt"], int)
    assert len(value) < MAX_ENVELOPE_CHARACTERS
    assert read_view_tag(value) == (charts.name, charts.state, 1000, 2000)
    # the front end's own compressed form ("deflate;" + base64 of zlib) reads the same
    import base64
    import zlib

    packed = base64.b64encode(zlib.compress(envelope["state"].encode())).decode()
    packed = COMPRESSED_PREFIX + packed
    assert read_view_tag(json.dumps(envelope | {"state": packed}))[1] == charts.state
    assert read_view_tag(json.dumps({"name": 1, "createdAt": 0, "state": "{}"})) is None
    url = view_url("http://127.0.0.1:5000", "2", charts.key, charts.mode)
    assert url == (
        "http://127.0.0.1:5000/#/experiments/2/runs?viewStateShareKey=setdlm-tiny-charts"
        "&compareRunsMode=CHART&workflowType=machine_learning"
    )


FRONT_END = Path(sys.modules["mlflow"].__file__).parent / "server" / "js" / "build" / "static"


@pytest.mark.parametrize(
    "needle",
    [
        'U="viewStateShareKey",$="mlflow.sharedViewState."',  # the link's key, the tag's prefix
        'T="mlflow.runColor"',  # a run's colour
        # the envelope the tag holds, and how its state is read
        "JSON.stringify({name:e,createdAt:i,updatedAt:a,state:t})",
        "expected an object with a string `name`, number `createdAt`, and string `state`",
        "(0,a.ib)(e.state)?await(0,a.U1)(e.state):e.state;return JSON.parse(t)",
        'f="deflate;"',  # the compressed form's prefix
        # the search facets a view restores (a link that carries one ignores the view)
        'a=["searchFilter","orderByKey","orderByAsc","startTime","lifecycleFilter",'
        '"modelVersionFilter","datasetsFilter"]',
        # the UI state a view restores
        'a=["selectedColumns","columnOrder","columnWidths","runsExpanded","runsPinned",'
        '"runsHidden","runsVisibilityMap","runsHiddenMode","compareRunCharts",'
        '"compareRunSections","viewMaximized","runListHidden","isAccordionReordered","groupBy",'
        '"groupsExpanded","autoRefreshEnabled","useGroupedValuesInCharts","hideEmptyCharts"',
        'o="compareRunsMode"',
        'e.get("workflowType");return n===l.GENAI||n===l.MACHINE_LEARNING?n:t',
        'e.MACHINE_LEARNING="machine_learning"',
        'this.type=c.SCATTER,this.xaxis={key:"",type:"METRIC"},this.yaxis={key:"",type:"METRIC"}',
        'e.SHOWALL="SHOW_ALL"',
    ],
)
def test_the_installed_mlflow_front_end_still_reads_the_saved_views_this_way(needle):
    """views.py writes MLflow 3.17.2's (unpublished) saved-view format: a new MLflow whose
    front end no longer contains these pieces must be read again before it is pinned."""
    import mlflow

    from setdlm.tracking.views import MLFLOW_FRONT_END

    assert mlflow.__version__ == MLFLOW_FRONT_END
    bundle = "".join(path.read_text(errors="replace") for path in FRONT_END.rglob("*.js"))
    assert needle in bundle


def test_artifacts_are_stored_relative_to_the_results_folder(small_results, empty_store, capsys):
    """A copied results folder keeps its artifacts: the store names none of this machine's
    paths, and the UI resolves them against the copy's own mlartifacts/."""
    shutil.copy(empty_store, small_results / "mlflow.db")
    assert sync_main([str(small_results / "runs" / "tiny")]) == 0
    out = capsys.readouterr().out
    assert "sweep summaries: 0 created, 6 updated, 0 unchanged" in out
    first = out.split("saved views (open the first, with `setdlm ui` running):", 1)[1]
    first = first.splitlines()[1:3]
    title = "arithmetic-solve: tiny: accuracy (strict_match, higher is better) vs speed"
    assert first[0].strip() == title
    assert "viewStateShareKey=setdlm-tiny-charts&compareRunsMode=CHART" in first[1]
    client = _client(small_results)
    with contextlib.closing(__import__("sqlite3").connect(small_results / "mlflow.db")) as db:
        stored = " ".join(
            str(value)
            for table in ("experiments", "runs")
            for row in db.execute(f"SELECT * FROM {table}")
            for value in row
        )
    assert str(small_results) not in stored.replace(str(small_results / "runs"), "")
    solve = client.get_experiment_by_name("arithmetic-solve")
    assert solve.artifact_location == "mlflow-artifacts:/arithmetic-solve"
    runs = client.search_runs([solve.experiment_id], "tags.`setdlm.level` = 'point'")
    assert len(runs) == 5
    for run in runs:
        folder = Path(run.data.tags["setdlm.result_dir"])
        copy = _artifacts(small_results, run) / "metrics.json"
        assert copy.read_bytes() == (folder / "metrics.json").read_bytes()
    # the sweeps' parents, as synced
    (parent,) = client.search_runs(
        [solve.experiment_id], "tags.`setdlm.sweep` = 'tiny/arithmetic-solve/setdlm-smax8-arith'"
    )
    assert parent.data.metrics["points"] == 2.0 and parent.data.params["family"] == "setdlm"
    assert "aup" in parent.data.metrics and parent.data.tags["setdlm.level"] == "sweep"
    # the views and the quality's direction, on the experiment
    tags = solve.tags
    assert tags["setdlm.quality_direction"] == "higher is better"
    views = sorted(k for k in tags if k.startswith("mlflow.sharedViewState."))
    prefix = "mlflow.sharedViewState.setdlm-tiny-"
    assert views == [prefix + kind for kind in ("charts", "points", "sweeps")]
    # a second sync writes nothing (the views keep their creation time)
    assert sync_main([str(small_results / "runs" / "tiny")]) == 0
    out = capsys.readouterr().out
    assert "0 created, 0 updated, 8 unchanged" in out and "0 updated, 6 unchanged" in out
    assert client.get_experiment(solve.experiment_id).tags == tags
    # `setdlm ui` prints the main experiment's charts first
    assert ui_main(["--results", str(small_results), "--port", "5123", "--dry-run"]) == 0
    assert "--artifacts-destination" in capsys.readouterr().out


def test_a_copied_old_store_never_writes_into_the_folder_it_was_copied_from(tmp_path):
    """A store from before relative locations names absolute paths: a copy of it must not
    write artifacts back into the original results folder (the sync skips them and warns)."""
    from setdlm.tracking.sync import elsewhere

    here = tmp_path / "copy" / "results" / "mlartifacts"
    assert not elsewhere("mlflow-artifacts:/arithmetic-solve/1/artifacts", here)
    assert not elsewhere(f"{here.as_uri()}/arithmetic-solve/1/artifacts", here)
    assert elsewhere("file:///elsewhere/results/mlartifacts/arithmetic-solve/1/artifacts", here)
    assert elsewhere(f"{tmp_path}/results/mlartifacts/arithmetic-solve", here)


@pytest.mark.slow  # creates an MLflow store (about a second)
def test_a_run_is_written_in_as_few_batches_as_mlflow_allows_and_a_changed_param_is_named(
    tmp_path, capsys
):
    # One log_batch per run where MLflow's limits allow (issue 47: three per run took half of
    # a sync), split where they do not: 150 params need two requests of at most 100.
    from setdlm.tracking.record import RunRecord
    from setdlm.tracking.sync import sync_run

    store = resolve_store(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = open_client(store)
    batches = []
    original = client.log_batch

    def counted(run_id, metrics=(), params=(), tags=(), **kwargs):
        batches.append((len(metrics), len(params), len(tags)))
        return original(run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    client.log_batch = counted
    record = RunRecord(
        experiment="batches",
        run_name="one point",
        config_hash="c0ffee",
        params={f"p{i:03d}": str(i) for i in range(150)},
        metrics={"accuracy": 0.5, "tokens_per_second": 12.0},
        tags={"setdlm.result_dir": "runs/x/task/model/tau-1e+06"},
        artifacts=[],
        fingerprint="first",
        sweep="x/task/model",
        start_ms=None,
        end_ms=None,
    )
    run_id = sync_run(client, record, "folder", None).run_id
    assert batches == [(2, 100, 2), (0, 50, 0)]  # tags: result_dir and the sweep parent
    logged = client.get_run(run_id).data
    assert len(logged.params) == 150 and logged.metrics["accuracy"] == 0.5
    # The same configuration with one param's value changed: params are write-once, so the
    # old value stays, the run says which changed, and the sync warns.
    batches.clear()
    changed = dataclasses.replace(
        record, params={**record.params, "p007": "seven"}, fingerprint="second"
    )
    assert sync_run(client, changed, "folder", None).action == "updated"
    tags = client.get_run(run_id).data.tags
    assert client.get_run(run_id).data.params["p007"] == "7"
    assert tags[STALE_TAG] == "p007"
    assert batches == [(0, 0, 1)]
    assert "params p007 changed since they were logged" in capsys.readouterr().err
