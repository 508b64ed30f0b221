"""What one result folder looks like in MLflow: params, metrics, tags (pure data, no MLflow).

Params describe the point (they never change for a config hash): the family, the checkpoint and
its config hash, every decoding knob, the model config, the task settings, the run settings.
The decoding policy and the knobs the paper speaks in (τ, W, d, M, block size, steps) are
repeated at the top level so that ``params.W = '16'`` works in the UI's search box. Metrics are
the numbers measured: quality (every reported variant) and speed. Tags say how and where the
result was computed.
Names are flattened with dots (``decode.top_p``, ``quality.rouge1.bootstrap_95.0``).

A few key metrics are repeated under short names that are the same in every experiment
(``quality``: the task's headline quality, the y axis of its figure, with ``quality_low`` and
``quality_high`` its 95 % interval where recorded; ``accuracy`` on GSM8K and arithmetic-solve;
``tokens_per_second``, ``parallelism`` (the official parallelism factor), ``tokens_per_forward``
beside it, ``nfe``), so the runs table and a speed-quality scatter
need no search through hundreds of names. The points of one (task, model, decoding policy) sweep
share a parent run, and the run carries the evaluation's own start and end times.

For charts: ``tau_log10`` is log10 τ (the no-threshold point, τ = 1e6, is drawn at 0, i.e.
τ = 1, and marked ``no_threshold = 1``: one token per step), ``training_seed`` the seed of a
seed's run. Every run is tagged with its level (``setdlm.level``: sweep, point or seed, what the
saved views filter on) and its family's figure colour (``mlflow.runColor``). A sweep's parent
run carries the params its points share and a summary (``sweep_records``): the number of points,
the best quality and, where quality is an accuracy-like "higher is better" measure of decoded
points, the AUP of setdlm/report/aup.py.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from setdlm.eval.records import config_hash
from setdlm.families import family as family_info
from setdlm.report.aup import aup
from setdlm.results.reader import ResultPoint, quality_interval
from setdlm.tasks import TASKS
from setdlm.tracking.views import LEVEL_TAG, RUN_COLOR_TAG, ExperimentFacts

# MLflow's limits (mlflow.utils.validation): longer keys or values are refused.
MAX_KEY_LENGTH = 250
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 8000
# Bump when the mapping below changes, so finished runs are refreshed by the next sync.
MAPPING_VERSION = "6"

IDENTITY_TAG = "setdlm.config_hash"  # the run's identity: one run per config hash
SYNCED_TAG = "setdlm.synced"  # written last: the fingerprint of what the run mirrors
STALE_TAG = "setdlm.stale_params"  # params whose value changed after they were logged
SWEEP_TAG = "setdlm.sweep"  # on a sweep's parent run: <config>/<task>/<model>[ <policy>]
SUPERSEDED_TAG = "setdlm.superseded_by"  # on a run whose folder now holds another config
QUALITY_TAG = "setdlm.quality"  # which quality `quality` is, and its direction
DIRECTION_TAG = "setdlm.quality_direction"  # "higher is better" or "lower is better"
NO_THRESHOLD = 1e6  # τ = 1e6: no threshold (one token per step), schema.yaml
# Params that tell a sweep's points apart (the rest, where they agree, are the sweep's).
POINT_PARAMS = ("point", "tau", "decode.confidence_threshold")
# Short, stable names of the key metrics: (name, speed field) for speed.
KEY_SPEED = (
    ("tokens_per_second", "tokens_per_second_mean"),
    # the official parallelism factor (the paper's axis), and tokens per forward beside it
    ("parallelism", "parallelism_mean"),
    ("tokens_per_forward", "tokens_per_forward_mean"),
    ("nfe", "nfe_mean"),
)

# Extras of a quality entry that describe how it was computed, not what was measured: their
# numbers (bucket counts, seeds, pool sizes) are settings, kept in the metrics.json artifact.
_DESCRIPTIVE_EXTRAS = {
    "definition",
    "policy",
    "featurizer",
    "evaluator",
    "references",
    "seed",
    "seeds",
}
_MAX_LIST_METRICS = 32  # longer numeric lists (curves) stay in the artifact only


@dataclass(frozen=True)
class RunRecord:
    experiment: str
    run_name: str
    config_hash: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    artifacts: list[Path]
    fingerprint: str
    # <config>/<task>/<model>[ <policy>]: the points of one sweep share a parent run
    sweep: str
    start_ms: int | None  # the evaluation's own start and end (ms since the epoch)
    end_ms: int | None
    # one training seed of a point that aggregates seeds: the config hash of the point's own
    # run (the aggregate), which is this run's parent
    parent_hash: str | None = None


def run_record(point: ResultPoint) -> RunRecord:
    metrics = point.metrics
    numbers = _quality_metrics(metrics["quality"])
    speed_metrics, tags = _split(_section("speed", metrics.get("speed") or {}))
    numbers |= speed_metrics
    if isinstance(metrics.get("examples"), int | float):
        numbers["examples"] = float(metrics["examples"])
    key_metrics, headline = _key_metrics(point)
    numbers |= key_metrics | _chart_metrics(point)
    if point.throughput is not None:
        paper = {k: v for k, v in point.throughput.items() if k not in ("decode", "hardware")}
        paper_metrics, paper_tags = _split(_section("paper_throughput", paper))
        numbers |= paper_metrics
        tags |= paper_tags
    run_name = f"{point.model}/{point.point}"
    parent_hash = None
    if point.seed is not None:
        run_name += f"/seed-{point.seed}"
        aggregate = point.folder.parent / "metrics.json"
        if aggregate.is_file():
            parent_hash = json.loads(aggregate.read_text()).get("config_hash")
    # Names are not identities: this tag follows the folder if it is renamed.
    tags |= _tags(point) | {"mlflow.runName": run_name}
    tags[LEVEL_TAG] = "seed" if point.seed is not None else "point"
    if point.family is not None:
        tags[RUN_COLOR_TAG] = family_colour(point)
    if headline:
        tags |= quality_tags(point.task, headline)
    times = metrics.get("times") or {}
    return RunRecord(
        experiment=point.task,
        run_name=run_name,
        config_hash=point.config_hash,
        params=_params(point),
        metrics={_key(k): v for k, v in numbers.items()},
        tags={_key(k): _text(v, MAX_TAG_LENGTH) for k, v in tags.items()},
        artifacts=point.artifacts,
        fingerprint=_fingerprint(point),
        sweep=f"{point.config_name}/{point.task}/{_curve(point)}",
        start_ms=_milliseconds(times.get("started_at")),
        end_ms=_milliseconds(times.get("finished_at")),
        parent_hash=parent_hash,
    )


def headline_of(task: str) -> str | None:
    """The quality a task is judged by (the ``quality`` metric), None where it has none (a
    result found outside the layout, of no task of setdlm/tasks/__init__.py)."""
    info = TASKS.get(task)
    return info.headline if info else None


def is_accuracy(task: str) -> bool:
    """Whether a task's headline quality is an accuracy (also logged as ``accuracy``)."""
    info = TASKS.get(task)
    return info is not None and info.accuracy


