"""Finished result folders, read from disk (no MLflow here).

The results layout is a shared contract::

    results/runs/<config name>/<task>/<model name>/<point>/{samples.jsonl, metrics.json, run.json}
    results/mlflow.db          the default tracking store (SQLite)
    results/mlartifacts/       its artifacts

A result is finished when its folder holds ``metrics.json``: the evaluations write it atomically
and only once every example is present, so a folder without it is a run still in progress (or
killed) and is left for a later sync.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from setdlm.errors import UserError

RUNS_FOLDER = "runs"
ARTIFACTS_FOLDER = "mlartifacts"
MODELS_FOLDER = "models"  # runs/<config>/models/<model>/: trained or fetched checkpoints
TRAINED_MARKER = "checkpoint.json"
RESULTS_DIR_ENV = "SETDLM_RESULTS_DIR"
# Files of a result folder mirrored as artifacts, when present.
ARTIFACT_FILES = ("samples.jsonl", "metrics.json", "run.json", "throughput.json")


@dataclass(frozen=True)
class ResultPoint:
    """One finished speed-quality point: a result folder and its parsed ``metrics.json``."""

    folder: Path  # absolute
    config_name: str  # "" when the folder is not inside the layout
    task: str  # the experiment it belongs to
    model: str
    point: str
    metrics: dict
    throughput: dict | None  # the paper's separate throughput protocol, when it was run
    checkpoint: dict | None  # what `setdlm train` recorded about the checkpoint, when found

    @property
    def config_hash(self) -> str:
        return self.metrics["config_hash"]

    @property
    def artifacts(self) -> list[Path]:
        return [self.folder / name for name in ARTIFACT_FILES if (self.folder / name).is_file()]


class ResultError(UserError, ValueError):
    """A result file cannot be read."""


class NotAResult(ResultError):
    """A ``metrics.json`` that is not an evaluation's (a training summary, say)."""


def results_root(results_dir: Path) -> Path:
    """The ``results`` folder that holds the default store, by this rule:

    1. the parent of the nearest ``runs`` folder at or above RESULTS_DIR, or RESULTS_DIR
       itself when it holds a ``runs`` folder (the layout says where the store is);
    2. else ``$SETDLM_RESULTS_DIR``;
    3. else RESULTS_DIR itself.
    """
    results_dir = results_dir.resolve()
    for folder in (results_dir, *results_dir.parents):
        if folder.name == RUNS_FOLDER:
            return folder.parent
    if (results_dir / RUNS_FOLDER).is_dir():
        return results_dir
    if os.environ.get(RESULTS_DIR_ENV):
        return Path(os.environ[RESULTS_DIR_ENV]).expanduser().resolve()
    return results_dir


@dataclass
class Scan:
    finished: list[ResultPoint] = field(default_factory=list)
    unfinished: list[Path] = field(default_factory=list)  # no metrics.json yet
    ignored: list[str] = field(default_factory=list)  # "folder: why" for other metrics.json


def find_results(results_dir: Path) -> Scan:
    """The result folders under ``results_dir``, sorted by folder.

    A results root is searched in its ``runs`` folder only, so the artifact copies under
    ``mlartifacts`` are never taken for results.
    """
    results_dir = results_dir.resolve()
    if not results_dir.is_dir():
        raise ResultError(f"{results_dir} is not a folder")
    search = results_dir / RUNS_FOLDER if (results_dir / RUNS_FOLDER).is_dir() else results_dir
    scan = Scan()
    for folder in sorted(_result_folders(search)):
        if not (folder / "metrics.json").is_file():
            scan.unfinished.append(folder)
            continue
        try:
            scan.finished.append(read_result(folder))
        except NotAResult as reason:
            scan.ignored.append(str(reason))
    return scan


def _result_folders(search: Path):
    for folder, subfolders, files in os.walk(search):
        # Hidden folders and artifact copies are not results.
        subfolders[:] = [s for s in subfolders if not s.startswith(".") and s != ARTIFACTS_FOLDER]
        if {"metrics.json", "samples.jsonl", "run.json"} & set(files):
            yield Path(folder)


def read_result(folder: Path) -> ResultPoint:
    folder = folder.resolve()
    metrics = _read_json(folder / "metrics.json")
    for key in ("config_hash", "config", "quality"):
        if key not in metrics:
            raise NotAResult(f"{folder / 'metrics.json'}: no {key!r} key, not an evaluation result")
    throughput_path = folder / "throughput.json"
    throughput = _read_json(throughput_path) if throughput_path.is_file() else None
    config_name, task, model, point = _place(folder, metrics)
    source = str(metrics["config"].get("model_source") or "")
    models = folder.parents[2] / MODELS_FOLDER / model if config_name else None
    checkpoint = checkpoint_marker(source, models)
    return ResultPoint(folder, config_name, task, model, point, metrics, throughput, checkpoint)


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not even UTF-8 text
        raise ResultError(f"{path}: cannot be read as JSON ({error})") from error
    if not isinstance(value, dict):
        raise ResultError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _place(folder: Path, metrics: dict) -> tuple[str, str, str, str]:
    """(config name, task, model, point) from the layout, or from metrics.json outside it."""
    for runs in folder.parents:
        if runs.name == RUNS_FOLDER:
            parts = folder.relative_to(runs).parts
            if len(parts) == 4:
                return parts  # type: ignore[return-value]
            break
    config = metrics["config"]
    family = config.get("model_config", {}).get("family", folder.parent.name)
    return "", layout_task(metrics), family, folder.name


def checkpoint_marker(model_source: str, models: Path | None) -> dict | None:
    """The marker ``setdlm train`` wrote beside the checkpoint a result was computed with, which
    lists every file's sha256 (metrics.json itself records no weights hash): ``checkpoint.json``
    in a trained model folder, or the ``checkpoint-<domain>.json`` of a fetched published one
    whose key is the model source. Looked for at the source, and at ``models``, the layout's
    ``<config>/models/<model>`` folder (the source may be relative to another folder).
    """
    source = Path(model_source) if model_source else None
    trained = []
    if source is not None and source.is_dir():
        trained.append(source / TRAINED_MARKER)
    if models is not None and source is not None and source.parts[-2:] == models.parts[-2:]:
        trained.append(models / TRAINED_MARKER)
    for path in trained:
        if path.is_file():
            return _read_json(path)
    if models is not None and models.is_dir():
        for path in sorted(models.glob("checkpoint-*.json")):
            marker = _read_json(path)
            if marker.get("key") == model_source:
                return marker
    return None


def layout_task(metrics: dict) -> str:
    """The layout's task name for a result found outside the layout (the experiment name)."""
    task = metrics.get("task") or metrics["config"].get("task", "unknown")
    if task == "likelihood":
        return f"likelihood-{metrics['config'].get('data', 'unknown')}"
    return task.removeprefix("rocstories-")
