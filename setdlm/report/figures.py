"""Speed-quality Pareto figures, one per decoding task, from the result files of one run.

Each figure has three panels with the same quality axis (GSM8K accuracy, ROUGE-L, MAUVE):
against tokens per second, against the official parallelism factor (tokens committed per step,
EOS and positions after it included: the paper's axis) and, beside it, against tokens per
forward (text tokens over NFE; setdlm/core/decoding/parallelism.py); a task that names further
qualities in its figure row (setdlm/tasks/__init__.py: the sampled arithmetic problems' MAUVE
under their correctness) gets one more such row of panels per quality. The published GSM8K
curves have no tokens per forward, so they are drawn in the first two panels only. One curve
per family and size, its points in sweep order (τ from large to small), each with its 95 %
bootstrap interval as an error bar where the evaluation recorded one, and its τ beside it
unless that label would overprint another (the tables list every τ). A model trained once per
seed is drawn as the mean over its seeds (bold, with the two-level interval) and each seed's
own curve faint behind it. GSM8K also draws the
published curves (SPEC 6.1) dashed, where some point is comparable with them (a published
checkpoint, the paper's protocol, the whole test set). SetDLM-smax2S and BD3LM-S (the
paper's pairing, SPEC 3.7) get the same shade of their family's colour. A model decoding with
a policy other than its family's own (setdlm/families.py) has a dotted curve of its own, its
legend naming the policy and whether its cache is approximate.

The files are deterministic: matplotlib's own style (not the user's matplotlibrc), its bundled
font, and no creation date or software version in the PNG and PDF metadata, so regenerating
from the same results gives the same bytes and git sees no change.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.style
from matplotlib.figure import Figure

from setdlm.families import FAMILY_NAMES
from setdlm.families import family as family_info
from setdlm.families import policy as policy_info
from setdlm.report import paper_numbers
from setdlm.report.table import format_tau, hardware_summary
from setdlm.report.tables import substitution_notes
from setdlm.results.reader import ResultPoint, Results
from setdlm.tasks import TASKS, FigureQuality
from setdlm.util import owned_files
from setdlm.util.files import atomic_write_bytes


@dataclass(frozen=True)
class FigureSpec:
    task: str  # task folder
    title: str
    metric: str  # quality name in metrics.json
    label: str
    scale: float = 1.0
    more: tuple[FigureQuality, ...] = ()  # further rows of panels, one quality each

    @property
    def rows(self) -> tuple:
        """Each row's quality (metric, label, scale): the headline's first."""
        return (self, *self.more)


# One per decoding task, from its row of setdlm/tasks/__init__.py: the headline quality on the y
# axis.
FIGURES = {
    name: FigureSpec(
        name,
        info.figure.title,
        info.headline,
        info.figure.label,
        info.figure.scale,
        info.figure.more,
    )
    for name, info in TASKS.items()
    if info.figure is not None
}
# A τ label is left out when it would sit closer than this to one already drawn, in
# fractions of the axes' data range.
LABEL_SPACING = 0.045
X_AXES = (
    ("tokens_per_second", "speed (tokens/s, mean over examples)"),
    ("parallelism", "parallelism factor (tokens committed per step)"),
    ("tokens_per_forward", "tokens per forward (text tokens / NFE)"),
)
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


@dataclass
class Curve:
    family: str
    size: int | None
    published: bool
    # tau, tokens_per_second, parallelism, tokens_per_forward, y
    points: list[dict] = field(default_factory=list)
    policy: str | None = None  # a decoding policy other than the family's own

    @property
    def label(self) -> str:
        label = family_info(self.family).model_title(self.size)
        if self.policy is not None:
            exact = policy_info(self.policy).exact_cache
            label += f", {self.policy}" + ("" if exact else " (approx. cache)")
        return label + (" (published)" if self.published else "")

    @property
    def style(self) -> str:
        """Line and marker: published curves dashed, another policy's dotted."""
        return "--s" if self.published else "-o" if self.policy is None else ":^"

    @property
    def color(self) -> str:
        return family_info(self.family).colour(self.size)


