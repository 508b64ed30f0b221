"""One point over several training seeds: the aggregate the tables, figures, check and MLflow
read, and the two-level bootstrap behind its interval.

A model trained once per seed (a workflow model with ``train.seeds``) is evaluated once per
seed, each result in ``<point>/seed-<k>/``. ``aggregate(point)`` writes ``<point>/metrics.json``:

- each quality metric's ``value`` is the mean over the seeds of the per-seed means;
- its ``bootstrap_95`` is a two-level bootstrap of the crossed design: every seed decodes the
  same examples, so each replicate resamples the seeds (with replacement) and, once, the
  examples (with replacement), the same examples for every drawn seed, and takes the mean of
  the drawn seeds' means over the drawn examples. The interval holds the training-seed spread,
  the example spread, and what the two share: an example hard for every seed moves all of
  them together, which resampling each seed's examples on its own (a nested design) would
  average away, giving too narrow an interval. Metrics with no per-example value (a
  corpus-level score such as MAUVE) resample the seeds only, and say so;
- ``bootstrap_mc_error`` is the Monte-Carlo standard error of those bounds (``RESAMPLES``
  replicates: another draw would move a bound by about this much);
- ``seeds`` lists every seed with its own values (quality and counted speed);
- counted speed (NFE, parallelism, tokens) is the mean over the seeds; timed speed too, with
  the per-seed values beside it.

The same resampling pairs two points (setdlm/report/claims.py): the same seed indices and the
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

# 10,000 replicates: the bounds' Monte-Carlo error is then about 0.03 of the resampled
# standard deviation (2,000 left the default's claims about +-0.15 points apart between draws)
RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95
SEED_PREFIX = "seed-"
INTERVAL_TWO_LEVEL = (
    "two-level bootstrap, crossed: seeds, and the examples once for all seeds (each seed "
    "decoded the same ones)"
)
# A replicate's example draws in blocks of this many replicates, whatever the total: memory
# stays bounded on large test sets, and the indices drawn never depend on the block size.
_BLOCK = 1000
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
    return scored_examples(folder, names)[1]


def scored_examples(folder: Path, names) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
    """(the example ids in order, ``per_example_scores``): what pairs two results' columns."""
    records = SampleLog(folder / "samples.jsonl").scan()[0]
    ordered = [records[key] for key in sorted(records)]
    scored = [r.get("scores") if isinstance(r.get("scores"), dict) else {} for r in ordered]
    columns = {
        name: np.asarray([float(s[name]) for s in scored], dtype=np.float64)
        for name in names
        if ordered and all(_number(s.get(name)) for s in scored)
    }
    return tuple(sorted(records)), columns


def two_level_resamples(
    columns: list[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """(R,) bootstrap means: ``columns[s]`` holds seed s's per-example values.

    Columns of one length are the same examples (the crossed design, the usual case): each
    replicate draws S seeds and N examples once, and its mean is that of the drawn seeds'
    means over the drawn examples. Columns of other lengths cannot be the same examples: each
    drawn seed's examples are then drawn on their own (nested). The same ``seed`` draws the
    same indices for columns of equal shape, which is what pairs two points."""
    rng = np.random.default_rng(seed)
    seeds = len(columns)
    picked_seeds = rng.integers(0, seeds, size=(resamples, seeds))  # (R, S)
    sizes = {len(column) for column in columns}
    if len(sizes) == 1:
        stacked = np.stack(columns)  # (S, N)
        count = stacked.shape[1]
        # a replicate's mean over (drawn seed, drawn example) pairs is its seed counts times
        # the values times its example counts, over S * N
        seed_counts = _multiplicities(picked_seeds, seeds)  # (R, S)
        means = np.empty(resamples)
        for start in range(0, resamples, _BLOCK):
            stop = min(start + _BLOCK, resamples)
            picks = rng.integers(0, count, size=(stop - start, count))  # (B, N)
            example_counts = _multiplicities(picks, count)  # (B, N)
            weighted = seed_counts[start:stop] @ stacked  # (B, N)
            means[start:stop] = (weighted * example_counts).sum(axis=1) / (seeds * count)
        return means
    means = np.empty(resamples)
    for r in range(resamples):
        chosen = [columns[s] for s in picked_seeds[r]]
        means[r] = np.mean([c[rng.integers(0, len(c), size=len(c))].mean() for c in chosen])
    return means


def _multiplicities(picks: np.ndarray, size: int) -> np.ndarray:
    """(R, size) how often each index was drawn in each row of ``picks`` (R, k)."""
    rows = picks.shape[0]
    flat = picks + size * np.arange(rows)[:, None]
    return np.bincount(flat.ravel(), minlength=rows * size).reshape(rows, size).astype(float)


def seed_resamples(values: list[float], resamples: int = RESAMPLES, seed: int = SEED):
    """(R,) means of resampled seeds (with replacement)."""
    rng = np.random.default_rng(seed)
    array = np.asarray(values, dtype=np.float64)
    return array[rng.integers(0, len(array), size=(resamples, len(array)))].mean(axis=1)


def interval(resampled: np.ndarray) -> list[float]:
    low, high = np.percentile(resampled, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return [float(low), float(high)]


def mc_error(resampled: np.ndarray) -> float:
    """The Monte-Carlo standard error of ``interval``'s bounds, the larger of the two: a
    bound is an order statistic of the replicates, and the replicates within one binomial
    standard deviation of its rank (sqrt(R q (1 - q)) ranks either side) span about two
    standard errors of it."""
    ordered = np.sort(resampled)
    count = len(ordered)
    errors = []
    for q in ((1 - LEVEL) / 2, (1 + LEVEL) / 2):
        spread = math.sqrt(count * q * (1 - q))
        low = int(max(0, math.floor(q * count - spread)))
        high = int(min(count - 1, math.ceil(q * count + spread)))
        errors.append(float(ordered[high] - ordered[low]) / 2)
    return max(errors)


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
    scored = [scored_examples(folder, names) for folder in folders]
    for folder, (ids, _) in zip(folders[1:], scored[1:], strict=True):
        if ids != scored[0][0]:  # the crossed bootstrap resamples examples by position
            raise SeedError(
                f"{folder}: decoded other examples than {folders[0].name} (a point's seeds "
                "must decode the same ones)"
            )
    columns = [column for _, column in scored]
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
        "interval": {"resamples": RESAMPLES, "seed": SEED, "level": LEVEL, "design": "crossed"},
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
        "bootstrap_mc_error": mc_error(resampled),
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
