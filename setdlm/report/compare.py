"""``setdlm compare``: do two runs of one configuration hold the same results?

    setdlm compare results/runs/tiny results/slurm/results/runs/tiny

Deterministic CPU runs of the same configuration and code (the same machine kind and thread
counts, the same relative paths: run them from two working directories) must agree exactly
wherever they ran: on a laptop, through the local executor, or as SLURM jobs. This checks that
they hold the same result points with the same configuration hashes, that every sample line
agrees field by field once what describes the run rather than the result is set aside
(timings, batch size, code version, scheduler job), that the quality metrics and the counted
speed metrics `setdlm check` holds (NFE, tokens, timed and warm-up examples, ...) agree, and
that the trained models have the same files (sha256 of the files on disk, each also checked
against its run's record). It prints one line per difference and exits 1 on any; timed speed
is never compared.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from setdlm.data.jsonl import read_jsonl
from setdlm.report.check import EXACT_SPEED
from setdlm.results.layout import MODELS_FOLDER as MODELS
from setdlm.results.layout import TRAINED_MARKER
from setdlm.util.errors import ArgumentParser
from setdlm.util.files import sha256_file

# Sample fields that describe how a run went, not what it computed.
RUN_FIELDS = frozenset(
    {"seconds", "latency_seconds", "batch_size", "batching", "code_version", "job_id"}
)


def result_folders(run: Path) -> dict[str, Path]:
    """``task/model/point`` -> folder, for every finished result under ``run``, and
    ``task/model/point/seed-<k>`` for each seed of a point over training seeds."""
    found = [*run.glob("*/*/*/metrics.json"), *run.glob("*/*/*/seed-*/metrics.json")]
    return {
        metrics.parent.relative_to(run).as_posix(): metrics.parent
        for metrics in sorted(found)
        if metrics.parent.relative_to(run).parts[0] != MODELS
    }


def without_run_fields(value):
    if isinstance(value, dict):
        return {k: without_run_fields(v) for k, v in value.items() if k not in RUN_FIELDS}
    if isinstance(value, list):
        return [without_run_fields(v) for v in value]
    return value


def _samples(folder: Path) -> dict:
    rows = read_jsonl(folder / "samples.jsonl")  # a bad line is named by file and line
    return {row["id"]: without_run_fields(row) for _, row in rows}


def compare_points(name: str, left: Path, right: Path) -> list[str]:
    differences = []
    left_metrics = json.loads((left / "metrics.json").read_text())
    right_metrics = json.loads((right / "metrics.json").read_text())
    for section in ("config_hash", "examples", "quality"):
        if left_metrics.get(section) != right_metrics.get(section):
            differences.append(
                f"{name}: metrics.json {section} differs: {left_metrics.get(section)} vs "
                f"{right_metrics.get(section)}"
            )
    for metric in EXACT_SPEED:  # what `setdlm check` holds exactly on the same numerics
        left_value = left_metrics.get("speed", {}).get(metric)
        right_value = right_metrics.get("speed", {}).get(metric)
        if left_value != right_value:
            differences.append(
                f"{name}: metrics.json speed.{metric} differs: {left_value} vs {right_value}"
            )
    if "seeds" in left_metrics or "seeds" in right_metrics:
        return differences  # an aggregate over seeds: its seeds' samples are compared each
    left_samples, right_samples = _samples(left), _samples(right)
    if left_samples.keys() != right_samples.keys():
        only = sorted(set(left_samples) ^ set(right_samples), key=str)
        differences.append(f"{name}: the samples differ in their ids, e.g. {only[:3]}")
    for example in sorted(left_samples.keys() & right_samples.keys(), key=str):
        a, b = left_samples[example], right_samples[example]
        if a != b:
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            differences.append(f"{name}: sample {example!r} differs in {fields}")
    return differences


def compare_models(left: Path, right: Path) -> list[str]:
    """The trained models' files, hashed as they are on disk (a marker records what was
    written; a file corrupted or truncated since then must not pass as identical)."""
    differences = []
    found = [
        *(left / MODELS).glob(f"*/{TRAINED_MARKER}"),
        *(left / MODELS).glob(f"*/seed-*/{TRAINED_MARKER}"),
    ]
    markers = {path.parent.relative_to(left / MODELS).as_posix(): path for path in sorted(found)}
    for model, path in markers.items():
        other = right / MODELS / model / TRAINED_MARKER
        if not other.is_file():
            differences.append(f"models/{model}: trained in {left} only")
            continue
        hashes = []
        for marker in (path, other):
            recorded = json.loads(marker.read_text())["files"]
            actual = _file_hashes(marker.parent, recorded)
            damaged = sorted(f for f in recorded if actual.get(f) != recorded[f])
            if damaged:
                differences.append(
                    f"models/{model}: {marker.parent}: {damaged} no longer match the sha256 in "
                    f"{marker.name} (corrupted, truncated or replaced)"
                )
            hashes.append(actual)
        changed = sorted(
            f
            for f in hashes[0].keys() | hashes[1].keys()
            if hashes[0].get(f) != hashes[1].get(f)
            and not (f in TRAINING_LOGS and _same_log(path.parent / f, other.parent / f))
        )
        if changed:
            differences.append(f"models/{model}: files differ: {changed}")
    return differences


# A model folder's records of how its training went: the same training logs the same values,
# but at other times (a resumed training too), so they are compared without their timings.
TRAINING_LOGS = ("losses.jsonl", "learning_curve.jsonl")
TIMING_FIELDS = frozenset({"seconds", "probe_seconds"})


def _same_log(left: Path, right: Path) -> bool:
    def values(path: Path) -> list[dict]:
        return [
            {k: v for k, v in row.items() if k not in TIMING_FIELDS} for _, row in read_jsonl(path)
        ]

    return left.is_file() and right.is_file() and values(left) == values(right)


def _file_hashes(folder: Path, recorded: dict) -> dict[str, str | None]:
    return {
        name: sha256_file(folder / name) if (folder / name).is_file() else None for name in recorded
    }


def compare_runs(left: Path, right: Path) -> tuple[int, list[str]]:
    """(points compared, differences)."""
    left_points, right_points = result_folders(left), result_folders(right)
    differences = [
        f"{name}: only in {left if name in left_points else right}"
        for name in sorted(left_points.keys() ^ right_points.keys())
    ]
    for name in sorted(left_points.keys() & right_points.keys()):
        differences += compare_points(name, left_points[name], right_points[name])
    differences += compare_models(left, right)
    return len(left_points.keys() & right_points.keys()), differences


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="setdlm compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("left", type=Path, help="a run folder (<results>/runs/<name>)")
    parser.add_argument("right", type=Path, help="another run folder of the same configuration")
    args = parser.parse_args(argv)
    for run in (args.left, args.right):
        if not run.is_dir():
            parser.error(f"{run}: not a folder")
    compared, differences = compare_runs(args.left, args.right)
    for difference in differences:
        print(difference)
    if not compared:
        print(f"no result point is in both {args.left} and {args.right}", file=sys.stderr)
        return 1
    verdict = f"{len(differences)} difference(s)" if differences else "identical results"
    print(f"{compared} result points compared: {verdict}")
    return 1 if differences else 0
