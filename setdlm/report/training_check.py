"""``setdlm check-training``: does a training of the default's recipe land where the reference
trainings did, within their seed spread?

Training is not portable: another CPU (or thread count) rounds otherwise and the difference
grows into other weights, so a retrained model is compared with the reference trainings as one
more seed would be, not value for value. For every model, the baseline
(``results/baselines/training.json``, written from the reference models' own records) keeps,
per metric, the mean and the standard deviation over the reference seeds:

- ``loss@<step>``: the training loss averaged over the ``WINDOW`` steps up to that step (the
  log has one batch's loss every 10 steps), at each quarter of training;
- ``accuracy``: the learning curve's last accuracy (arithmetic-solve, τ = 1e6, its problems).

A checked model passes a metric when it lies within ``SPREADS`` standard deviations of the
reference mean: a tolerance derived from the measured seed spread, never a blanket factor. Three
to five seeds can happen to agree more closely than the next one will, so the standard deviation
has a floor. For the loss, 0.01 nats (``FLOORS``). For accuracy, the probe's own binomial
standard error (Agresti-Coull, ``curves.probe_standard_error``: the spread of seeds whose
errors on the probe's problems are independent, and above 0 at the 100 % ceiling), the noise the
learning-curve table uses too: three close MDLM seeds at 3-4 % of 200 problems once set a
tolerance of 1 point, below that noise (1.4 points), and a fifth seed at 6 % failed it. The
baseline states the standard deviation, its floor and the tolerance next to the values, and the
probe's size: a seed probed on another number of problems fails rather than being judged by a
tolerance made for another probe.

Where the checked folder holds two seeds or more of a model (another CPU's training of the
reference seeds, say), the means are compared too (``mean_comparisons``): on the final accuracy,
the checked seeds' mean against the reference seeds', with a Welch 95 % interval of the
difference over seeds (at least one point either side, ``FLOORS["accuracy"]``). The two agree
when that interval contains 0; a training recipe is portable in distribution when every model
agrees.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from setdlm.eval.intervals import t_975
from setdlm.report.curves import CURVE_FILE, probe_size, probe_standard_error
from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_json, read_json

FORMAT = 2  # 2: each metric's std_floor, the accuracy's probe size
PROBE = "probe_problems"  # seed_metrics' key for its probe's size (not a checked metric)
DEFAULT_BASELINE = Path("results/baselines/training.json")
WINDOW = 100  # steps the loss is averaged over
SPREADS = 3.0
# The loss's floor on the seeds' standard deviation (nats) and the accuracy's on the Welch
# interval of two seed means (one problem in a hundred either side)
FLOORS = {"accuracy": 0.01, "loss": 0.01}
ABOUT = (
    "setdlm check-training baseline: per model and metric, the mean and standard deviation over "
    "the reference seeds; a retrained seed passes within {spreads:g} standard deviations of the "
    "mean, the standard deviation at least the probe's binomial standard error for accuracy "
    "(Agresti-Coull, over its problems) and {loss:g} nats for the loss ('std_floor')."
)


class TrainingCheckError(UserError, ValueError):
    """No training records where they were expected, or a baseline that cannot be used."""


def _lines(path: Path, required: tuple[str, ...]) -> list[dict]:
    """The JSON lines of a training log, each an object with a number under every key of
    ``required``; else an error naming the file, the line and the key."""
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as error:
        raise TrainingCheckError(f"{path}: cannot read it ({error})") from None
    for number, line in enumerate(lines, start=1):
        for key in required:
            value = line.get(key) if isinstance(line, dict) else None
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise TrainingCheckError(
                    f"{path}: record {number}: {key} is {value!r}; expected a number in each "
                    "record (the log `setdlm train` writes)"
                )
    return lines


def seed_metrics(folder: Path) -> dict[str, float]:
    """A trained model folder's checked metrics, from its losses.jsonl and learning_curve.jsonl
    (and under ``PROBE`` the number of problems its last probe solved)."""
    losses = _lines(folder / "losses.jsonl", ("step", "loss"))
    if not losses:
        raise TrainingCheckError(f"{folder / 'losses.jsonl'}: no logged step")
    last = max(line["step"] for line in losses)
    metrics = {}
    for quarter in (1, 2, 3, 4):
        step = round(last * quarter / 4)
        window = [x["loss"] for x in losses if step - WINDOW < x["step"] <= step]
        if window:
            metrics[f"loss@{step}"] = statistics.fmean(window)
    curve = folder / CURVE_FILE
    if curve.is_file():
        records = _lines(curve, ("accuracy",))
        if records:
            metrics["accuracy"] = float(records[-1]["accuracy"])
            metrics[PROBE] = records[-1].get("problems")
    return metrics


def trained_seeds(models: Path) -> dict[str, dict[int, dict[str, float]]]:
    """{model: {seed: metrics}} of every ``<model>/seed-<k>/`` with a training record."""
    found: dict[str, dict[int, dict[str, float]]] = {}
    for log in sorted(models.glob("*/seed-*/losses.jsonl")):
        folder = log.parent
        seed = folder.name.removeprefix("seed-")
        if seed.isdigit():
            found.setdefault(folder.parent.name, {})[int(seed)] = seed_metrics(folder)
    if not found:
        raise TrainingCheckError(
            f"{models}: no <model>/seed-<k>/losses.jsonl (models trained with train.seeds)"
        )
    return found


def std_floor(metric: str, mean: float, problems: int | None) -> float:
    """The least standard deviation a tolerance assumes: the probe's binomial standard error
    for accuracy, FLOORS["loss"] for a loss."""
    if metric == "accuracy":
        return probe_standard_error(mean, problems)
    return FLOORS["loss"]


def write_baseline(path: Path, models: Path) -> dict:
    baseline = {
        "about": ABOUT.format(spreads=SPREADS, loss=FLOORS["loss"]),
        "format": FORMAT,
        "spreads": SPREADS,
        "floors": FLOORS,
        "models": {},
    }
    for model, seeds in trained_seeds(models).items():
        names = sorted(set.intersection(*(set(m) for m in seeds.values())) - {PROBE})
        problems = None
        if "accuracy" in names:
            problems = probe_size((m[PROBE] for m in seeds.values()), f"{models / model}")
        entry = {}
        for name in names:
            values = [seeds[seed][name] for seed in sorted(seeds)]
            mean = statistics.fmean(values)
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            floor = std_floor(name, mean, problems)
            entry[name] = {
                "mean": mean,
                "std": std,
                "std_floor": floor,
                "tolerance": SPREADS * max(std, floor),
                "seeds": {str(seed): seeds[seed][name] for seed in sorted(seeds)},
            }
        if problems is not None:
            entry["accuracy"]["problems"] = problems
        baseline["models"][model] = entry
    atomic_write_json(path, baseline)
    return baseline


COMPARED_MEANS = ("accuracy",)


def welch_difference(
    here: list[float], there: list[float], floor: float = 0.0
) -> tuple[float, float, float]:
    """mean(here) - mean(there) with its Welch 95 % interval over the seeds of each side, at
    least ``floor`` either side: seeds that all sit at the ceiling (100 % on the probe) have no
    variance, and an interval of width 0 would call one problem's difference a disagreement."""
    difference = statistics.fmean(here) - statistics.fmean(there)
    a, b = statistics.variance(here) / len(here), statistics.variance(there) / len(there)
    half = floor
    if a + b > 0:
        df = (a + b) ** 2 / (a**2 / (len(here) - 1) + b**2 / (len(there) - 1))
        half = max(t_975(df) * math.sqrt(a + b), floor)
    return difference, difference - half, difference + half


