"""Mirror finished results into MLflow: one experiment per task, one run per point.

The files are the source of truth; a sync only ever brings MLflow up to date with them, so it
can be replayed at any time. MLflow's own rules shape how:

- run names are not unique, so a run is found by its ``setdlm.config_hash`` tag, which
  ``create_run`` writes in the same call as the run itself;
- metrics are append-only, so a metric is logged only when the run's latest value differs from
  the file's (a replay writes nothing; a re-measured value is appended at the next step);
- params are write-once, so only missing ones are logged (a changed one is reported);
- a killed sync leaves its run RUNNING and without the ``setdlm.synced`` tag, which is written
  last; the next sync finds the run by its config hash and completes it;
- a run's start time is set when it is created, so it is the evaluation's own (from
  metrics.json), and so is its end; the points of one (task, model) sweep are children of one
  parent run (``mlflow.parentRunId``), so the UI folds a τ sweep into one row;
- when a folder's configuration changes, its new run supersedes the old one: the old run is
  tagged ``setdlm.superseded_by`` and soft-deleted (out of the default view, restorable, and
  restored if that configuration comes back).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from mlflow.entities import Metric, Param, RunTag, ViewType
from mlflow.entities.run_status import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

from setdlm.tracking.record import (
    IDENTITY_TAG,
    MAX_TAG_LENGTH,
    STALE_TAG,
    SUPERSEDED_TAG,
    SWEEP_TAG,
    SYNCED_TAG,
    RunRecord,
    same_metric,
)

PARENT_TAG = "mlflow.parentRunId"  # how the MLflow UI nests child runs


@dataclass(frozen=True)
class SyncedRun:
    folder: str
    experiment: str
    experiment_id: str
    run_id: str
    run_name: str
    config_hash: str
    action: str  # "created", "updated" or "unchanged"


def sync_run(client, record: RunRecord, folder: str, artifact_root: str | None) -> SyncedRun:
    experiment_id = ensure_experiment(client, record.experiment, artifact_root)
    run = find_run(client, experiment_id, record.config_hash)
    if run is None:
        run = client.create_run(
            experiment_id,
            start_time=record.start_ms,
            run_name=record.run_name,
            tags={IDENTITY_TAG: record.config_hash},
        )
        action = "created"
    elif run.info.lifecycle_stage == "deleted":  # superseded once; this config is back
        client.restore_run(run.info.run_id)
        client.delete_tag(run.info.run_id, SUPERSEDED_TAG)
        run = client.get_run(run.info.run_id)
        action = "updated"
    elif _is_synced(run, record):
        action = "unchanged"
    else:
        action = "updated"
    if action != "unchanged":
        _complete(client, run, record, experiment_id)
    return SyncedRun(
        folder,
        record.experiment,
        experiment_id,
        run.info.run_id,
        record.run_name,
        record.config_hash,
        action,
    )


def ensure_experiment(client, name: str, artifact_root: str | None) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    # Beside a local database the artifacts go to <results>/mlartifacts, not to ./mlruns in
    # whatever folder the sync happens to run from.
    location = f"{artifact_root}/{name}" if artifact_root else None
    try:
        return client.create_experiment(
            name, artifact_location=location, tags={"setdlm.task": name}
        )
    except MlflowException as error:
        # Another machine's sync to the same server created it first.
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def find_run(client, experiment_id: str, config_hash: str):
    """The run of a config hash (the oldest one if an earlier tool made several), or None."""
    runs = runs_tagged(client, experiment_id, IDENTITY_TAG, config_hash, ViewType.ALL)
    active = [run for run in runs if run.info.lifecycle_stage == "active"]
    runs = active or runs  # a deleted (superseded) run only when no active one exists
    if len(runs) > 1:
        others = ", ".join(run.info.run_id for run in runs[1:])
        _warn(f"config hash {config_hash} has {len(runs)} runs; keeping the oldest ({others} not)")
    return runs[0] if runs else None


def runs_tagged(client, experiment_id: str, tag: str, value: str, view=ViewType.ACTIVE_ONLY):
    """The runs of an experiment whose ``tag`` is ``value``, oldest first."""
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{tag}` = '{value}'",
        run_view_type=view,
        order_by=["attributes.start_time ASC"],
        max_results=1000,
    )


def _is_synced(run, record: RunRecord) -> bool:
    return (
        run.info.status == RunStatus.to_string(RunStatus.FINISHED)
        and run.data.tags.get(SYNCED_TAG) == record.fingerprint
    )


def _complete(client, run, record: RunRecord, experiment_id: str) -> None:
    """Bring one run up to date with its record; every step is safe to repeat."""
    run_id = run.info.run_id
    _log_params(client, run, record)
    _log_metrics(client, run, record)
    tags = {k: v for k, v in record.tags.items() if run.data.tags.get(k) != v}
    _log_batches(client, run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    for path in record.artifacts:
        # Same path, same name: a replay overwrites the copy, it does not add one.
        client.log_artifact(run_id, str(path))
    if run.info.status != RunStatus.to_string(RunStatus.FINISHED):
        client.set_terminated(run_id, "FINISHED", end_time=record.end_ms)
    parent = run_parent(client, experiment_id, record)
    if parent is not None and run.data.tags.get(PARENT_TAG) != parent:
        client.set_tag(run_id, PARENT_TAG, parent)
    supersede_others(client, experiment_id, record, run_id)
    client.set_tag(run_id, SYNCED_TAG, record.fingerprint)  # last: the run is now complete


def run_parent(client, experiment_id: str, record: RunRecord) -> str | None:
    """A point's parent is its sweep's run; one training seed's is its point's run (the
    aggregate over the seeds, synced before it: its folder sorts first). None while that run
    does not exist yet (the next sync nests it)."""
    if record.parent_hash is None:
        return sweep_parent(client, experiment_id, record.sweep)
    point = find_run(client, experiment_id, record.parent_hash)
    return None if point is None else point.info.run_id


def sweep_parent(client, experiment_id: str, sweep: str) -> str:
    """The parent run of a (task, model, policy) sweep, created the first time one of its
    points is; named after its model (and policy)."""
    runs = runs_tagged(client, experiment_id, SWEEP_TAG, sweep)
    if runs:
        return runs[0].info.run_id
    model = sweep.rsplit("/", 1)[-1]
    parent = client.create_run(experiment_id, run_name=model, tags={SWEEP_TAG: sweep})
    client.set_terminated(parent.info.run_id, "FINISHED")
    return parent.info.run_id


def supersede_others(client, experiment_id: str, record: RunRecord, run_id: str) -> None:
    """Runs of the same result folder with another configuration: that folder now holds this
    one's results, so they are tagged and moved out of the default view (soft-deleted)."""
    folder = record.tags["setdlm.result_dir"]
    for other in runs_tagged(client, experiment_id, "setdlm.result_dir", folder):
        if other.data.tags.get(IDENTITY_TAG) in (None, record.config_hash):
            continue
        client.set_tag(other.info.run_id, SUPERSEDED_TAG, run_id)
        client.delete_run(other.info.run_id)


