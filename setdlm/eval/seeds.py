"""One point over several training seeds: the aggregate the tables, figures, check and MLflow
read, and the two-level bootstrap behind its interval.

A model trained once per seed (a workflow model with ``train.seeds``) is evaluated once per
seed, each result in ``<point>/seed-<k>/``. ``aggregate(point)`` writes ``<point>/metrics.json``:

- each quality metric's ``value`` is the mean over the seeds of the per-seed means;
- its ``bootstrap_95`` is a two-level bootstrap: resample the seeds (with replacement), then
  the examples within each resampled seed (with replacement), and take the mean of the means;
  so the interval holds both the training-seed spread and the example spread. Metrics with no
  per-example value (a corpus-level score such as MAUVE) resample the seeds only, and say so;
- ``seeds`` lists every seed with its own values (quality and counted speed);
- counted speed (NFE, parallelism, tokens) is the mean over the seeds; timed speed too, with
  the per-seed values beside it.

The same resampling pairs two points (``paired_difference``): the same seed indices and the
same example indices for both, so that a difference's interval is that of a paired comparison
(same seeds, same problems).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from setdlm.eval.records import SampleLog
from setdlm.results.validate import check_metrics, code_versions
from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_json

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95
SEED_PREFIX = "seed-"
INTERVAL_TWO_LEVEL = "two-level bootstrap: seeds, then examples within each seed"
INTERVAL_SEEDS_ONLY = "bootstrap over seeds (no per-example values)"
INTERVAL_ONE_SEED = "bootstrap over examples of one trained model: ignores seed variance"


class SeedError(UserError, ValueError):
    """Seed results that cannot be aggregated (missing, of different configurations)."""


def seed_folders(point: Path) -> list[Path]:
    """The ``seed-<k>`` folders of a point, by seed."""
    found = [f for f in point.glob(f"{SEED_PREFIX}*") if f.is_dir() and _seed_of(f) is not None]
    return sorted(found, key=_seed_of)


def _seed_of(folder: Path) -> int | None:
    text = folder.name.removeprefix(SEED_PREFIX)
    return int(text) if text.isdigit() else None


def per_example_scores(folder: Path, names) -> dict[str, np.ndarray]:
    """{metric: (N,) per-example values} from a result's samples.jsonl, in example-id order,
    for those of ``names`` that every record scores (a corpus-level metric has none)."""
    records = SampleLog(folder / "samples.jsonl").scan()[0]
    ordered = [records[key] for key in sorted(records)]
    scored = [r.get("scores") if isinstance(r.get("scores"), dict) else {} for r in ordered]
    return {
        name: np.asarray([float(s[name]) for s in scored], dtype=np.float64)
        for name in names
        if ordered and all(_number(s.get(name)) for s in scored)
    }


def two_level_resamples(
    columns: list[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """(R,) means of resampled seeds of resampled examples: ``columns[s]`` holds seed s's
    per-example values. The same ``seed`` draws the same indices for columns of equal shape,
    which is what pairs two points."""
    rng = np.random.default_rng(seed)
    seeds = len(columns)
    picked_seeds = rng.integers(0, seeds, size=(resamples, seeds))  # (R, S)
    sizes = {len(column) for column in columns}
    if len(sizes) == 1:  # the usual case: every seed decoded the same examples
        count = sizes.pop()
        picks = rng.integers(0, count, size=(resamples, seeds, count))  # (R, S, N)
        stacked = np.stack(columns)  # (S, N)
        values = stacked[picked_seeds[..., None], picks]  # (R, S, N)
        return values.mean(axis=2).mean(axis=1)
    means = np.empty(resamples)
    for r in range(resamples):
        chosen = [columns[s] for s in picked_seeds[r]]
        means[r] = np.mean([c[rng.integers(0, len(c), size=len(c))].mean() for c in chosen])
    return means


def seed_resamples(values: list[float], resamples: int = RESAMPLES, seed: int = SEED):
    """(R,) means of resampled seeds (with replacement)."""
    rng = np.random.default_rng(seed)
    array = np.asarray(values, dtype=np.float64)
    return array[rng.integers(0, len(array), size=(resamples, len(array)))].mean(axis=1)


def interval(resampled: np.ndarray) -> list[float]:
    low, high = np.percentile(resampled, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return [float(low), float(high)]


def aggregate(point: str | Path) -> dict:
    """Write ``point/metrics.json``, the aggregate of ``point/seed-<k>/metrics.json``."""
    point = Path(point)
    folders = seed_folders(point)
    if not folders:
        raise SeedError(f"{point}: no seed-<k> folders with results to aggregate")
    runs = []
    for folder in folders:
        path = folder / "metrics.json"
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise SeedError(f"{path}: cannot read it ({error})") from None
        if not isinstance(run, dict):
            raise SeedError(f"{path}: expected a JSON object, got {type(run).__name__}")
        check_metrics(path, run, SeedError)  # what the readers would refuse, refused here
        runs.append(run)
    _check_same_point(point, folders, runs)
    first = runs[0]
    seeds = [_seed_of(folder) for folder in folders]
    quality = {}
    names = list(first["quality"])
    columns = [per_example_scores(folder, names) for folder in folders]
    for name in names:
        quality[name] = _aggregate_metric(name, runs, columns)
    speed = _mean_speed([run.get("speed") or {} for run in runs])
    metrics = {
        **{key: first[key] for key in ("task", "examples") if key in first},
        "quality": quality,
        "speed": speed,
        "config": first["config"],  # seed 0's: its model_source names that seed's model
        "config_hash": _joint_hash([run["config_hash"] for run in runs]),
        # the code behind every seed (a table says when its rows mix versions)
        "code_versions": sorted({v for run in runs for v in code_versions(run)}),
        "seeds": [
            {
                "seed": seed,
                "folder": folder.name,
                "config_hash": run["config_hash"],
                # what the readers compare with the seed's result as it is then
                "code_versions": code_versions(run),
                "quality": {n: (run["quality"][n] or {}).get("value") for n in names},
                "speed": {k: v for k, v in (run.get("speed") or {}).items() if _number(v)},
            }
            for seed, folder, run in zip(seeds, folders, runs, strict=True)
        ],
        "interval": {"resamples": RESAMPLES, "seed": SEED, "level": LEVEL},
        **{key: first[key] for key in ("run", "hardware", "software") if key in first},
    }
    atomic_write_json(point / "metrics.json", metrics)
    return metrics


def _aggregate_metric(name: str, runs: list[dict], columns: list) -> dict:
    entries = [run["quality"][name] for run in runs]
    if not all(isinstance(entry, dict) and _number(entry.get("value")) for entry in entries):
        return dict(entries[0])  # not a number (a note, a count record): the first seed's
    values = [float(entry["value"]) for entry in entries]
    entry = {
        key: value for key, value in entries[0].items() if key not in ("value", "bootstrap_95")
    }
    if all(name in column for column in columns):
        resampled = two_level_resamples([column[name] for column in columns])
        over = INTERVAL_TWO_LEVEL if len(values) > 1 else INTERVAL_ONE_SEED
    else:
        resampled = seed_resamples(values)
        over = INTERVAL_SEEDS_ONLY
    entry.pop("count", None)  # a count of one seed's examples is not the aggregate's
    return {
        **entry,
        "value": float(np.mean(values)),
        "bootstrap_95": interval(resampled),
        "interval_over": over,
        "seed_values": values,
        "seed_std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
    }


def _mean_speed(speeds: list[dict]) -> dict:
    keys = [key for key in speeds[0] if all(_number(speed.get(key)) for speed in speeds)]
    mean = {key: float(np.mean([speed[key] for speed in speeds])) for key in keys}
    # a number that some seed lacks has no mean: seed 0's alone under its name would pass for one
    others = {
        key: value for key, value in speeds[0].items() if key not in mean and not _number(value)
    }
    return {**others, **mean, "over_seeds": "mean of the seeds' values"}


def _check_same_point(point: Path, folders: list[Path], runs: list[dict]) -> None:
    """Every seed's result must be the same point decoded with another seed's model."""
    first = runs[0]
    for folder, run in zip(folders[1:], runs[1:], strict=True):
        for key in ("task", "examples"):
            if run.get(key) != first.get(key):
                raise SeedError(
                    f"{folder}: {key} {run.get(key)!r}, but {folders[0].name} has "
                    f"{first.get(key)!r} (a point's seeds must be the same evaluation)"
                )
        decode, first_decode = run["config"].get("decode"), first["config"].get("decode")
        if decode != first_decode:
            raise SeedError(f"{folder}: decodes otherwise than {folders[0].name}")
        if set(run["quality"]) != set(first["quality"]):
            raise SeedError(f"{folder}: other quality metrics than {folders[0].name}")


def _joint_hash(hashes: list[str]) -> str:
    import hashlib

    return hashlib.sha256("+".join(hashes).encode()).hexdigest()[:16]


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def main(argv: list[str]) -> int:
    from setdlm.util.errors import ArgumentParser

    parser = ArgumentParser(
        prog="setdlm aggregate",
        description="Aggregate each point's seed-<k>/ results into its metrics.json (mean over "
        "seeds, two-level bootstrap interval, per-seed values).",
    )
    parser.add_argument(
        "points", type=Path, nargs="+", help="point folders, each holding seed-<k>/ results"
    )
    args = parser.parse_args(argv)
    for point in args.points:
        metrics = aggregate(point)
        names = ", ".join(
            f"{name} {entry['value']:.4g}"
            for name, entry in metrics["quality"].items()
            if isinstance(entry, dict) and _number(entry.get("value"))
        )
        print(f"{point}: {len(metrics['seeds'])} seeds; {names}")
    return 0