def _key_metrics(point: ResultPoint) -> tuple[dict[str, float], str | None]:
    """The key metrics under their short names, and which quality ``quality`` is."""
    quality, speed = point.metrics.get("quality") or {}, point.metrics.get("speed") or {}
    headline = headline_of(point.task)
    numbers = {}
    entry = quality.get(headline) if headline else None
    if isinstance(entry, dict) and isinstance(entry.get("value"), int | float):
        numbers["quality"] = float(entry["value"])
        if is_accuracy(point.task):
            numbers["accuracy"] = numbers["quality"]
        interval = quality_interval(point.metrics, headline)
        if interval is not None:  # the error bar, as two metrics
            numbers["quality_low"], numbers["quality_high"] = interval
    for name, field in KEY_SPEED:
        if isinstance(speed.get(field), int | float):
            numbers[name] = float(speed[field])
    return numbers, headline if "quality" in numbers else None


def higher_is_better(task: str) -> bool:
    """Whether a larger ``quality`` is better: every headline but likelihood's NLL."""
    info = TASKS.get(task)
    return info is None or info.higher_is_better


def quality_tags(task: str, headline: str) -> dict[str, str]:
    direction = "higher is better" if higher_is_better(task) else "lower is better"
    return {
        QUALITY_TAG: f"quality = quality.{headline} ({task}); {direction}",
        DIRECTION_TAG: direction,
    }