def our_curves(points: list[ResultPoint], spec: FigureSpec | FigureQuality) -> list[Curve]:
    """Our curves of one quality (``spec.metric`` × ``spec.scale``) against speed."""
    curves: dict[tuple, Curve] = {}
    for point in points:  # already in family, size, policy, τ order
        value = point.quality(spec.metric)
        low, high = point.interval(spec.metric) or (None, None)
        curve = curves.setdefault(
            (point.family, point.size, point.policy),
            Curve(point.family, point.size, published=False, policy=point.policy),
        )
        curve.points.append(
            {
                "tau": point.tau,
                "tokens_per_second": point.speed("tokens_per_second_mean"),
                "parallelism": point.speed("parallelism_mean"),
                "tokens_per_forward": point.speed("tokens_per_forward_mean"),
                "y": None if value is None else value * spec.scale,
                "low": None if low is None else low * spec.scale,
                "high": None if high is None else high * spec.scale,
                "seeds": [_seed_point(seed, spec) for seed in point.seeds],
            }
        )
    return list(curves.values())


def _seed_point(seed: dict, spec: FigureSpec | FigureQuality) -> dict:
    """One training seed's point: its own quality and speed (a faint line of its own)."""
    value = (seed.get("quality") or {}).get(spec.metric)
    speed = seed.get("speed") or {}
    return {
        "seed": seed["seed"],
        "tokens_per_second": speed.get("tokens_per_second_mean"),
        "parallelism": speed.get("parallelism_mean"),
        "tokens_per_forward": speed.get("tokens_per_forward_mean"),
        "y": None if value is None else value * spec.scale,
    }


def published_curves(task: str, points: list[ResultPoint]) -> list[Curve]:
    from setdlm.report.tables import not_comparable

    if task != "gsm8k":
        return []
    if points and all(not_comparable(point) for point in points):
        return []  # nothing of ours is comparable: the dashed curves would suggest otherwise
    return [
        Curve(
            series.family,
            series.size,
            published=True,
            points=[
                {
                    "tau": p.tau,
                    "tokens_per_second": p.tokens_per_second,
                    "parallelism": p.parallelism,
                    "tokens_per_forward": None,  # not published
                    "y": p.accuracy_percent,
                }
                for p in series.points
            ],
        )
        for series in paper_numbers.GSM8K
    ]


def _sorted(curves: list[Curve]) -> list[Curve]:
    return sorted(
        curves,
        key=lambda c: (
            FAMILY_NAMES.index(c.family),
            c.size or 0,
            c.published,
            (c.policy is not None, c.policy or ""),
        ),
    )


def draw(spec: FigureSpec, results: Results) -> Figure:
    points = results.for_task(spec.task)
    height = 4.4 if len(spec.rows) == 1 else 4.0 * len(spec.rows) + 0.4
    figure = Figure(figsize=(15, height))
    grid = figure.subplots(len(spec.rows), len(X_AXES), sharey="row", squeeze=False)
    for row, (quality, axes) in enumerate(zip(spec.rows, grid, strict=True)):
        curves = our_curves(points, quality)
        if row == 0:  # the published points are of the headline quality
            curves += published_curves(spec.task, points)
        curves = _sorted(curves)
        for ax, (x_key, x_label) in zip(axes, X_AXES, strict=True):
            drawn = sum(_draw_curve(ax, curve, x_key) for curve in curves)
            _label_points(ax, curves, x_key)
            ax.set_xlabel(x_label)
            ax.grid(True, alpha=0.3)
            if not drawn:
                ax.text(0.5, 0.5, "no finished results", transform=ax.transAxes, ha="center")
        axes[0].set_ylabel(quality.label)
        if row == 0 and any(c.points for c in curves):
            axes[1].legend(fontsize=7, loc="best")
    title = f"{spec.title}: quality against speed (run '{results.name}')"
    if substitution_notes(results):  # a rehearsal's: its tables list what it substitutes
        title += "\nSUBSTITUTED run (stand-ins; its tables' notes say which): not the paper's"
    figure.suptitle(title)
    figure.text(0.01, 0.01, _footer(points, spec.task), fontsize=7, color="dimgray")
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    return figure


