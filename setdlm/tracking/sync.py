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
  restored if that configuration comes back);
- after the points, each sweep's parent run is brought up to date with its summary
  (``sync_sweep``: missing params, changed metrics and tags only), and each experiment with its
  saved views (``sync_views``: experiment tags, rewritten only when a view changed);
- beside a local database an experiment's artifacts live at ``mlflow-artifacts:/<experiment>``
  (store.py), which only a server resolves: the sync writes them into the folder that location
  stands for, with MLflow's own local artifact repository.
"""

from __future__ import annotations

import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag, ViewType
from mlflow.entities.run_status import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import (
    MAX_ENTITIES_PER_BATCH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from setdlm.tracking.record import (
    DIRECTION_TAG,
    IDENTITY_TAG,
    MAX_TAG_LENGTH,
    QUALITY_TAG,
    STALE_TAG,
    SUPERSEDED_TAG,
    SWEEP_TAG,
    SYNCED_TAG,
    RunRecord,
    SweepRecord,
    quality_tags,
    same_metric,
)
from setdlm.tracking.store import PROXIED_ARTIFACTS
from setdlm.tracking.views import (
    MAX_VIEWS,
    VIEW_TAG_PREFIX,
    ExperimentFacts,
    View,
    experiment_views,
    read_view_tag,
    view_tag,
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


@dataclass
class Known:
    """What one sync has already found or written, so that it is not searched for again: the
    experiments' ids by name, the runs it synced by (experiment id, config hash), the sweeps'
    parent runs by (experiment id, sweep). Each search is a query and a transaction on a
    database store: without them (and with a point's parent tag in its batch) the default's
    sync of 270 runs into a new store took 24.8 s against 29.2 s (median of 3, alternated,
    AMD EPYC; issue 47). Valid under the writer's lock; on a server, as valid as the search
    it replaces, which another machine's sync may also race.

    ``exclusive``: no other sync writes into the store while this one holds the lock (a local
    SQLite file, whose every sync takes it). Then an experiment this sync created holds only
    runs it made and knows, and nothing in it is searched for at all: in a new store, as after
    a fresh clone's ``make run``, no run is. (A run logged by hand through a UI server on the
    same file during the sync is not looked for: with this project's tags it would be a second
    run of its configuration, which the next sync names and leaves.) The same 270 runs: 21.6 s
    against 25.2 s, measured the same way; the stores' contents equal, paths aside."""

    exclusive: bool = False
    experiments: dict[str, str] = field(default_factory=dict)
    runs: dict[tuple[str, str], str] = field(default_factory=dict)
    sweeps: dict[tuple[str, str], str] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)  # experiments this sync created

    def made_all_runs_of(self, experiment_id: str) -> bool:
        return self.exclusive and experiment_id in self.created


def sync_run(
    client,
    record: RunRecord,
    folder: str,
    artifact_root: str | None,
    artifacts_destination: Path | None = None,
    known: Known | None = None,
) -> SyncedRun:
    known = Known() if known is None else known
    experiment_id = known.experiments.get(record.experiment)
    if experiment_id is None:
        experiment_id, created = ensure_experiment(client, record.experiment, artifact_root)
        known.experiments[record.experiment] = experiment_id
        if created:
            known.created.add(experiment_id)
    if known.made_all_runs_of(experiment_id):  # its runs are those this sync made
        made = known.runs.get((experiment_id, record.config_hash))
        run = None if made is None else client.get_run(made)
    else:
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
        _complete(client, run, record, experiment_id, artifacts_destination, known)
    known.runs[experiment_id, record.config_hash] = run.info.run_id
    return SyncedRun(
        folder,
        record.experiment,
        experiment_id,
        run.info.run_id,
        record.run_name,
        record.config_hash,
        action,
    )


