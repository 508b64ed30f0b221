"""The one reader of result folders, for the report, the regression check and the MLflow sync.

A result is finished when its folder holds ``metrics.json``: the evaluations write it
atomically and only once every example is present, so a folder without it is a run still in
progress (or killed).

Inside the layout (``setdlm/results/layout.py``), ``read_point`` checks the folder names
against what ``metrics.json`` says the folder holds (task, family and size, policy, τ): a
misfiled result would otherwise land silently in the wrong row of a committed table. The sync
also mirrors result folders found outside the layout (``checked=False``): their names are then
only labels, and what a point is comes from its metrics.json alone.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from setdlm.eval.records import BATCH_1, speed_protocol
from setdlm.families import FAMILY_NAMES, MODEL_NAME_HELP, config_size, parse_model_name
from setdlm.families import family as family_info
from setdlm.results.layout import (
    ARTIFACTS_FOLDER,
    MODELS_FOLDER,
    NOT_RESULT_FOLDERS,
    POINT_NAME,
    RESULT_FILES,
    RUNS_FOLDER,
    TRAINED_MARKER,
)
from setdlm.results.validate import MetricsError, check_aggregate, check_metrics, code_versions
from setdlm.tasks import LIKELIHOOD_PREFIX, TASK_NAMES, TASKS

RESULTS_DIR_ENV = "SETDLM_RESULTS_DIR"


class ResultError(MetricsError):
    """A result file that cannot be read, or a folder that contradicts its metrics.json."""


class NotAResult(ResultError):
    """A ``metrics.json`` that is not an evaluation's (a training summary, say)."""


@dataclass(frozen=True)
class ResultPoint:
    """One finished speed-quality point: its folder and its parsed ``metrics.json``."""

    folder: Path
    config_name: str  # the run folder's name; "" outside the layout
    task: str  # folder name: gsm8k, infill-1, likelihood-wikitext2, ...
    model: str  # folder name: ar, bd3lm-s4, setdlm-smax8, ...
    point: str  # folder name: default, tau-0.9, dual-cache-tau-0.9, ...
    family: str | None  # None: metrics.json names none (outside the layout only)
    size: int | None  # BD3LM S or SetDLM smax M; None for AR and MDLM
    tau: float | None  # the decoding's confidence threshold; None where it does not apply
    policy: str | None  # the decoding policy; None: the family's own (or no decoding)
    metrics: dict = field(repr=False, compare=False)
    # throughput.json: the paper's separate batch-1 protocol, when the point ran it
    throughput: dict | None = field(default=None, repr=False, compare=False)
    # what `setdlm train` (or the fetch) recorded about the checkpoint, when found
    checkpoint: dict | None = field(default=None, repr=False, compare=False)
    # one training seed's result inside a point that aggregates seeds (<point>/seed-<k>/)
    seed: int | None = None
    # the code that computed it: its samples' code versions (an aggregate's: its seeds')
    code_versions: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.task}/{self.model}/{self.point}"

    @property
    def config(self) -> dict:
        return self.metrics.get("config", {})

    @property
    def seeds(self) -> list[dict]:
        """Per training seed (an aggregate over seeds, setdlm/eval/seeds.py): each seed's
        number, folder and values; empty for a point of one model."""
        return list(self.metrics.get("seeds") or [])

    @property
    def config_hash(self) -> str:
        return self.metrics["config_hash"]

    @property
    def artifacts(self) -> list[Path]:
        return [self.folder / name for name in RESULT_FILES if (self.folder / name).is_file()]

    @property
    def curve(self) -> str:
        """The speed-quality curve the point is on: its model, and its policy where that is
        not the family's own (one curve per model and policy)."""
        return self.model if self.policy is None else f"{self.model} {self.policy}"

    @property
    def policy_name(self) -> str | None:
        """The decoding policy's name, the family's own included (None: no decoding)."""
        if "decode" not in self.config:
            return None
        return self.policy or family_info(self.family).default_policy.name

    def seed_pairs(self, speed: str, quality: str) -> dict[int, tuple[float, float]]:
        """seed -> (speed ``speed``, quality ``quality``) of each training seed that recorded
        both as numbers; empty for a point of one model."""
        pairs = {}
        for entry in self.seeds:
            x = (entry.get("speed") or {}).get(speed)
            y = (entry.get("quality") or {}).get(quality)
            if is_number(x) and is_number(y):
                pairs[entry["seed"]] = (float(x), float(y))
        return pairs

    def quality(self, name: str) -> float | None:
        entry = self.metrics.get("quality", {}).get(name)
        return None if entry is None else entry.get("value")

    def interval(self, name: str) -> tuple[float, float] | None:
        return quality_interval(self.metrics, name)

    def published_checkpoint(self):
        """The published model (setdlm/checkpoints/zoo.py) this point decoded, or None: a
        model folder, trained here or elsewhere."""
        from setdlm.checkpoints.zoo import resolve, split_source

        source = self.config.get("model_source")
        # a Hub checkpoint's source carries the commit its files were (key@commit)
        return resolve(split_source(source)[0]) if source else None

    def speed(self, name: str) -> float | None:
        return self.metrics.get("speed", {}).get(name)

    def batch1_speed(self) -> tuple[float, float | None] | None:
        """Mean (and std) per-example tok/s under the paper's batch-1 protocol: the run's own
        when it decoded at batch 1, else its separate paper-protocol timing (throughput.json),
        else None: a batched run's per-example tok/s are under load, not the paper's number."""
        if speed_protocol_of(self.metrics).startswith(BATCH_1):
            mean = self.speed("tokens_per_second_mean")
            return None if mean is None else (mean, self.speed("tokens_per_second_std"))
        if self.throughput and self.throughput.get("tokens_per_second_mean") is not None:
            paper = self.throughput
            return paper["tokens_per_second_mean"], paper.get("tokens_per_second_std")
        return None

    def sort_key(self) -> tuple:
        # τ from large to small: the sweep goes from one token per step to the fastest point.
        return (
            self.task,
            FAMILY_NAMES.index(self.family) if self.family in FAMILY_NAMES else len(FAMILY_NAMES),
            self.size or 0,
            self.model,
            (self.policy is not None, self.policy or ""),  # the family's own policy first
            -(self.tau if self.tau is not None else math.inf),
            self.point,
        )