def _chart_metrics(point: ResultPoint) -> dict[str, float]:
    """τ on a log scale (the no-threshold point at τ = 1, marked), and a seed's own seed."""
    numbers = {}
    if point.tau is not None and point.tau > 0:
        none = point.tau >= NO_THRESHOLD
        numbers["tau_log10"] = 0.0 if none else math.log10(point.tau)
        numbers["no_threshold"] = float(none)
    if point.seed is not None:
        numbers["training_seed"] = float(point.seed)
    return numbers


def family_colour(point: ResultPoint) -> str:
    """The family's colour in the figures (setdlm/families.py), as #rrggbb."""
    colour = family_info(point.family).colour(point.size)
    return _NAMED_COLOURS.get(colour, colour)


_NAMED_COLOURS = {"black": "#000000"}  # the front end takes hex colours


def _milliseconds(stamp: str | None) -> int | None:
    if not stamp:
        return None
    return int(datetime.datetime.fromisoformat(stamp).timestamp() * 1000)


def _params(point: ResultPoint) -> dict[str, str]:
    config = point.metrics["config"]
    model_config = config.get("model_config", {})
    decode = config.get("decode") or {}
    schedule = model_config.get("schedule") or {}
    values = {
        "task": point.task,
        "config_name": point.config_name,
        "model": point.model,
        "point": point.point,
        "family": model_config.get("family"),
        "checkpoint": config.get("model_source"),
        # The digest of the model config (ModelConfig.digest): a retrained checkpoint with the
        # same config shares it; checkpoint_sha256 below tells the weights apart.
        "checkpoint_config_hash": config_hash(model_config) if model_config else None,
        "seed": config.get("seed"),
        # the training seed of this run's model (a point over seeds: "all"; None: one model)
        "training_seed": point.seed if point.seed is not None else ("all" if point.seeds else None),
    }
    revision = config.get("model_revision")
    if revision:  # a Hub checkpoint: the commit loaded, and whether the revisions table pinned it
        values["checkpoint_revision"] = revision_text(revision)
    if point.checkpoint is not None:
        # A digest of every file's sha256 (weights, config, tokenizer) as `setdlm train`
        # recorded them, and for a published checkpoint where it came from.
        marker = point.checkpoint
        values["checkpoint_sha256"] = config_hash(marker.get("files") or {})
        for key in ("hub_id", "commit"):
            if marker.get(key):
                values[f"checkpoint_{key}"] = marker[key]
    # A named policy's knobs, or the flat layout of the families' own policies.
    options = decode.get("options") or decode
    knobs = {
        # The decoding policy (each its own curve); None for a result without decoding.
        "policy": _policy(decode, model_config.get("family")),
        "tau": decode.get("confidence_threshold"),
        "W": options.get("window"),
        "d": schedule.get("d"),
        "M": schedule.get("M"),
        # The decoding block (MDLM, BD3LM), else the training block (BD3LM likelihood).
        "block_size": options.get("block_size") or model_config.get("block_size"),
        "num_steps": decode.get("num_steps"),
    }
    # Knobs a family does not have are logged as "null": every run then has every column.
    values |= knobs
    values |= _section("decode", decode)
    values |= _section("model", model_config)
    # Task settings, and for results whose config is flat (likelihood) its remaining keys.
    rest = {k: v for k, v in config.items() if k not in _CONSUMED}
    values |= _section("task", (config.get("task_settings") or {}) | rest)
    values |= _section("run", point.metrics.get("run") or {})
    return {_key(k): _text(v, MAX_PARAM_LENGTH) for k, v in values.items()}


_CONSUMED = {
    "task",
    "task_settings",
    "model_config",
    "model_source",
    "model_revision",
    "decode",
    "seed",
}


def revision_text(revision: dict) -> str:
    """A Hub checkpoint's recorded revision in words: "pinned <commit>" (the revisions table
    named that commit) or "unpinned <commit>" (the branch's head when it was loaded)."""
    return f"{'pinned' if revision.get('pinned') else 'unpinned'} {revision.get('commit')}"


def _curve(point: ResultPoint) -> str:
    """The model, and the decoding policy where it is not the family's own: each its own
    sweep (parent run) and curve."""
    policy = (point.metrics["config"].get("decode") or {}).get("policy")
    return point.model if policy is None else f"{point.model} {policy}"


def _policy(decode: dict, family: str | None) -> str | None:
    """The decoding policy's name: recorded for a policy other than the family's own."""
    if not decode:
        return None
    return decode.get("policy") or family_info(family).default_policy.name