def mean_comparisons(baseline: dict, found: dict) -> list[tuple[str, bool]]:
    """Per model of ``found`` (trained_seeds) with at least two checked seeds and two reference
    seeds, one line per compared metric (the two means, the difference with its interval) and
    whether the two agree."""
    lines = []
    for model, seeds in sorted(found.items()):
        expected = baseline["models"].get(model, {})
        for name in COMPARED_MEANS:
            reference = list(expected.get(name, {}).get("seeds", {}).values())
            here = [metrics[name] for metrics in seeds.values() if name in metrics]
            if len(here) < 2 or len(reference) < 2:
                continue
            difference, low, high = welch_difference(here, reference, FLOORS[name])
            agree = low <= 0 <= high
            lines.append((
                f"{model} {name}: mean {statistics.fmean(here):.4f} over {len(here)} seeds here, "
                f"{statistics.fmean(reference):.4f} over {len(reference)} reference seeds; "
                f"difference {difference:+.4f} [{low:+.4f}, {high:+.4f}] (Welch 95 % over "
                f"seeds): {'agree' if agree else 'DIFFER'}",
                agree,
            ))  # fmt: skip
    return lines


def compare(baseline: dict, found: dict) -> list[str]:
    """Every value of ``found`` (trained_seeds) outside its tolerance, as a line naming model,
    seed and metric."""
    problems = []
    for model, seeds in sorted(found.items()):
        expected = baseline["models"].get(model)
        if expected is None:
            problems.append(f"{model}: not in the baseline")
            continue
        for seed, metrics in sorted(seeds.items()):
            for name, spec in sorted(expected.items()):
                value = metrics.get(name)
                probe = spec.get("problems")
                if value is None:
                    problems.append(f"{model} seed {seed}: {name} missing")
                elif probe is not None and metrics.get(PROBE) != probe:
                    problems.append(
                        f"{model} seed {seed}: {name} probed on {metrics.get(PROBE)} problems, "
                        f"the reference seeds on {probe} (train with the same train.curve)"
                    )
                elif not math.isfinite(value) or abs(value - spec["mean"]) > spec["tolerance"]:
                    problems.append(
                        f"{model} seed {seed}: {name} {value:.4f}, reference "
                        f"{spec['mean']:.4f} ± {spec['tolerance']:.4f} "
                        f"({SPREADS:g} x the seed std {spec['std']:.4f} or its floor "
                        f"{spec['std_floor']:.4f})"
                    )
    return problems