# ------------------------------------------------------------------------------ reading
def read_point(folder: Path, checked: bool = True) -> ResultPoint:
    """The finished result in ``folder``. ``checked``: the folder is in the layout, and its
    names must agree with its metrics.json (a ResultError names the first that does not)."""
    folder = Path(folder).absolute()
    metrics = read_json(folder / "metrics.json", "an evaluation's metrics")
    required = ("config_hash", "config", "quality") if not checked else ("quality",)
    for key in required:
        if key not in metrics:
            raise NotAResult(f"{folder / 'metrics.json'}: no {key!r} key, not an evaluation result")
    if not isinstance(metrics["quality"], dict):
        raise NotAResult(
            f"{folder / 'metrics.json'}: not an evaluation's metrics (expected a 'quality' "
            "object, as `setdlm eval` writes)"
        )
    check_metrics(folder / "metrics.json", metrics, ResultError)  # setdlm/results/validate.py
    seed = seed_of(folder)
    versions = code_versions(metrics)
    if metrics.get("seeds") and seed is None:  # an aggregate: only as good as its seeds
        read = lambda path: read_json(path, "a seed's result")  # noqa: E731
        versions = check_aggregate(folder, metrics, read, ResultError)
    if checked:  # <run>/<task>/<model>/<point>
        config_name, task, model, point = folder.parts[-4:]
    elif seed is not None:  # <run>/<task>/<model>/<point>/seed-<k>: one seed of a point
        config_name, task, model, point = _place(folder.parent, metrics)
    else:
        config_name, task, model, point = _place(folder, metrics)
    config = metrics.get("config") or {}
    model_config = config.get("model_config") or {}
    family = model_config.get("family")
    decode = config.get("decode")
    policy = None if decode is None else decode.get("policy")  # only another policy's
    threshold = None if decode is None else decode.get("confidence_threshold")
    tau = None if threshold is None else float(threshold)
    if checked:
        path = folder / "metrics.json"
        _check_task(path, task, metrics)
        _check_model(path, model, family, model_config)
        _check_point(path, point, family, tau, policy)
    if family is not None and tau is not None and family_info(family).left_to_right:
        tau = None  # one token per forward whatever τ is: not a setting of the point
    info = family_info(family) if family is not None else None
    size = config_size(info, model_config) if info is not None else None
    throughput_path = folder / "throughput.json"
    throughput = read_json(throughput_path) if throughput_path.is_file() else None
    source = str(config.get("model_source") or "")
    place = folder.parent if seed is not None else folder
    models = place.parents[2] / MODELS_FOLDER / model if config_name else None
    if models is not None and seed is not None:
        models = models / folder.name
    return ResultPoint(
        folder,
        config_name,
        task,
        model,
        point,
        family,
        size,
        tau,
        policy,
        metrics,
        throughput,
        checkpoint_marker(source, models),
        seed,
        tuple(versions),
    )


def seed_of(folder: Path) -> int | None:
    """The training seed of a ``seed-<k>`` result folder inside a point, else None."""
    name = folder.name
    if name.startswith("seed-") and name[5:].isdigit():
        return int(name[5:])
    return None