def _quality_metrics(quality: dict) -> dict[str, float]:
    numbers = {}
    for name, entry in quality.items():
        if not isinstance(entry, dict):
            numbers |= _numbers(f"quality.{name}", entry)
            continue
        numbers |= _numbers(f"quality.{name}", entry.get("value"))
        for extra, value in entry.items():
            if extra == "value" or extra in _DESCRIPTIVE_EXTRAS or extra.endswith("settings"):
                continue
            numbers |= _numbers(f"quality.{name}.{extra}", value)
    return numbers


def _numbers(prefix: str, value) -> dict[str, float]:
    """Numeric leaves of ``value`` (dicts by key, short lists by index) as metrics."""
    if isinstance(value, bool | int | float):
        return {prefix: float(value)}
    if isinstance(value, dict):
        found = {}
        for key, item in value.items():
            if key not in _DESCRIPTIVE_EXTRAS:
                found |= _numbers(f"{prefix}.{key}", item)
        return found
    if isinstance(value, list) and len(value) <= _MAX_LIST_METRICS:
        found = {}
        for index, item in enumerate(value):
            found |= _numbers(f"{prefix}.{index}", item)
        return found
    return {}


def _flatten(prefix: str, value) -> dict:
    """Nested dicts as dotted keys; lists and scalars stay whole (a list is one param)."""
    if isinstance(value, dict) and value:
        flat = {}
        for key, item in value.items():
            flat |= _flatten(f"{prefix}.{key}", item)
        return flat
    return {prefix: value}


def _section(prefix: str, values: dict) -> dict:
    """``values`` flattened under ``prefix``; nothing at all for an empty section."""
    return _flatten(prefix, values) if values else {}


def _split(flat: dict) -> tuple[dict[str, float], dict[str, str]]:
    """Numbers to metrics, everything else (a peak-memory kind, a protocol) to tags."""
    numbers = {k: float(v) for k, v in flat.items() if isinstance(v, bool | int | float)}
    return numbers, {k: v for k, v in flat.items() if k not in numbers}


def _tags(point: ResultPoint) -> dict:
    metrics = point.metrics
    versions = metrics.get("code_versions") or []
    tags = {
        IDENTITY_TAG: point.config_hash,
        "setdlm.result_dir": str(point.folder),
        "setdlm.code_versions": ",".join(versions),
    }
    if versions:
        # The tag MLflow's UI shows as the run's source commit.
        tags["mlflow.source.git.commit"] = versions[-1]
    if metrics.get("jobs"):
        # The SLURM jobs that computed the samples (more than one after a resumed attempt).
        tags["setdlm.slurm_jobs"] = ",".join(metrics["jobs"])
    if "samples_config_hash" in metrics:
        tags["setdlm.samples_config_hash"] = metrics["samples_config_hash"]
    tags |= _section("hardware", metrics.get("hardware") or {})
    return tags | _section("software", metrics.get("software") or {})


@dataclass(frozen=True)
class SweepRecord:
    """A sweep's parent run: the params its points share, its summary and its tags."""

    experiment: str
    sweep: str  # SWEEP_TAG: <config>/<task>/<model>[ <policy>]
    run_name: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]


