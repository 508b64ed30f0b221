"""What a result's ``metrics.json`` must hold before anything reads a number from it.

Every reader of results (the tables, the figures, ``setdlm check`` and the MLflow sync) goes
through ``setdlm/results/reader.py``, which calls ``check_metrics`` on each file and
``check_aggregate`` on each point that aggregates training seeds. A value that breaks a rule
here is refused with a ``ResultError`` naming the file, the key, what was found and what was
expected: a table would otherwise print a quality of 1.7 as 170.00 %, an inverted interval, a
null, or a stale mean over seeds whose results changed since.

The rules are those of the files ``setdlm eval`` and ``setdlm aggregate`` write:

- ``quality``: an object of metrics, each a number or an object with a numeric ``value``
  (finite: NaN is a failed measurement, null a missing one); its ``bootstrap_95``, when
  present, two finite numbers, the lower first; a fraction shown in % in the tables (an
  accuracy, a ROUGE F1: ``Quality.scale`` 100 in setdlm/tasks/__init__.py) lies in [0, 1];
  a count (``count``, the paper tables' whole-number columns) is not negative;
- ``examples``: a whole number >= 0;
- ``speed``: an object, required where the run decoded (``config.decode``): every number in
  it finite and not negative;
- ``seeds`` (an aggregate): a list of objects each naming its ``seed``, ``folder`` and
  ``config_hash``.

An aggregate over seeds is only as good as its parts: ``check_aggregate`` compares what it
recorded of each seed with that seed's result as it is now (missing, emptied, recomputed with
other values or another configuration or code version, a seed added since).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from setdlm.util.errors import UserError

SEED_PREFIX = "seed-"  # setdlm/eval/seeds.py's (importing it would load numpy for readers)


class MetricsError(UserError, ValueError):
    """A metrics.json whose values break the rules above; a ResultError subclasses it too."""


@functools.cache
def fraction_metrics() -> frozenset[str]:
    """Quality names the tables show as a percentage (scale 100): fractions in [0, 1]."""
    from setdlm.tasks import PAPER_TABLES, table_columns

    return frozenset(
        quality.name
        for table in PAPER_TABLES
        for quality in table_columns(table)
        if quality.scale == 100.0
    )


@functools.cache
def count_metrics() -> frozenset[str]:
    """Quality names the tables show as whole numbers (skipped, rejected, tokens): >= 0."""
    from setdlm.tasks import PAPER_TABLES, table_columns

    return frozenset(
        quality.name
        for table in PAPER_TABLES
        for quality in table_columns(table)
        if quality.digits == 0 and quality.scale == 1.0
    )


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return repr(value) if isinstance(value, str) else f"{value}"


def check_metrics(path: Path, metrics: dict, error=MetricsError) -> None:
    """Raise ``error`` naming ``path`` and the first key of ``metrics`` that breaks a rule."""
    problem = metrics_problem(metrics)
    if problem is not None:
        raise error(f"{path}: {problem}")


def metrics_problem(metrics: dict) -> str | None:
    """The first rule ``metrics`` breaks, as "<key> is <found>; expected <what>", or None."""
    quality = metrics.get("quality")
    if not isinstance(quality, dict):
        return f"quality is {_shown(quality)}; expected an object of quality metrics"
    for name, entry in quality.items():
        problem = _quality_problem(f"quality.{name}", name, entry)
        if problem is not None:
            return problem
    examples = metrics.get("examples")
    if "examples" in metrics and not (
        isinstance(examples, int) and not isinstance(examples, bool) and examples >= 0
    ):
        return f"examples is {_shown(examples)}; expected a whole number >= 0"
    speed = metrics.get("speed")
    decoded = isinstance(metrics.get("config"), dict) and metrics["config"].get("decode")
    if speed is None and decoded:
        return "speed is missing; expected the speed of the decoding run (an object)"
    if speed is not None:
        if not isinstance(speed, dict):
            return f"speed is {_shown(speed)}; expected an object"
        for key, value in speed.items():
            if _number(value) and not (math.isfinite(value) and value >= 0):
                return f"speed.{key} is {_shown(value)}; expected a finite number >= 0"
    if "seeds" in metrics:
        return _seeds_problem(metrics["seeds"])
    return None


def _quality_problem(key: str, name: str, entry) -> str | None:
    if isinstance(entry, dict):
        if "value" not in entry:
            return f"{key} has no 'value'; expected {{'value': number, ...}}"
        value = entry["value"]
        where = f"{key}.value"
    else:
        value, where = entry, key
    if not _number(value):
        return f"{where} is {_shown(value)}; expected a number"
    if math.isnan(value):
        # the words the second sweep's readers used: the evaluation failed to measure it
        return (
            f"{where} is NaN; expected a number (the evaluation failed to measure it: fix the "
            "cause, then remove the folder to rerun it)"
        )
    if not math.isfinite(value):
        return f"{where} is {_shown(value)}; expected a finite number"
    fraction = name in fraction_metrics()
    if fraction and not 0.0 <= value <= 1.0:
        shown = _shown(value)
        return f"{where} is {shown}; expected a fraction in [0, 1] (the tables show it in %)"
    if name in count_metrics() and value < 0:
        return f"{where} is {_shown(value)}; expected a count >= 0"
    if not isinstance(entry, dict):
        return None
    count = entry.get("count")
    if "count" in entry and not (_number(count) and math.isfinite(count) and count >= 0):
        return f"{key}.count is {_shown(count)}; expected a count >= 0"
    if "bootstrap_95" in entry:
        return _interval_problem(f"{key}.bootstrap_95", entry["bootstrap_95"], fraction)
    return None


def _interval_problem(key: str, interval, fraction: bool) -> str | None:
    if interval is None:
        return None  # recorded where no interval could be computed (one example)
    if not (isinstance(interval, list) and len(interval) == 2):
        return f"{key} is {_shown(interval)}; expected [low, high]"
    for bound in interval:
        if not _number(bound):
            return f"{key} is {interval}; expected two numbers [low, high]"
        if math.isnan(bound):
            return (
                f"{key} is NaN; expected a number (the evaluation failed to measure it: fix "
                "the cause, then remove the folder to rerun it)"
            )
        if not math.isfinite(bound):
            return f"{key} is {interval}; expected finite bounds"
        if fraction and not 0.0 <= bound <= 1.0:
            return f"{key} is {interval}; expected bounds in [0, 1] (a fraction)"
    low, high = interval
    if low > high + 1e-12:
        return f"{key} is {interval}: its lower bound exceeds its upper; expected [low, high]"
    return None


def _seeds_problem(seeds) -> str | None:
    if not isinstance(seeds, list) or not seeds:
        return f"seeds is {_shown(seeds)}; expected a list of the aggregated seeds"
    for index, entry in enumerate(seeds):
        if not isinstance(entry, dict):
            return f"seeds[{index}] is {_shown(entry)}; expected an object"
        seed = entry.get("seed")
        if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
            return f"seeds[{index}].seed is {_shown(seed)}; expected a whole number >= 0"
        folder = entry.get("folder")
        if folder != f"{SEED_PREFIX}{seed}":
            return f"seeds[{index}].folder is {_shown(folder)}; expected '{SEED_PREFIX}{seed}'"
        found = entry.get("config_hash")
        if not isinstance(found, str):
            return f"seeds[{index}].config_hash is {_shown(found)}; expected text"
    return None


# --------------------------------------------------------------------------- aggregates
def check_aggregate(folder: Path, metrics: dict, read, error=MetricsError) -> list[str]:
    """The code versions behind an aggregate over seeds in ``folder`` (its seeds'), after
    checking that each seed's result is still the one the aggregate was built from; ``read``
    reads a seed's metrics.json (raising for an unreadable one). Raise ``error`` naming the
    aggregate, the seed and the difference otherwise."""
    path = folder / "metrics.json"
    advice = (
        f"rebuild it with `setdlm aggregate {folder}` (the workflow does so itself), or "
        "rerun the seed"
    )
    versions: set[str] = set()
    recorded = {entry["folder"]: entry for entry in metrics["seeds"]}
    for name, entry in recorded.items():
        seed_path = folder / name / "metrics.json"
        if not seed_path.is_file():
            raise error(
                f"{path}: aggregates {name}, but {seed_path} is missing: the aggregate is "
                f"stale; {advice}"
            )
        seed = read(seed_path)
        check_metrics(seed_path, seed, error)
        problem = _seed_difference(entry, seed)
        if problem is not None:
            raise error(f"{path}: stale aggregate over seeds: {seed_path} {problem}; {advice}")
        versions.update(_versions(seed))
    extra = sorted(
        child.name
        for child in folder.glob(f"{SEED_PREFIX}*")
        if child.name not in recorded
        and child.name.removeprefix(SEED_PREFIX).isdigit()
        and (child / "metrics.json").is_file()
    )
    if extra:
        raise error(
            f"{path}: stale aggregate over seeds: {folder / extra[0]} holds a result the "
            f"aggregate leaves out; {advice}"
        )
    return sorted(versions)


def _seed_difference(entry: dict, seed: dict) -> str | None:
    """How a seed's result differs from what the aggregate recorded of it, or None."""
    if seed.get("config_hash") != entry["config_hash"]:
        return (
            f"has config_hash {_shown(seed.get('config_hash'))}, the aggregate recorded "
            f"{entry['config_hash']!r} (recomputed with another configuration)"
        )
    if "code_versions" in entry and sorted(_versions(seed)) != sorted(entry["code_versions"]):
        return (
            f"was computed by code {', '.join(_versions(seed)) or 'unknown'}, the aggregate "
            f"recorded {', '.join(entry['code_versions']) or 'unknown'}"
        )
    quality = seed.get("quality") if isinstance(seed.get("quality"), dict) else {}
    for name, value in (entry.get("quality") or {}).items():
        now = quality.get(name)
        now = now.get("value") if isinstance(now, dict) else now
        if not _same(now, value):
            return f"has quality.{name} {_shown(now)}, the aggregate recorded {_shown(value)}"
    # a seed evaluated again since (the same quality, other timings): the means are stale
    speed = seed.get("speed") if isinstance(seed.get("speed"), dict) else {}
    for name, value in (entry.get("speed") or {}).items():
        if not _same(speed.get(name), value):
            return (
                f"has speed.{name} {_shown(speed.get(name))}, the aggregate recorded "
                f"{_shown(value)} (evaluated again since)"
            )
    return None


def _same(now, recorded) -> bool:
    if _number(now) and _number(recorded):
        both_nan = math.isnan(now) and math.isnan(recorded)
        return both_nan or math.isclose(now, recorded, rel_tol=1e-9, abs_tol=1e-12)
    return now == recorded


def _versions(metrics: dict) -> list[str]:
    versions = metrics.get("code_versions")
    return [str(v) for v in versions] if isinstance(versions, list) else []


def code_versions(metrics: dict) -> list[str]:
    """The code versions a result records (its samples' ``code_version``s), or those of an
    aggregate's seeds."""
    return sorted(set(_versions(metrics)))