def incomplete_samples(metrics_path: Path, metrics: dict) -> str | None:
    """Why a result's samples no longer back its metrics (lost, cut short, torn or written
    twice), or None. An evaluation run again keeps every complete sample."""
    from setdlm.eval.records import SampleLog
    from setdlm.util.files import sha256_file

    expected = metrics.get("examples")
    samples = metrics_path.parent / "samples.jsonl"
    if not isinstance(expected, int) or "seeds" in metrics:
        # a result kind that does not count its examples, or an aggregate over seeds (each
        # seed's own result is checked)
        return None
    if not samples.is_file():
        return f"{samples.name} is missing"
    # The log byte for byte as its metrics were computed from it: complete, each id once (the
    # scan below parses every line, seconds for a run's thousands of samples at each start).
    if metrics.get("samples_sha256") == sha256_file(samples):
        return None
    records, _, dropped = SampleLog(samples).scan()
    if dropped:
        return f"{samples.name} has torn or repeated lines"
    if len(records) != expected:
        return f"{samples.name} holds {len(records)} of its {expected} examples"
    return None


def point_sample_problems(point: ResultPoint) -> list[str]:
    """``incomplete_samples`` of a point, or of each of its seeds' results for an aggregate
    over seeds, each naming its samples file."""
    folders = [point.folder / str(entry.get("folder")) for entry in point.seeds]
    problems = []
    for folder in folders or [point.folder]:
        path = folder / "metrics.json"
        metrics = point.metrics if folder == point.folder else read_json(path, "a seed's result")
        problem = incomplete_samples(path, metrics)
        if problem is not None:
            problems.append(f"{folder / 'samples.jsonl'}: {problem.split(' ', 1)[1]}")
    return problems


def read_json(path: Path, what: str = "") -> dict:
    """A JSON object from ``path``; ``what`` it should be, for the message when it is not."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not even UTF-8 text
        raise ResultError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(value, dict):
        said = f"not {what} (" if what else "("
        raise ResultError(f"{path}: {said}expected a JSON object, got {type(value).__name__})")
    return value


@dataclass(frozen=True)
class Results:
    """The finished points of one run, checked against the layout (``load_results``)."""

    run_dir: Path
    points: tuple[ResultPoint, ...]  # sorted by task, family, size, policy, τ
    unfinished: tuple[str, ...]  # point keys whose folder has no metrics.json yet

    @property
    def name(self) -> str:
        """The run's name (its configuration's): the folder name, never a machine's path."""
        return self.run_dir.resolve().name

    def for_task(self, task: str) -> list[ResultPoint]:
        return [p for p in self.points if p.task == task]

    def tasks(self) -> list[str]:
        return sorted({p.task for p in self.points})


def load_results(run_dir: str | Path) -> Results:
    """Every point of the run ``<results>/runs/<name>/``, each checked against the layout."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ResultError(
            f"{run_dir}: is a file; expected a results folder (results/runs/<config name>)"
        )
    if not run_dir.is_dir():
        raise FileNotFoundError(f"results folder {run_dir} does not exist")
    points, unfinished = [], []
    for folder in sorted(run_dir.glob("*/*/*")):
        if not folder.is_dir() or any(part.startswith(".") for part in folder.parts[-3:]):
            continue  # files, and hidden folders (editors, temporary copies)
        if folder.relative_to(run_dir).parts[0] in NOT_RESULT_FOLDERS:
            continue
        if not (folder / "metrics.json").exists():
            unfinished.append(folder.relative_to(run_dir).as_posix())
            continue
        points.append(read_point(folder))
    points.sort(key=ResultPoint.sort_key)
    return Results(run_dir, tuple(points), tuple(unfinished))


@dataclass
class Scan:
    finished: list[ResultPoint] = field(default_factory=list)
    unfinished: list[Path] = field(default_factory=list)  # no metrics.json yet
    ignored: list[str] = field(default_factory=list)  # "folder: why" for other metrics.json


def find_results(results_dir: Path) -> Scan:
    """Every result folder under ``results_dir``, in or outside the layout, sorted by folder
    (the MLflow sync). A results root is searched in its ``runs`` folder only, so the artifact
    copies under ``mlartifacts`` are never taken for results."""
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
            scan.finished.append(read_point(folder, checked=False))
        except NotAResult as reason:
            scan.ignored.append(str(reason))
    return scan


def _result_folders(search: Path):
    for folder, subfolders, files in os.walk(search):
        # Hidden folders and artifact copies are not results.
        subfolders[:] = [s for s in subfolders if not s.startswith(".") and s != ARTIFACTS_FOLDER]
        if {"metrics.json", "samples.jsonl", "run.json"} & set(files):
            yield Path(folder)


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


def _place(folder: Path, metrics: dict) -> tuple[str, str, str, str]:
    """(config name, task, model, point) from the layout, or from metrics.json outside it."""
    for runs in folder.parents:
        if runs.name == RUNS_FOLDER:
            parts = folder.relative_to(runs).parts
            if len(parts) == 4:
                return parts  # type: ignore[return-value]
            break
    config = metrics.get("config") or {}
    family = (config.get("model_config") or {}).get("family", folder.parent.name)
    return "", layout_task(metrics), family, folder.name


def layout_task(metrics: dict) -> str:
    """The layout's task name for a result found outside the layout (the experiment name)."""
    config = metrics.get("config") or {}
    task = metrics.get("task") or config.get("task", "unknown")
    if task == "likelihood":
        return f"{LIKELIHOOD_PREFIX}{config.get('data', 'unknown')}"
    return task.removeprefix("rocstories-")


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
            return read_json(path)
    if models is not None and models.is_dir():
        from setdlm.checkpoints.zoo import split_source

        # a published checkpoint's source is its key, with the commit its files were
        key, commit = split_source(model_source)
        for path in sorted(models.glob("checkpoint-*.json")):
            marker = read_json(path)
            if marker.get("key") == key and commit in (None, marker.get("commit")):
                return marker
    return None