def sweep_records(points: list[tuple[ResultPoint, RunRecord]]) -> list[SweepRecord]:
    """One per sweep of the synced points: the params every point of it shares (but what
    tells its points apart: point, τ), how many points it has, the best quality and, for a
    "higher is better" quality of decoded points in a task with a τ sweep, the AUP of
    setdlm/report/aup.py (its reference: the task's best point, as in the tables)."""
    members: dict[str, list[tuple[ResultPoint, RunRecord]]] = {}
    for point, record in points:
        if point.seed is None and record.parent_hash is None:
            members.setdefault(record.sweep, []).append((point, record))
    reference: dict[tuple[str, str], float] = {}  # (config, task) -> best quality
    swept: set[tuple[str, str]] = set()  # (config, task) with a τ sweep
    for point, record in (pair for pairs in members.values() for pair in pairs):
        task = (point.config_name, point.task)
        value = record.metrics.get("quality")
        if _finite(value):
            reference[task] = max(reference.get(task, value), value)
        if point.tau is not None:
            swept.add(task)
    sweeps = []
    for sweep, pairs in sorted(members.items()):
        first_point, first = pairs[0]
        task = (first_point.config_name, first_point.task)
        higher = higher_is_better(first.experiment)
        params = {
            key: value
            for key, value in first.params.items()
            if key not in POINT_PARAMS and all(r.params.get(key) == value for _, r in pairs)
        }
        scored = [(p, r.metrics["quality"]) for p, r in pairs if _finite(r.metrics.get("quality"))]
        metrics = {"points": float(len(pairs))}
        if scored:
            best = (max if higher else min)(value for _, value in scored)
            metrics["best_quality"] = best
            if is_accuracy(first.experiment):
                metrics["best_accuracy"] = best
        curve = [
            (r.metrics["parallelism"], r.metrics["quality"])
            for _, r in pairs
            if _finite(r.metrics.get("parallelism")) and _finite(r.metrics.get("quality"))
        ]
        if higher and curve and task in swept and task in reference:
            metrics["aup"] = aup(curve, reference[task]).value
            per_forward = [
                (r.metrics["tokens_per_forward"], r.metrics["quality"])
                for _, r in pairs
                if _finite(r.metrics.get("tokens_per_forward"))
                and _finite(r.metrics.get("quality"))
            ]
            if len(per_forward) == len(curve):  # the same area, beside the factor's
                metrics["aup_tokens_per_forward"] = aup(per_forward, reference[task]).value
        tags = {SWEEP_TAG: sweep, LEVEL_TAG: "sweep"}
        tags["setdlm.points"] = ",".join(point.point for point, _ in pairs)
        tags |= {k: v for k, v in first.tags.items() if k in _SHARED_TAGS}
        sweeps.append(
            SweepRecord(first.experiment, sweep, sweep.rsplit("/", 1)[-1], params, metrics, tags)
        )
    return sweeps


_SHARED_TAGS = (RUN_COLOR_TAG, QUALITY_TAG, DIRECTION_TAG)  # a sweep's, from its points


def experiment_facts(points: list[tuple[ResultPoint, RunRecord]]) -> list[ExperimentFacts]:
    """What the saved views of each (experiment, configuration) show (views.py)."""
    groups: dict[tuple[str, str], list[tuple[ResultPoint, RunRecord]]] = {}
    for point, record in points:
        if point.seed is None and point.config_name:
            groups.setdefault((record.experiment, point.config_name), []).append((point, record))
    facts = []
    for (experiment, config), pairs in sorted(groups.items()):
        sweeps: dict[str, int] = {}
        for _, record in pairs:
            sweeps[record.sweep] = sweeps.get(record.sweep, 0) + 1
        facts.append(
            ExperimentFacts(
                task=experiment,
                config_name=config,
                quality="accuracy" if is_accuracy(experiment) else "quality",
                headline=headline_of(experiment),
                higher_is_better=higher_is_better(experiment),
                decoding=any("parallelism" in r.metrics for _, r in pairs),
                thresholds=any("tau_log10" in r.metrics for _, r in pairs),
                sweeps=any(count > 1 for count in sweeps.values()),
            )
        )
    return facts


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _fingerprint(point: ResultPoint) -> str:
    """Changes whenever what the run mirrors changes: a run whose SYNCED_TAG differs (or is
    missing, after an interrupted sync) is brought up to date."""
    digest = hashlib.sha256(f"{MAPPING_VERSION}\0{point.folder}\0".encode())
    for name in ("metrics.json", "throughput.json"):
        path = point.folder / name
        digest.update(path.read_bytes() if path.is_file() else b"-")
    digest.update(json.dumps(point.checkpoint, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def _key(name: str) -> str:
    """A name MLflow accepts: its characters, at most 250 of them."""
    name = re.sub(r"[^\w.\- /]", "_", name)
    if len(name) <= MAX_KEY_LENGTH:
        return name
    suffix = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_KEY_LENGTH - 9]}~{suffix}"


def _text(value, limit: int) -> str:
    """Strings as they are, everything else as JSON; too long a value is cut and says so."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if len(text) <= limit:
        return text
    note = f"... [cut at {limit} characters; full value in metrics.json]"
    return text[: limit - len(note)] + note


def same_metric(logged: float, value: float) -> bool:
    """Whether MLflow already holds ``value`` (it stores NaN as a flag and infinities as the
    largest double, so compare as it stores them)."""
    if math.isnan(value) or math.isnan(logged):
        return math.isnan(value) and math.isnan(logged)
    if math.isinf(value):
        value = math.copysign(1.7976931348623157e308, value)
    return logged == value