def _log_params(client, run, record: RunRecord) -> None:
    logged = run.data.params
    missing = [Param(k, v) for k, v in record.params.items() if k not in logged]
    stale = sorted(k for k, v in record.params.items() if k in logged and logged[k] != v)
    _log_batches(client, run.info.run_id, params=missing)
    if stale:
        _warn(
            f"run {run.info.run_id} ({record.run_name}): params {', '.join(stale)} changed "
            "since they were logged; MLflow params are write-once, metrics.json holds the new "
            "values (listed in the run's tag setdlm.stale_params)"
        )
        client.set_tag(run.info.run_id, STALE_TAG, ",".join(stale)[:MAX_TAG_LENGTH])


def _log_metrics(client, run, record: RunRecord) -> None:
    run_id = run.info.run_id
    latest = run.data.metrics
    timestamp = int(time.time() * 1000)
    metrics = []
    for key, value in record.metrics.items():
        if key not in latest:
            metrics.append(Metric(key, value, timestamp, 0))
        elif not same_metric(latest[key], value):
            step = max(m.step for m in client.get_metric_history(run_id, key)) + 1
            metrics.append(Metric(key, value, timestamp, step))
    _log_batches(client, run_id, metrics=metrics)


def _log_batches(client, run_id: str, metrics=(), params=(), tags=()) -> None:
    """``log_batch`` within MLflow's per-request limits."""
    metrics, params, tags = list(metrics), list(params), list(tags)
    for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])
    for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=params[start : start + MAX_PARAMS_TAGS_PER_BATCH])
    for start in range(0, len(tags), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, tags=tags[start : start + MAX_PARAMS_TAGS_PER_BATCH])


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