def _draw_curve(ax, curve: Curve, x_key: str) -> bool:
    shown = [p for p in curve.points if p[x_key] is not None and p["y"] is not None]
    if not shown:
        return False
    xs, ys = [p[x_key] for p in shown], [p["y"] for p in shown]
    if curve.published:
        ax.plot(xs, ys, curve.style, color=curve.color, markerfacecolor="none", label=curve.label)
        return True
    seeds = sorted({seed["seed"] for p in shown for seed in p.get("seeds", [])})
    for number in seeds:  # each training seed faint, the mean over seeds bold
        own = [s for p in shown for s in p["seeds"] if s["seed"] == number]
        own = [s for s in own if s[x_key] is not None and s["y"] is not None]
        ax.plot(
            [s[x_key] for s in own],
            [s["y"] for s in own],
            curve.style[:-1] or "-",
            color=curve.color,
            alpha=0.25,
            linewidth=0.8,
        )
    label = curve.label + (f" (mean of {len(seeds)} seeds)" if seeds else "")
    ax.plot(xs, ys, curve.style, color=curve.color, label=label, markersize=4, linewidth=2)
    bars = [p for p in shown if p.get("low") is not None and p.get("high") is not None]
    if bars:
        ax.errorbar(
            [p[x_key] for p in bars],
            [p["y"] for p in bars],
            yerr=[[p["y"] - p["low"] for p in bars], [p["high"] - p["y"] for p in bars]],
            fmt="none",
            ecolor=curve.color,
            elinewidth=0.8,
            capsize=2,
            alpha=0.7,
        )
    return True


def _label_points(ax, curves: list[Curve], x_key: str) -> None:
    """Our τ beside each point (which setting gave which trade-off), skipping a label that
    would overprint one already placed; curves alternate above and below their points."""
    ours = [c for c in curves if not c.published]
    shown = [
        (index, p)
        for index, curve in enumerate(ours)
        for p in curve.points
        if p[x_key] is not None and p["y"] is not None and p["tau"] is not None
    ]
    if not shown:
        return
    xs, ys = [p[x_key] for _, p in shown], [p["y"] for _, p in shown]
    width, height = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    placed: list[tuple[float, float]] = []
    for index, point in shown:
        where = (point[x_key] / width, point["y"] / height)
        if any(math.dist(where, other) < LABEL_SPACING for other in placed):
            continue
        placed.append(where)
        ax.annotate(
            format_tau(point["tau"]),
            (point[x_key], point["y"]),
            xytext=(3, 4 if index % 2 == 0 else -9),
            textcoords="offset points",
            fontsize=6,
            color=ours[index].color,
        )


def _footer(points: list[ResultPoint], task: str) -> str:
    hardware = sorted({hardware_summary(p.metrics) for p in points})
    text = "ours: " + ("; ".join(hardware) if hardware else "no results")
    if task == "gsm8k":
        text += f" | published (dashed): SPEC 6.1, hardware {paper_numbers.HARDWARE}"
    return text


def write_figures(
    results: Results,
    out_dir: str | Path,
    tasks=tuple(FIGURES),
    owner: str = "",
    adopt: bool = False,
) -> list[Path]:
    """Each task's figure as PNG and PDF into ``out_dir``; ``owner`` and ``adopt`` as for
    ``write_tables``: only this command's own files there are replaced."""
    out_dir = Path(out_dir)
    if owner:
        names = [f"{task}_pareto.{suffix}" for task in tasks for suffix in ("png", "pdf")]
        owned_files.claim(out_dir, names, owner, adopt=adopt)
    written = []
    # matplotlib's defaults, whatever the user's matplotlibrc says: same results, same bytes.
    with matplotlib.style.context("default"):
        for task in tasks:
            figure = draw(FIGURES[task], results)
            for suffix, options in (
                ("png", {"dpi": 150, "metadata": PNG_METADATA}),
                ("pdf", {"metadata": PDF_METADATA}),
            ):
                buffer = io.BytesIO()
                figure.savefig(buffer, format=suffix, **options)
                path = out_dir / f"{task}_pareto.{suffix}"
                atomic_write_bytes(path, buffer.getvalue())
                written.append(path)
    if owner:
        owned_files.record(out_dir, written, owner)
    return written
