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
``tokens_per_second``, ``parallelism``, ``nfe``), so the runs table and a speed-quality scatter
need no search through hundreds of names. The points of one (task, model, decoding policy) sweep
share a parent run, and the run carries the evaluation's own start and end times.
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
from setdlm.results.layout import HEADLINE_QUALITY, LIKELIHOOD_HEADLINE, LIKELIHOOD_PREFIX
from setdlm.results.reader import ResultPoint, quality_interval

# MLflow's limits (mlflow.utils.validation): longer keys or values are refused.
MAX_KEY_LENGTH = 250
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 8000
# Bump when the mapping below changes, so finished runs are refreshed by the next sync.
MAPPING_VERSION = "4"

IDENTITY_TAG = "setdlm.config_hash"  # the run's identity: one run per config hash
SYNCED_TAG = "setdlm.synced"  # written last: the fingerprint of what the run mirrors
STALE_TAG = "setdlm.stale_params"  # params whose value changed after they were logged
SWEEP_TAG = "setdlm.sweep"  # on a sweep's parent run: <config>/<task>/<model>[ <policy>]
SUPERSEDED_TAG = "setdlm.superseded_by"  # on a run whose folder now holds another config
# Short, stable names of the key metrics: (name, speed field) for speed.
KEY_SPEED = (
    ("tokens_per_second", "tokens_per_second_mean"),
    ("parallelism", "parallelism_mean"),
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
    numbers |= key_metrics
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
    if headline:
        tags["setdlm.quality"] = f"quality = quality.{headline} ({point.task})"
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


# Tasks whose headline quality is an accuracy (also logged as ``accuracy``).
ACCURACY_TASKS = ("gsm8k", "arithmetic-solve")


def _key_metrics(point: ResultPoint) -> tuple[dict[str, float], str | None]:
    """The key metrics under their short names, and which quality ``quality`` is."""
    quality, speed = point.metrics.get("quality") or {}, point.metrics.get("speed") or {}
    headline = HEADLINE_QUALITY.get(point.task)
    if point.task.startswith(LIKELIHOOD_PREFIX):
        headline = LIKELIHOOD_HEADLINE
    numbers = {}
    entry = quality.get(headline) if headline else None
    if isinstance(entry, dict) and isinstance(entry.get("value"), int | float):
        numbers["quality"] = float(entry["value"])
        if point.task in ACCURACY_TASKS:
            numbers["accuracy"] = numbers["quality"]
        interval = quality_interval(point.metrics, headline)
        if interval is not None:  # the error bar, as two metrics
            numbers["quality_low"], numbers["quality_high"] = interval
    for name, field in KEY_SPEED:
        if isinstance(speed.get(field), int | float):
            numbers[name] = float(speed[field])
    return numbers, headline if "quality" in numbers else None


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


_CONSUMED = {"task", "task_settings", "model_config", "model_source", "decode", "seed"}


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