def ensure_experiment(client, name: str, artifact_root: str | None) -> tuple[str, bool]:
    """The experiment's id, and whether this call created it."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id, False
    # Beside a local database the artifacts go to <results>/mlartifacts, not to ./mlruns in
    # whatever folder the sync happens to run from.
    location = f"{artifact_root}/{name}" if artifact_root else None
    try:
        created = client.create_experiment(
            name, artifact_location=location, tags={"setdlm.task": name}
        )
        return created, True
    except MlflowException as error:
        # Another machine's sync to the same server created it first.
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id, False


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


def _complete(
    client,
    run,
    record: RunRecord,
    experiment_id: str,
    artifacts_destination: Path | None,
    known: Known,
) -> None:
    """Bring one run up to date with its record; every step is safe to repeat."""
    run_id = run.info.run_id
    params, stale = _new_params(run, record)
    tags = [RunTag(k, v) for k, v in record.tags.items() if run.data.tags.get(k) != v]
    if stale:
        tags.append(RunTag(STALE_TAG, ",".join(stale)[:MAX_TAG_LENGTH]))
    parent = run_parent(client, experiment_id, record, known)
    if parent is not None and run.data.tags.get(PARENT_TAG) != parent:
        tags.append(RunTag(PARENT_TAG, parent))  # in the batch: one transaction fewer
    _log_batches(client, run_id, _new_metrics(client, run, record), params, tags)
    _log_artifacts(client, run, record.artifacts, artifacts_destination)
    if run.info.status != RunStatus.to_string(RunStatus.FINISHED):
        client.set_terminated(run_id, "FINISHED", end_time=record.end_ms)
    if not known.made_all_runs_of(experiment_id):  # else no run of another configuration
        supersede_others(client, experiment_id, record, run_id)
    client.set_tag(run_id, SYNCED_TAG, record.fingerprint)  # last: the run is now complete


def _log_artifacts(client, run, paths: list[Path], destination: Path | None) -> None:
    """Same path, same name: a replay overwrites the copy, it does not add one. A run under
    mlflow-artifacts:/ beside a local database gets them in the folder that URI stands for
    (MLflow's client resolves that scheme through a server only)."""
    uri = run.info.artifact_uri or ""
    if destination is not None and elsewhere(uri, destination):
        return  # a path of another results folder (an old store, copied): never written to
    if destination is not None and uri.startswith(PROXIED_ARTIFACTS):
        from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

        relative = urllib.parse.urlparse(uri).path.lstrip("/")
        if ".." in Path(relative).parts:
            raise ValueError(f"run {run.info.run_id}: artifact location {uri} leaves {destination}")
        repository = LocalArtifactRepository(str(destination / relative))
        for path in paths:
            repository.log_artifact(str(path))
        return
    for path in paths:
        client.log_artifact(run.info.run_id, str(path))


def elsewhere(location: str, destination: Path) -> bool:
    """Whether a local store's artifact location is a path outside its results folder's
    mlartifacts/: a store made before locations were relative, then copied or moved."""
    if not location.startswith("file:") and not location.startswith("/"):
        return False
    path = Path(urllib.parse.urlparse(location).path).resolve()
    return not path.is_relative_to(destination.resolve())


def run_parent(client, experiment_id: str, record: RunRecord, known: Known) -> str | None:
    """A point's parent is its sweep's run; one training seed's is its point's run (the
    aggregate over the seeds, synced before it: its folder sorts first, so this sync knows it).
    None while that run does not exist yet. A seed synced then stays un-nested until its own
    files change: its fingerprint does not cover its parent, so a replay leaves it unchanged
    (a known gap, older than the memo)."""
    if record.parent_hash is None:
        return sweep_parent(client, experiment_id, record.sweep, known)
    synced = known.runs.get((experiment_id, record.parent_hash))
    if synced is not None or known.made_all_runs_of(experiment_id):
        return synced
    point = find_run(client, experiment_id, record.parent_hash)
    return None if point is None else point.info.run_id


def sweep_parent(client, experiment_id: str, sweep: str, known: Known) -> str:
    """The parent run of a (task, model, policy) sweep, created the first time one of its
    points is; named after its model (and policy)."""
    existing = _existing_sweep_parent(client, experiment_id, sweep, known)
    return existing or _new_sweep_parent(client, experiment_id, sweep, known)


def _existing_sweep_parent(client, experiment_id: str, sweep: str, known: Known) -> str | None:
    """The sweep's parent run if it exists: this sync's, else the store's (searched for
    unless every run of the experiment is this sync's)."""
    parent_id = known.sweeps.get((experiment_id, sweep))
    if parent_id is None and not known.made_all_runs_of(experiment_id):
        runs = runs_tagged(client, experiment_id, SWEEP_TAG, sweep)
        if runs:
            parent_id = known.sweeps[experiment_id, sweep] = runs[0].info.run_id
    return parent_id


def _new_sweep_parent(client, experiment_id: str, sweep: str, known: Known) -> str:
    model = sweep.rsplit("/", 1)[-1]  # named after its model (and policy)
    parent = client.create_run(experiment_id, run_name=model, tags={SWEEP_TAG: sweep})
    parent_id = parent.info.run_id
    client.set_terminated(parent_id, "FINISHED")
    known.sweeps[experiment_id, sweep] = parent_id
    return parent_id


def sync_sweep(client, record: SweepRecord, known: Known | None = None) -> str:
    """Bring a sweep's parent run up to date with its summary: "created", "updated" or
    "unchanged". Its params are write-once like a point's: one that changed is reported."""
    known = Known() if known is None else known
    experiment_id = known.experiments.get(record.experiment)
    if experiment_id is None:
        experiment_id = client.get_experiment_by_name(record.experiment).experiment_id
    existing = _existing_sweep_parent(client, experiment_id, record.sweep, known)
    action = "updated" if existing else "created"
    run = client.get_run(existing or _new_sweep_parent(client, experiment_id, record.sweep, known))
    run_id, logged = run.info.run_id, run.data
    finished = RunStatus.to_string(RunStatus.FINISHED)
    if run.info.status != finished:  # a sync killed between its creation and its end
        client.set_terminated(run_id, finished)
        action = "updated"
    params = [Param(k, v) for k, v in record.params.items() if k not in logged.params]
    stale = sorted(k for k, v in record.params.items() if logged.params.get(k, v) != v)
    metrics = [
        _next_metric(client, run_id, key, value, logged.metrics)
        for key, value in record.metrics.items()
        if key not in logged.metrics or not same_metric(logged.metrics[key], value)
    ]
    tags = [RunTag(k, v) for k, v in record.tags.items() if logged.tags.get(k) != v]
    if stale and logged.tags.get(STALE_TAG) != ",".join(stale)[:MAX_TAG_LENGTH]:
        _warn(
            f"sweep run {run_id} ({record.run_name}): params {', '.join(stale)} of its points "
            "changed since they were logged; MLflow params are write-once, the points' runs "
            f"hold the new values (listed in the run's tag {STALE_TAG})"
        )
        tags.append(RunTag(STALE_TAG, ",".join(stale)[:MAX_TAG_LENGTH]))
    _log_batches(client, run_id, metrics=metrics, params=params, tags=tags)
    if action == "updated" and not (params or metrics or tags) and run.info.status == finished:
        action = "unchanged"
    return action


def _next_metric(client, run_id: str, key: str, value: float, latest: dict) -> Metric:
    """The metric to log: step 0 when new, else one past the history's last step."""
    timestamp = int(time.time() * 1000)
    if key not in latest:
        return Metric(key, value, timestamp, 0)
    step = max(m.step for m in client.get_metric_history(run_id, key)) + 1
    return Metric(key, value, timestamp, step)


def sync_views(client, facts: ExperimentFacts) -> tuple[str, list[View]]:
    """Save an experiment's views (views.py) as its tags, with its quality's name and
    direction; a view is rewritten only when its name or state changed (its creation time is
    kept). Returns the experiment's id and its views."""
    experiment = client.get_experiment_by_name(facts.task)
    tags = experiment.tags
    views = experiment_views(facts)
    now = int(time.time() * 1000)
    ours = {VIEW_TAG_PREFIX + view.key for view in views}
    others = [k for k in tags if k.startswith(VIEW_TAG_PREFIX) and k not in ours]
    if len(others) + len(views) > MAX_VIEWS:
        _warn(
            f"experiment {facts.task}: {len(others)} other saved views; MLflow's UI lists at "
            f"most {MAX_VIEWS}"
        )
    for view in views:
        key = VIEW_TAG_PREFIX + view.key
        saved = read_view_tag(tags[key]) if key in tags else None
        if saved is not None and saved[:2] == (view.name, view.state):
            continue
        created = saved[2] if saved is not None else now
        client.set_experiment_tag(experiment.experiment_id, *view_tag(view, created, now))
    if facts.headline:
        wanted = quality_tags(facts.task, facts.headline)
        for key in (QUALITY_TAG, DIRECTION_TAG):
            if tags.get(key) != wanted[key]:
                client.set_experiment_tag(experiment.experiment_id, key, wanted[key])
    return experiment.experiment_id, views


def supersede_others(client, experiment_id: str, record: RunRecord, run_id: str) -> None:
    """Runs of the same result folder with another configuration: that folder now holds this
    one's results, so they are tagged and moved out of the default view (soft-deleted)."""
    folder = record.tags["setdlm.result_dir"]
    for other in runs_tagged(client, experiment_id, "setdlm.result_dir", folder):
        if other.data.tags.get(IDENTITY_TAG) in (None, record.config_hash):
            continue
        client.set_tag(other.info.run_id, SUPERSEDED_TAG, run_id)
        client.delete_run(other.info.run_id)


def _new_params(run, record: RunRecord) -> tuple[list[Param], list[str]]:
    """The params the run lacks, and those it holds with another value (reported: MLflow's
    params are write-once; the caller lists them in a tag)."""
    logged = run.data.params
    missing = [Param(k, v) for k, v in record.params.items() if k not in logged]
    stale = sorted(k for k, v in record.params.items() if k in logged and logged[k] != v)
    if stale:
        _warn(
            f"run {run.info.run_id} ({record.run_name}): params {', '.join(stale)} changed "
            "since they were logged; MLflow params are write-once, metrics.json holds the new "
            "values (listed in the run's tag setdlm.stale_params)"
        )
    return missing, stale


def _new_metrics(client, run, record: RunRecord) -> list[Metric]:
    run_id = run.info.run_id
    latest = run.data.metrics
    return [
        _next_metric(client, run_id, key, value, latest)
        for key, value in record.metrics.items()
        if key not in latest or not same_metric(latest[key], value)
    ]


def _log_batches(client, run_id: str, metrics=(), params=(), tags=()) -> None:
    """``log_batch`` within MLflow's per-request limits, in as few requests as they allow: on
    a database store each is a transaction of its own (3 per run took half of a sync)."""
    metrics, params, tags = list(metrics), list(params), list(tags)
    while metrics or params or tags:
        some_params = params[:MAX_PARAMS_TAGS_PER_BATCH]
        some_tags = tags[:MAX_PARAMS_TAGS_PER_BATCH]
        room = MAX_ENTITIES_PER_BATCH - len(some_params) - len(some_tags)
        some_metrics = metrics[: min(MAX_METRICS_PER_BATCH, room)]
        client.log_batch(run_id, metrics=some_metrics, params=some_params, tags=some_tags)
        metrics, params = metrics[len(some_metrics) :], params[len(some_params) :]
        tags = tags[len(some_tags) :]


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