def main(argv: list[str] | None = None) -> int:
    from setdlm.util.errors import ArgumentParser

    parser = ArgumentParser(
        prog="setdlm check-training",
        description="compare trained models' losses and accuracy with the reference seeds' spread",
    )
    parser.add_argument("models", type=Path, help="a models folder with <model>/seed-<k>/")
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
    parser.add_argument("--write", action="store_true", help="write the baseline from MODELS")
    args = parser.parse_args(argv)
    if not args.models.is_dir():
        parser.error(f"{args.models}: not a folder")
    if args.write:
        baseline = write_baseline(args.baseline, args.models)
        print(f"wrote {args.baseline}: {len(baseline['models'])} models")
        return 0
    write = "`setdlm check-training MODELS --write` writes one"
    baseline = read_json(args.baseline, TrainingCheckError, write)
    if not isinstance(baseline, dict) or baseline.get("format") != FORMAT:
        raise TrainingCheckError(
            f"{args.baseline}: format {baseline.get('format')!r}, this check reads format "
            f"{FORMAT} (a std_floor per metric); rewrite it: {write}"
        )
    from setdlm.results.baselines import TRAINING, check_baseline

    check_baseline(args.baseline, baseline, TRAINING, TrainingCheckError)
    found = trained_seeds(args.models)
    problems = compare(baseline, found)
    for problem in problems:
        print(f"FAIL {problem}")
    for line, agree in mean_comparisons(baseline, found):
        print(f"{'MEANS' if agree else 'FAIL MEANS'} {line}")
        if not agree:
            problems.append(line)
    checked = sum(len(seeds) for seeds in found.values())
    verdict = "FAILED" if problems else "PASSED"
    print(
        f"setdlm check-training {verdict}: {checked} trained model(s) in {args.models} against "
        f"{args.baseline}",
        file=sys.stdout,
    )
    return 1 if problems else 0
