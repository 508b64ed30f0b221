"""Learning curves: accuracy and loss along training, one line per seed, one panel per model.

Reads what ``setdlm train`` leaves in each model folder trained with ``train.curve``
(``learning_curve.jsonl``: every ``curve.every`` steps, the EMA weights' accuracy on the first
arithmetic test problems at τ = 1e6, and the training loss; see setdlm/recipes/learning_curve.py)
under ``<models>/<name>/`` or ``<models>/<name>/seed-<k>/``, and writes

- ``learning_curves.csv``: one row per model, seed and probed step;
- ``learning_curves.md``: per model, each seed's final accuracy, the mean and standard deviation
  over seeds, and whether training converged: the change of accuracy over the last quarter of
  training (a least-squares line through the probes there, mean over seeds) against the noise
  it is judged by (the larger of the seed standard deviation of the final accuracy and twice
  the binomial standard error of one probe);
- ``learning_curves.png``: accuracy (top) and loss (bottom) against step, a panel per model, a
  line per seed.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from setdlm.report.table import Column, Table, to_csv, to_markdown
from setdlm.util import owned_files
from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_bytes, atomic_write_text

CURVE_FILE = "learning_curve.jsonl"  # setdlm.recipes.learning_curve.CURVE_FILE (no torch here)
STEM = "learning_curves"


class CurveError(UserError, ValueError):
    """No learning curve to report, or a curve file that cannot be read."""


@dataclass(frozen=True)
class Curve:
    model: str
    seed: int | None
    records: tuple[dict, ...]  # step, loss, accuracy, problems, ...

    @property
    def steps(self) -> np.ndarray:
        return np.asarray([r["step"] for r in self.records], dtype=np.float64)

    @property
    def accuracy(self) -> np.ndarray:
        return np.asarray([r["accuracy"] for r in self.records], dtype=np.float64)


def read_curves(models: str | Path) -> list[Curve]:
    """Every learning curve under a models folder, by model then seed."""
    models = Path(models)
    curves = []
    for path in sorted(models.glob(f"*/{CURVE_FILE}")) + sorted(models.glob(f"*/*/{CURVE_FILE}")):
        seeded = path.parent.name.startswith("seed-")
        model = path.parent.parent.name if seeded else path.parent.name
        seed = int(path.parent.name.removeprefix("seed-")) if seeded else None
        records = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                record = json.loads(line)
                float(record["step"]), float(record["accuracy"])
            except (ValueError, KeyError, TypeError):
                raise CurveError(
                    f"{path}:{number}: not a learning-curve line (a JSON object with step and "
                    "accuracy)"
                ) from None
            records.append(record)
        if records:
            curves.append(Curve(model, seed, tuple(records)))
    if not curves:
        raise CurveError(
            f"{models}: no {CURVE_FILE} in <model>/ or <model>/seed-<k>/ (models trained "
            "with train.curve write one)"
        )
    return sorted(curves, key=lambda c: (c.model, -1 if c.seed is None else c.seed))


@dataclass(frozen=True)
class Convergence:
    model: str
    seeds: list[int | None]
    final: list[float]  # each seed's last accuracy
    last_quarter_change: float  # mean over seeds of the fitted change over the last quarter
    noise: float  # what the change is judged against
    steps: int

    @property
    def mean(self) -> float:
        return float(np.mean(self.final))

    @property
    def std(self) -> float:
        return float(np.std(self.final, ddof=1)) if len(self.final) > 1 else 0.0

    @property
    def flat(self) -> bool:
        return abs(self.last_quarter_change) <= self.noise


def probe_standard_error(accuracy: float, problems: int) -> float:
    """The binomial standard error of one probe's accuracy, Agresti-Coull adjusted (two solved
    and two failed problems added): at 0 % or 100 % the plain one is 0, which would call a curve
    that reached the ceiling one probe step (0.5 points on 200 problems) late "still changing"."""
    adjusted = (accuracy * problems + 2) / (problems + 4)
    return math.sqrt(adjusted * (1 - adjusted) / (problems + 4))


def probe_size(sizes, where: str) -> int:
    """The one number of problems that the seeds' last probes (``sizes``, their ``problems``)
    solved: the probe's binomial error needs it, and seeds probed on different numbers are not
    one recipe's."""
    found = set(sizes)
    if len(found) != 1 or not all(isinstance(n, int) and n > 0 for n in found):
        shown = ", ".join(sorted(map(str, found))) or "none"
        raise CurveError(
            f"{where}: the seeds' last learning-curve records must share one probe size "
            f"('problems', a positive count); found {shown}"
        )
    return found.pop()


def convergence(curves: list[Curve]) -> list[Convergence]:
    by_model: dict[str, list[Curve]] = {}
    for curve in curves:
        by_model.setdefault(curve.model, []).append(curve)
    verdicts = []
    for model, own in by_model.items():
        changes, final = [], []
        for curve in own:
            steps, accuracy = curve.steps, curve.accuracy
            last = steps >= steps[-1] * 0.75
            if last.sum() >= 2:
                slope = np.polyfit(steps[last], accuracy[last], 1)[0]
                changes.append(float(slope * (steps[-1] - steps[last][0])))
            final.append(float(accuracy[-1]))
        problems = probe_size((c.records[-1].get("problems") for c in own), model)
        binomial = probe_standard_error(float(np.mean(final)), problems)
        std = float(np.std(final, ddof=1)) if len(final) > 1 else 0.0
        verdicts.append(
            Convergence(
                model,
                [c.seed for c in own],
                final,
                float(np.mean(changes)) if changes else math.nan,
                max(std, 2 * binomial),
                int(own[0].steps[-1]),
            )
        )
    return verdicts