# ------------------------------------------------------------------- folder names, checked
def _check_task(path: Path, task: str, metrics: dict) -> None:
    recorded = metrics.get("task")
    info = TASKS.get(task)  # the task table (setdlm/tasks/__init__.py)
    if info is None:
        raise ResultError(
            f"{path}: task folder {task!r} is not one of {', '.join(TASK_NAMES)} "
            "(setdlm/tasks/__init__.py)"
        )
    if info.data is not None:
        data = metrics.get("config", {}).get("data")
        if (recorded, data) != (info.field, info.data):
            raise ResultError(f"{path}: folder {task!r} holds task {recorded!r} on data {data!r}")
        return
    if recorded != info.field:
        raise ResultError(f"{path}: folder {task!r} holds task {recorded!r}")


def _check_model(path: Path, model: str, family: str | None, model_config: dict) -> None:
    parsed = parse_model_name(model)
    if parsed is None:
        raise ResultError(
            f"{path}: model folder {model!r} is not {MODEL_NAME_HELP} "
            "(each optionally followed by -<tag>)"
        )
    named, size = parsed
    if family != named:
        raise ResultError(f"{path}: folder {model!r} holds a {family!r} model")
    info = family_info(named)
    if info.size is not None and config_size(info, model_config) != size:
        raise ResultError(
            f"{path}: folder {model!r} holds a {info.title} with {info.size.symbol} = "
            f"{config_size(info, model_config)}"
        )


def _check_point(
    path: Path, point: str, family: str, tau: float | None, policy: str | None
) -> None:
    match = POINT_NAME.match(point)
    if not match:
        raise ResultError(
            f"{path}: point folder {point!r} is not 'default', 'tau-<τ>' or '<policy>-tau-<τ>'"
        )
    if tau is None:  # likelihood: no decoding
        return
    if match["policy"] != policy:
        said = f"policy {match['policy']!r}" if match["policy"] else "the family's own policy"
        raise ResultError(
            f"{path}: folder {point!r} says {said}, but the run decoded with "
            f"{policy or family_info(family).default_policy.name!r}"
        )
    if match["tau"] is not None:
        try:
            named = float(match["tau"])
        except ValueError:
            raise ResultError(f"{path}: point folder {point!r}: τ is not a number") from None
        if not math.isclose(named, tau, rel_tol=1e-9):
            raise ResultError(f"{path}: folder {point!r} holds a run at τ = {tau:g}")


# ------------------------------------------------------------------------ metrics helpers
def quality_interval(metrics: dict, name: str) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of quality ``name`` in a metrics.json (None where none was
    recorded)."""
    entry = metrics.get("quality", {}).get(name) or {}
    interval = entry.get("bootstrap_95")
    if isinstance(interval, list) and len(interval) == 2 and all(map(is_number, interval)):
        return float(interval[0]), float(interval[1])
    return None


def is_number(value) -> bool:
    """A JSON number (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def speed_protocol_of(metrics: dict) -> str:
    """How a result's speed was timed (results from before the protocol was recorded: from
    the batch size their run used)."""
    protocol = (metrics.get("speed") or {}).get("protocol")
    if protocol is None:
        protocol = speed_protocol([{"batch_size": (metrics.get("run") or {}).get("batch_size", 1)}])
    return protocol