def curves_tables(curves: list[Curve]) -> tuple[Table, Table]:
    """(the per-model summary, every probed point)."""
    summary_rows = []
    for verdict in convergence(curves):
        summary_rows.append(
            {
                "model": verdict.model,
                "seeds": len(verdict.seeds),
                "steps": verdict.steps,
                "final": ", ".join(
                    f"{'s' + str(seed) if seed is not None else 'one'}: {100 * value:.1f}"
                    for seed, value in zip(verdict.seeds, verdict.final, strict=True)
                ),
                "mean": (100 * verdict.mean, 100 * verdict.std),
                "change": 100 * verdict.last_quarter_change,
                "noise": 100 * verdict.noise,
                "converged": "flat" if verdict.flat else "still changing",
            }
        )
    problems = sorted({c.records[-1].get("problems") for c in curves}, key=str)
    summary = Table(
        STEM,
        "Learning curves: accuracy along training (arithmetic-solve, τ = 1e6)",
        [
            Column("model", "model"),
            Column("seeds", "seeds", 0),
            Column("steps", "steps", 0),
            Column("final", "final accuracy per seed (%)"),
            Column("mean", "mean ± std over seeds (%)", 1, spread=True),
            Column("change", "change over the last quarter (pp)", 1),
            Column("noise", "noise (pp)", 1),
            Column("converged", "last quarter"),
        ],
        summary_rows,
        [
            "Accuracy: strict match of the EMA weights on the first "
            f"{', '.join(map(str, problems))} arithmetic test problems, greedy, τ = 1e6, "
            "measured during training every curve.every steps (setdlm/recipes/"
            "learning_curve.py); the evaluation tables use more problems.",
            "change over the last quarter: a least-squares line through each seed's probes in "
            "the last quarter of training, its rise over that quarter, mean over seeds. noise: "
            "the larger of the seed standard deviation of the final accuracy and twice the "
            "binomial standard error of one probe (Agresti-Coull: not 0 at 0 or 100 %). 'flat' "
            "when |change| <= noise.",
        ],
    )
    points = Table(
        f"{STEM}_points",
        "Learning curves: every probe",
        [
            Column("model", "model"),
            Column("seed", "seed", 0),
            Column("step", "step", 0),
            Column("loss", "loss", 4),
            Column("accuracy", "accuracy", 4),
            Column("problems", "problems", 0),
        ],
        [
            {"model": c.model, "seed": c.seed, **{k: r.get(k) for k in ("step", "loss")}}
            | {"accuracy": r["accuracy"], "problems": r.get("problems")}
            for c in curves
            for r in c.records
        ],
    )
    return summary, points


def curves_figure(curves: list[Curve], title: str):
    import matplotlib.style
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(c.model for c in curves))
    with matplotlib.style.context("default"):
        figure = Figure(figsize=(3.2 * len(models), 5.6))
        axes = figure.subplots(2, len(models), squeeze=False, sharex="col")
        for column, model in enumerate(models):
            top, bottom = axes[0][column], axes[1][column]
            for curve in (c for c in curves if c.model == model):
                label = "one model" if curve.seed is None else f"seed {curve.seed}"
                steps = curve.steps
                top.plot(steps, 100 * curve.accuracy, "-o", markersize=2, linewidth=1, label=label)
                losses = [r.get("loss") for r in curve.records]
                if all(loss is not None for loss in losses):
                    bottom.plot(steps, losses, "-", linewidth=1, label=label)
            top.set_title(model, fontsize=9)
            top.set_ylim(-2, 102)
            top.grid(True, alpha=0.3)
            bottom.grid(True, alpha=0.3)
            bottom.set_xlabel("training step")
            if column == 0:
                top.set_ylabel("accuracy, τ = 1e6 (%)")
                bottom.set_ylabel("training loss")
            top.legend(fontsize=6, loc="lower right")
        figure.suptitle(title, fontsize=10)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=130, metadata={"Software": None})
    return buffer.getvalue()


def write_curves(models: str | Path, tables: str | Path, figures: str | Path) -> list[Path]:
    curves = read_curves(models)
    summary, points = curves_tables(curves)
    tables, figures = Path(tables), Path(figures)
    source = Path(models).resolve().parent.name
    texts = {
        f"{table.key}.{suffix}": text
        for table in (summary, points)
        for suffix, text in (("md", to_markdown(table, source)), ("csv", to_csv(table)))
    }
    # only files this command wrote there for this run are replaced (setdlm/util/owned_files.py)
    owner = f"run {source}"
    owned_files.claim(tables, texts, owner, flag="--tables")
    owned_files.claim(figures, [f"{STEM}.png"], owner, flag="--figures")
    written = []
    for name, text in texts.items():
        atomic_write_text(tables / name, text)
        written.append(tables / name)
    owned_files.record(tables, written, owner)
    path = figures / f"{STEM}.png"
    atomic_write_bytes(path, curves_figure(curves, f"Learning curves ({source})"))
    owned_files.record(figures, [path], owner)
    return [*written, path]
