"""The paper's five tables, built from the result files of one run.

GSM8K Pareto, CNN/DailyMail, ROCStories infilling, unconditional generation and likelihood:
one row per result point (family, size, τ), the quality metrics the evaluation reported, and
for decoding tasks the speed of the same run. GSM8K also carries the published points
(SPEC 6.1) beside ours, with the difference; the other tables say that no published numbers
exist. Every table's notes state its units, what each metric is (the definitions written into
``metrics.json`` by the evaluation itself), the hardware and the number of examples.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from setdlm.eval.intervals import mean_t_interval
from setdlm.eval.seeds import RESAMPLES
from setdlm.families import FAMILY_NAMES
from setdlm.families import family as family_info
from setdlm.families import policy as policy_info
from setdlm.report import paper_numbers
from setdlm.report.aup import ALPHA, aup, seed_aups
from setdlm.report.separation import separation_notes
from setdlm.report.table import (
    Column,
    Table,
    format_tau,
    hardware_summary,
    to_csv,
    to_latex,
    to_markdown,
)
from setdlm.results.reader import ResultPoint, Results, speed_protocol_of
from setdlm.tasks import PAPER_TABLES, TASKS, Quality, paper_table, table_columns, table_tasks
from setdlm.util import owned_files
from setdlm.util.files import atomic_write_text


def _column(quality: Quality) -> Column:
    """A quality's table column (a task's ``Quality``, setdlm/tasks/__init__.py)."""
    return Column(
        quality.name, quality.label, quality.digits, quality.spread, ranged=quality.interval
    )


def _cell(quality: Quality, point: ResultPoint):
    """A point's cell of a quality column, read from its metrics.json and scaled."""
    entry = point.metrics.get("quality", {}).get(quality.name)
    if entry is None:
        return None
    scale = quality.scale
    value, std = _scaled(entry["value"], scale), _scaled(entry.get("std"), scale)
    if quality.interval:
        low, high = point.interval(quality.name) or (None, None)
        return (value, _scaled(low, scale), _scaled(high, scale))
    return (value, std) if quality.spread else value


@dataclass(frozen=True)
class TableSpec:
    """How a paper table of setdlm/tasks/__init__.py shows its rows: everything but the layout
    is its registry row's and its tasks' (title, units, quality columns, file stem)."""

    table: str  # its PAPER_TABLES name

    @property
    def title(self) -> str:
        return paper_table(self.table).title

    @property
    def units(self) -> str:
        return paper_table(self.table).units

    @property
    def metrics(self) -> tuple[Quality, ...]:
        return table_columns(self.table)

    @property
    def key(self) -> str:
        """The table's file stem."""
        return paper_table(self.table).stem

    @property
    def tasks(self) -> tuple[str, ...]:
        """The task folders whose points make the rows."""
        return table_tasks(self.table)


SPECS = {name: TableSpec(name) for name in PAPER_TABLES if name != "likelihood"}
GSM8K, LIKELIHOOD = SPECS["gsm8k"], TableSpec("likelihood")
# What the Δ columns mean, where the table has them.
GSM8K_DELTAS = (
    "Δ = ours − published, in percentage points, tokens/s and tokens per step. Δ acc compares "
    "our paper_exact (the official script's own accuracy) with the published accuracy: whether "
    "the paper reports that or lm-eval's strict_match is not confirmed (SPEC 5.1), so both are "
    "shown."
)
# What a likelihood row's number is, and what it may be compared with.
LIKELIHOOD_MEASURES = (
    "measures: what each row's NLL is (its metrics.json definition) - the exact NLL for AR; "
    "for MDLM and BD3LM the NELBO and for SetDLM the NLL of one sampled order, both upper "
    "bounds on the NLL, so a diffusion row above AR's does not by itself mean a worse model. "
    "Numbers compare only within one data set (its own text, tokenizer and rows), never across."
)
LIKELIHOOD_ARITHMETIC = (
    "arithmetic: the synthetic test problems, one per row as the arithmetic models are "
    "trained (BOS, question, solution, EOS, then EOS filling the row to the model's length), "
    "and the EOS fill is counted like any token, so the numbers include predicting the end "
    "and what follows it (bits/byte counts each EOS as the bytes of its text). Every family "
    "scores the same rows, so the arithmetic rows compare across families - with AR's number "
    "exact and the others' upper bounds"
)
LIKELIHOOD_INTERVAL = (
    "The NLL interval of a row of one model resamples its sequences (1000 seeded resamples), "
    "each resample's total NLL over its total counted tokens (the aggregation of the value); "
    "it holds the sampling of the sequences only, not the Monte-Carlo noise of a bound or "
    "another training."
)
TABLES = tuple(PAPER_TABLES)  # setdlm/tasks/__init__.py

SPEED_COLUMNS = [
    Column("tokens_per_second", "tok/s", 2, spread=True),
    Column("tokens_per_second_median", "tok/s median [min, max]", 1, ranged=True),
    Column("parallelism", "parallelism", 2),
    Column("tokens_per_forward", "tokens/forward", 2),
    Column("nfe", "NFE", 1),
    Column("positions_per_token", "positions/token", 2),
    Column("latency_p50_seconds", "latency p50 (s)", 3),
]
SPEED_NOTE = (
    "Speed, from the same run as quality (warm-up examples excluded): tok/s and latency over "
    "the timed examples, the counted numbers (parallelism, tokens/forward, NFE, "
    "positions/token) over every example. tok/s = generated tokens / wall-clock seconds of the "
    "decoding call, mean ± std over examples (the paper's number at batch 1); parallelism = the "
    "official parallelism factor, the paper's axis: tokens committed per decoding step (an EOS "
    "and positions after it that the step filled included), mean; tokens/forward = generated "
    "text tokens (EOS and padding excluded) per backbone forward (NFE), mean; NFE = backbone "
    "forward passes per example, mean; positions/token = positions fed to the backbone (prompt "
    "prefill included) per generated token, the compute a family spends on positions it "
    "recomputes or does not commit; latency p50 = median seconds of one decoding call."
)
NO_PUBLISHED = (
    "Published numbers: none exist for this table (SPEC 6.2: the only recovered numbers are "
    "the GSM8K speed-quality points), so only ours are shown."
)
TRACE_COLUMNS = [Column("point", "point", csv_only=True), Column("config_hash", "", csv_only=True)]


def build_tables(results: Results, names=TABLES) -> list[Table]:
    """Each table, followed by its per-seed companion where its points aggregate seeds; every
    one opens with what its run substitutes, where its configuration says (a rehearsal's)."""
    tables = _tables(results, names)
    substituted = substitution_notes(results)
    for table in tables:
        table.notes[:0] = substituted
    return tables


def _tables(results: Results, names) -> list[Table]:
    builders = {"gsm8k": gsm8k_table, "likelihood": likelihood_table}
    tables = []
    for name in names:
        table = (
            builders[name](results) if name in builders else decoding_table(SPECS[name], results)
        )
        tables.append(table)
        spec = LIKELIHOOD if name == "likelihood" else SPECS[name]
        points = _points_of(spec, results)
        if any(p.seeds for p in points):
            tables.append(seeds_table(spec, points, table.title))
        if paper_table(name).claims:
            from setdlm.report.claims_table import claims_table

            tables.append(claims_table(results))
        mixed = code_versions_note(points)
        for built in tables[tables.index(table) :] if mixed else ():
            built.notes.append(mixed)
    return tables


def code_versions_note(points: list[ResultPoint]) -> str | None:
    """Where a table's rows were computed by more than one version of the code: which
    versions, and the rows of each (None: one version, or none recorded)."""
    by_version: dict[str, list[str]] = {}
    for point in points:
        for version in point.code_versions:
            by_version.setdefault(version, []).append(point.key)
    if len(by_version) < 2:
        return None
    parts = []
    for version, keys in sorted(by_version.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        parts.append(f"{version} ({len(keys)} point{'s' if len(keys) != 1 else ''}: {shown})")
    return (
        f"Code versions: these rows mix {len(by_version)} versions of the code (a point over "
        f"seeds counts each seed's): {'; '.join(parts)}. Rerun the points of the older versions "
        "to compare like with like."
    )


def substitution_notes(results: Results) -> list[str]:
    """The run configuration's ``substitutions`` (<run>/config.yaml, as the workflow saved it):
    what a rehearsal puts in place of the real checkpoints, data and scorers."""
    import yaml

    path = results.run_dir / "config.yaml"
    if not path.is_file():
        return []
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    listed = config.get("substitutions") if isinstance(config, dict) else None
    return [f"SUBSTITUTED in this run (not the paper's setup): {text}" for text in listed or []]


def checkpoint_column(points: list[ResultPoint]) -> list[Column]:
    """The published checkpoint each row decoded, where some row's was one (a Hub snapshot)."""
    if not any(checkpoint_cell(point) for point in points):
        return []
    return [Column("checkpoint", "checkpoint")]


def checkpoint_cell(point: ResultPoint) -> str | None:
    """``key @ commit (pinned|unpinned)`` for a published checkpoint, None for a folder."""
    from setdlm.checkpoints.zoo import split_source

    revision = point.config.get("model_revision")
    if not revision:
        return None
    key = split_source(point.config.get("model_source") or "")[0]
    state = "pinned" if revision.get("pinned") else "unpinned"
    return f"{key} @ {str(revision.get('commit'))[:12]} ({state})"


CHECKPOINT_NOTE = (
    "checkpoint: the published key and the Hub commit its files were; pinned = the revisions "
    "table in effect named that commit, unpinned = the repository's main branch as it was when "
    "loaded (nothing holds it there: `setdlm models --pin` on a machine that reaches the Hub)."
)


def checkpoint_notes(points: list[ResultPoint]) -> list[str]:
    return [CHECKPOINT_NOTE] if checkpoint_column(points) else []


def _points_of(spec: TableSpec, results: Results) -> list[ResultPoint]:
    if spec is LIKELIHOOD:  # in the results' order, not grouped by data set
        return [p for p in results.points if p.task in spec.tasks]
    return [p for task in spec.tasks for p in results.for_task(task)]


SEED_COLUMNS = [
    Column("seed", "seed", 0),
]
SEED_SPEED_COLUMNS = [
    Column("parallelism", "parallelism", 2),
    Column("tokens_per_forward", "tokens/forward", 2),
    Column("nfe", "NFE", 1),
    Column("tokens_per_second", "tok/s", 2),
]


def seeds_table(spec: TableSpec, points: list[ResultPoint], title: str) -> Table:
    """One row per point and training seed: the values the seeded rows' means are made of."""
    seeded = [p for p in points if p.seeds]
    task_column = [Column("task", "task")] if len({p.task for p in seeded}) > 1 else []
    metrics = [m for m in spec.metrics if any(m.name in p.metrics["quality"] for p in seeded)]
    columns = (
        task_column
        + [
            Column("model", "model"),
            Column("policy", "policy"),
            Column("tau", "τ", show=format_tau),
        ]
        + SEED_COLUMNS
        + [Column(m.name, m.label, m.digits) for m in metrics]
        + SEED_SPEED_COLUMNS
        + TRACE_COLUMNS
    )
    rows = []
    for point in seeded:
        for seed in point.seeds:
            quality, speed = seed.get("quality", {}), seed.get("speed", {})
            rows.append(
                {
                    "task": point.task,
                    "model": point.model,
                    "policy": point.policy_name,
                    "tau": point.tau,
                    "seed": seed["seed"],
                    **{m.name: _scaled(quality.get(m.name), m.scale) for m in metrics},
                    "parallelism": speed.get("parallelism_mean"),
                    "tokens_per_forward": speed.get("tokens_per_forward_mean"),
                    "nfe": speed.get("nfe_mean"),
                    "tokens_per_second": speed.get("tokens_per_second_mean"),
                    "point": f"{point.key}/{seed['folder']}",
                    "config_hash": seed.get("config_hash"),
                }
            )
    spreads = [
        f"{p.key} {m.label} {_scaled(entry['seed_std'], m.scale):.2f}"
        for p in seeded
        for m in metrics
        if (entry := p.metrics["quality"].get(m.name)) and entry.get("seed_std") is not None
    ]
    notes = [
        f"The per-seed values behind '{title}': each row is one training seed's model "
        "evaluated at the point; the main table shows their mean with a two-level interval. "
        "Units as there.",
        "Seed spread (standard deviation over seeds, in the column's unit): "
        + "; ".join(spreads)
        + ".",
    ]
    return Table(f"{spec.key}_seeds", f"{title}: every seed", columns, rows, notes)


def _mc_error_text(points: list[ResultPoint]) -> str:
    """The largest Monte-Carlo error of the rows' bounds, in the table's units: per interval
    column (the tasks' qualities, scaled as shown), where the aggregates recorded it."""
    largest: dict[str, float] = {}
    for point in points:
        quality = point.metrics.get("quality", {})
        for column in TASKS[point.task].columns if point.task in TASKS else ():
            entry = quality.get(column.name)
            error = entry.get("bootstrap_mc_error") if isinstance(entry, dict) else None
            if column.interval and isinstance(error, float):
                shown = column.scale * error
                largest[column.label] = max(largest.get(column.label, 0.0), shown)
    if not largest:
        return ""
    words = ", ".join(f"{label} {error:.2g}" for label, error in largest.items())
    return f" (Monte-Carlo error of its bounds, at most, in the columns' units: {words})"


def interval_note(points: list[ResultPoint]) -> str:
    """How the rows' intervals were computed: over seeds and examples, or examples only."""
    seeded = [p for p in points if p.seeds]
    single = [p for p in points if not p.seeds]
    parts = []
    if seeded:
        counts = sorted({len(p.seeds) for p in seeded})
        seeds = sorted({s["seed"] for p in seeded for s in p.seeds})
        parts.append(
            f"rows over {'/'.join(map(str, counts))} training seeds ({', '.join(map(str, seeds))})"
            ": the mean over the seeds, and a two-level bootstrap interval of the crossed "
            f"design ({RESAMPLES:,} seeded replicates, each drawing the seeds and, once for all "
            "of them, the examples every seed decoded), so the interval holds the spread "
            "between trainings as well as between examples"
            f"{_mc_error_text(seeded)}; each seed's "
            "values are in the '_seeds' table. Over a handful of seeds that interval is too "
            "narrow (it divides the seeds' variance by n, not n - 1, and reads normal quantiles, "
            "not Student's t), so rows whose intervals barely miss each other decide nothing: "
            "the claims table's verdicts also need a seed-level t interval"
        )
    if single:
        parts.append(
            "rows of one model: the 95 % bootstrap interval over examples (1000 seeded "
            "resamples), which ignores seed variance (another training of the same recipe "
            "can land outside it; train.seeds trains several)"
        )
    return "Intervals: " + "; ".join(parts) + "."


def write_tables(
    results: Results, out_dir: str | Path, names=TABLES, owner: str = "", adopt: bool = False
) -> list[Path]:
    """Each table in three formats into ``out_dir``. With ``owner`` (the run the tables are
    written for), only files this command wrote there for that run are replaced, and the
    folder's manifest records the new ones (setdlm/util/owned_files.py)."""
    out_dir = Path(out_dir)
    source = results.name  # not the absolute path: the same results, the same bytes
    texts = {}
    for table in build_tables(results, names):
        texts[f"{table.key}.md"] = to_markdown(table, source)
        texts[f"{table.key}.csv"] = to_csv(table)
        texts[f"{table.key}.tex"] = to_latex(table, source)
    if owner:
        owned_files.claim(out_dir, texts, owner, adopt=adopt)
    written = []
    for name, text in texts.items():
        atomic_write_text(out_dir / name, text)
        written.append(out_dir / name)
    if owner:
        owned_files.record(out_dir, written, owner)
    return written


# ------------------------------------------------------------------------------ decoding tasks
def decoding_table(spec: TableSpec, results: Results) -> Table:
    points = [p for task in spec.tasks for p in results.for_task(task)]
    task_column = [Column("task", "task")] if len(spec.tasks) > 1 else []
    columns = (
        task_column
        + _identity_columns(points)
        + [_column(m) for m in spec.metrics]
        + SPEED_COLUMNS
        + TRACE_COLUMNS
    )
    rows = [_decoding_row(p, spec) for p in points]
    notes = [spec.units, interval_note(points), SPEED_NOTE, *_result_notes(points, spec, results)]
    notes += checkpoint_notes(points)
    notes += [*policy_notes(points), *aup_notes(points), *separation_notes(points)]
    notes.append(NO_PUBLISHED)
    return Table(spec.key, spec.title, columns, rows, notes)


def aup_notes(points: list[ResultPoint]) -> list[str]:
    """Per task with a τ sweep: each family's AUP over its points, with the reference, and over
    its seeds where it has several (each seed's AUP, their mean with a t interval)."""
    notes = []
    for task in sorted({p.task for p in points}):
        headline = TASKS[task].headline
        scored = [p for p in points if p.task == task and p.quality(headline) is not None]
        if not scored or not any(p.tau is not None for p in scored):
            continue
        reference = max(p.quality(headline) for p in scored)
        by_curve: dict[str, list[ResultPoint]] = {}
        for p in scored:
            if p.speed("parallelism_mean") is not None:
                by_curve.setdefault(p.curve, []).append(p)
        texts = [_aup_text(name, curve, headline, reference) for name, curve in by_curve.items()]
        note = (
            f"AUP ({task}, {headline} × parallelism factor, in % × tokens/step; {ALPHA:g} = α, "
            f"reference accuracy {100 * reference:.1f} %, the best point of the task): "
            f"{'; '.join(text for text, _ in texts)}. AUP = area under the accuracy-parallelism "
            "curve, each accuracy y weighted by min(1, exp(−α (1 − y / reference))) "
            "(setdlm/report/aup.py)."
        )
        beside = _aup_per_forward(by_curve, headline, reference)
        if beside:
            note += f" The same area against tokens per forward (text tokens / NFE): {beside}."
        if any(seeded for _, seeded in texts):
            note += (
                " A family's first number is the AUP of its curve of seed means (MLflow's "
                "`aup`). Trained with several seeds, it also has each seed's own AUP (that "
                "seed's parallelism and accuracy at every point, the same reference), their mean "
                "and a Student-t 95 % interval over the seeds († a lower bound below 0, cut at "
                "0). The two means differ where seeds spread, the weighting being nonlinear: "
                "the per-seed AUPs are trained models' curves, the curve of seed means is none."
            )
        notes.append(note)
    return notes


def _aup_per_forward(by_curve: dict, headline: str, reference: float) -> str:
    """Each curve's AUP against tokens per forward instead of the factor, where every point
    of it has one (results written before it existed have none)."""
    parts = []
    for name, curve in by_curve.items():
        points = [(p.speed("tokens_per_forward_mean"), p.quality(headline)) for p in curve]
        if all(x is not None for x, _ in points):
            parts.append(f"{name} {100 * aup(points, reference).value:.1f}")
    return "; ".join(parts)


def _aup_text(
    name: str, curve: list[ResultPoint], headline: str, reference: float
) -> tuple[str, bool]:
    """A curve's AUP in words, and whether it came with its seeds' AUPs."""
    means = [(p.speed("parallelism_mean"), p.quality(headline)) for p in curve]
    text = f"{name} {100 * aup(means, reference).value:.1f} ({len(curve)} point"
    text += "s" if len(curve) != 1 else ""
    per_seed = seed_aups([p.seed_pairs("parallelism_mean", headline) for p in curve], reference)
    if per_seed is None:
        return text + ")", False
    low, high = mean_t_interval(per_seed)  # two seeds or more: seed_aups says so
    shown = " / ".join(f"{100 * value:.1f}" for value in per_seed)
    low_text = f"{100 * low:.1f}" if low >= 0 else "0.0†"
    text += (
        f"; per seed {shown}: mean {100 * statistics.fmean(per_seed):.1f} "
        f"[{low_text}, {100 * high:.1f}])"
    )
    return text, True


def _identity_columns(points: list[ResultPoint] = ()) -> list[Column]:
    return [
        Column("model", "model"),
        *checkpoint_column(list(points)),
        Column("policy", "policy"),
        Column("tau", "τ", show=format_tau),
        Column("examples", "examples", 0),
        Column("seeds", "seeds", 0),
    ]


def policy_notes(points: list[ResultPoint]) -> list[str]:
    """What each decoding policy of the rows does, and whether its cache is exact."""
    names = list(dict.fromkeys(p.policy_name for p in points if p.policy_name))
    if not names:
        return []
    described = []
    for name in names:
        info = policy_info(name)
        cache = (
            "exact cache" if info.exact_cache else "approximate cache, trading accuracy for speed"
        )
        described.append(f"{name} ({cache}): {info.summary}")
    return ["Decoding policies (setdlm/families.py): " + "; ".join(described) + "."]


def _decoding_row(point: ResultPoint, spec: TableSpec) -> dict:
    speed = point.metrics.get("speed", {})
    mean = speed.get("tokens_per_second_mean")
    return {
        "task": point.task,
        "model": point.model,
        "checkpoint": checkpoint_cell(point),
        "policy": point.policy_name,
        "tau": point.tau,
        "examples": point.metrics.get("examples"),
        "seeds": len(point.seeds) or 1,
        **{m.name: _cell(m, point) for m in spec.metrics},
        "tokens_per_second": None if mean is None else (mean, speed.get("tokens_per_second_std")),
        "tokens_per_second_median": (
            speed.get("tokens_per_second_median"),
            speed.get("tokens_per_second_min"),
            speed.get("tokens_per_second_max"),
        ),
        "positions_per_token": speed.get("positions_per_token"),
        "parallelism": speed.get("parallelism_mean"),
        "tokens_per_forward": speed.get("tokens_per_forward_mean"),
        "nfe": speed.get("nfe_mean"),
        "latency_p50_seconds": speed.get("latency_seconds_p50"),
        "point": point.key,
        "config_hash": point.metrics.get("config_hash"),
    }


# ------------------------------------------------------------------------------------- GSM8K
PUBLISHED_COLUMNS = [
    Column("published_accuracy", "published acc (%)", 2),
    Column("delta_accuracy", "Δ acc (pp)", 2),
    Column("published_tokens_per_second", "published tok/s", 2, spread=True),
    Column("delta_tokens_per_second", "Δ tok/s", 2),
    Column("published_parallelism", "published parallelism", 2, spread=True),
    Column("delta_parallelism", "Δ parallelism", 2),
    Column("published", "vs published"),
]


GSM8K_TEST_PROBLEMS = 1319


def not_comparable(point: ResultPoint) -> str | None:
    """Why a GSM8K point cannot be compared with the published numbers (None: it can): only
    a published checkpoint, on the whole test set, with the paper's Pareto protocol."""
    spec = point.published_checkpoint()
    settings = point.metrics.get("config", {}).get("task_settings", {})
    if spec is None or spec.task != "gsm8k":
        return "the model is not a published GSM8K checkpoint (trained here, or another one)"
    if settings.get("protocol") != "pareto":
        return f"protocol {settings.get('protocol')!r}, not the paper's Pareto protocol"
    if point.metrics.get("examples") != GSM8K_TEST_PROBLEMS:
        return (
            f"{point.metrics.get('examples')} of the {GSM8K_TEST_PROBLEMS} test problems "
            "(the published points use all of them)"
        )
    return None


def gsm8k_table(results: Results) -> Table:
    """Our points and the published ones in one list, where they can be compared: pairs share
    a row, a published point we did not run has a row of its own ("not run here"). Points of
    models the paper did not publish, or evaluated otherwise, get no Δ: the table says once,
    in words, why they are not comparable."""
    points = results.for_task("gsm8k")
    reasons = {point.key: not_comparable(point) for point in points}
    if points and all(reasons.values()):
        return _gsm8k_table_without_published(results, points, reasons)
    rows, matched = [], set()
    for point in points:
        # the published points decoded with each family's own policy
        reference = (
            paper_numbers.match_gsm8k(point.family, point.size, point.tau)
            if point.policy is None
            else None
        )
        if reference is not None:
            matched.add(id(reference))  # its row is ours, compared or not
        if reasons[point.key]:
            row = _decoding_row(point, GSM8K) | {
                "published": f"not comparable: {reasons[point.key]}"
            }
            rows.append((point.sort_key()[1:], row))
            continue
        row = _decoding_row(point, GSM8K) | _published_cells(reference, point)
        rows.append((point.sort_key()[1:], row))
    for reference in paper_numbers.gsm8k_points():
        if id(reference) not in matched:
            info = family_info(reference.family)
            row = {"model": info.model_name(reference.size)}
            row |= {"policy": info.default_policy.name, "tau": reference.tau}
            row |= _published_cells(reference, None)
            order = (
                FAMILY_NAMES.index(reference.family),
                reference.size or 0,
                row["model"],
                (False, ""),
                -(reference.tau if reference.tau is not None else math.inf),
                "",
            )
            rows.append((order, row))
    rows.sort(key=lambda item: item[0])
    columns = (
        _identity_columns(points)
        + [_column(m) for m in GSM8K.metrics]
        + SPEED_COLUMNS
        + PUBLISHED_COLUMNS
        + TRACE_COLUMNS
    )
    notes = [
        f"{GSM8K.units} {GSM8K_DELTAS}",
        SPEED_NOTE,
        *_result_notes(points, GSM8K, results),
        *checkpoint_notes(points),
        *policy_notes(points),
        *separation_notes(points),
        f"Published numbers: {paper_numbers.PROVENANCE}. Matched by family, size and τ (AR: its "
        "one point). BD3LM's τ were not recorded: they are presumed to follow the sweep "
        f"({', '.join(format_tau(t) for t in paper_numbers.GSM8K_TAUS)}) in order "
        f"('τ presumed'). Published hardware: {paper_numbers.HARDWARE}. Published examples: "
        f"{paper_numbers.EXAMPLES}. "
        "Differences are only meaningful for the published checkpoints evaluated with the "
        "paper's protocol on comparable hardware.",
    ]
    return Table(GSM8K.key, GSM8K.title, columns, [row for _, row in rows], notes)


def _gsm8k_table_without_published(results: Results, points, reasons: dict) -> Table:
    columns = (
        _identity_columns(points)
        + [_column(m) for m in GSM8K.metrics]
        + SPEED_COLUMNS
        + TRACE_COLUMNS
    )
    rows = [_decoding_row(point, GSM8K) for point in points]
    reason_of = {id(point.metrics): reasons[point.key] for point in points}
    why = _grouped(points, lambda metrics: reason_of[id(metrics)])
    notes = [
        GSM8K.units,
        SPEED_NOTE,
        *_result_notes(points, GSM8K, results),
        *checkpoint_notes(points),
        *policy_notes(points),
        *separation_notes(points),
        f"Not comparable with the published numbers ({paper_numbers.PROVENANCE}): {why}. "
        "No Δ is shown; the published points are compared only where the configuration is "
        "the published one.",
    ]
    return Table(GSM8K.key, GSM8K.title, columns, rows, notes)


def _published_cells(reference, point: ResultPoint | None) -> dict:
    if reference is None:
        return {"published": "no published number"}
    ours = {}
    if point is not None:
        batch1 = point.batch1_speed()  # a batched run's tok/s is not the paper's number
        ours = {
            "accuracy": _scaled(point.quality("paper_exact"), 100.0),
            "tokens_per_second": None if batch1 is None else batch1[0],
            "parallelism": point.speed("parallelism_mean"),
        }
    status = "not run here" if point is None else _agreement(point, reference)
    if not reference.tau_recorded and reference.tau is not None:
        status += " (τ presumed)"
    return {
        "published_accuracy": reference.accuracy_percent,
        "delta_accuracy": _difference(ours.get("accuracy"), reference.accuracy_percent),
        "published_tokens_per_second": (
            reference.tokens_per_second,
            reference.tokens_per_second_std,
        ),
        "delta_tokens_per_second": _difference(
            ours.get("tokens_per_second"), reference.tokens_per_second
        ),
        "published_parallelism": (reference.parallelism, reference.parallelism_std),
        "delta_parallelism": _difference(ours.get("parallelism"), reference.parallelism),
        "published": status,
    }


def _scaled(value, scale: float):
    """The value times the scale; counts stay integers when there is nothing to scale."""
    if value is None or scale == 1.0:
        return value
    return value * scale


def _agreement(point: ResultPoint, reference) -> str:
    """ "agrees" only when the published accuracy lies in our 95 % interval of paper_exact:
    the declared tolerance. Speed depends on the hardware and is shown, never judged."""
    interval = point.interval("paper_exact")
    if interval is None:
        return "compared (no interval recorded: agreement not judged)"
    low, high = (100 * bound for bound in interval)
    if low <= reference.accuracy_percent <= high:
        return "accuracy agrees (published value inside our 95 % interval)"
    return "accuracy differs (published value outside our 95 % interval)"


def _difference(ours, theirs):
    return None if ours is None else ours - theirs


# -------------------------------------------------------------------------------- likelihood
def likelihood_table(results: Results) -> Table:
    points = _points_of(LIKELIHOOD, results)
    columns = [
        Column("data", "data"),
        Column("model", "model"),
        *checkpoint_column(points),
        Column("measures", "measures"),
        Column("examples", "sequences", 0),
        *[_column(m) for m in LIKELIHOOD.metrics],
        *TRACE_COLUMNS,
    ]
    rows = [
        {
            "data": TASKS[p.task].data,
            "model": p.model,
            "checkpoint": checkpoint_cell(p),
            "measures": likelihood_measured(p),
            "examples": p.metrics.get("examples"),
            **{m.name: _cell(m, p) for m in LIKELIHOOD.metrics},
            "point": p.key,
            "config_hash": p.metrics.get("config_hash"),
        }
        for p in points
    ]
    notes = [LIKELIHOOD.units, LIKELIHOOD_MEASURES]
    arithmetic = [p for p in points if p.config.get("data") == "arithmetic"]
    if arithmetic:
        problems = _grouped(arithmetic, _problems_text)
        notes.append(f"{LIKELIHOOD_ARITHMETIC} ({problems}).")
    if any(p.interval("nll") is not None for p in points):
        notes += [interval_note(points), LIKELIHOOD_INTERVAL]
    notes += [*_result_notes(points, LIKELIHOOD, results), *checkpoint_notes(points)]
    notes += separation_notes(points)
    notes.append(NO_PUBLISHED)
    return Table(LIKELIHOOD.key, LIKELIHOOD.title, columns, rows, notes)


def likelihood_measured(point: ResultPoint) -> str | None:
    """What a likelihood row's NLL is: its definition in metrics.json, less the unit (exact
    NLL, a NELBO, one order's NLL; with the Monte-Carlo draws), else the family's text."""
    entry = point.metrics.get("quality", {}).get("nll") or {}
    definition = entry.get("definition")
    if definition:
        return definition.split(", nats per counted token")[0]
    return family_info(point.family).likelihood if point.family in FAMILY_NAMES else None


def _problems_text(metrics: dict) -> str:
    problems = (metrics.get("config") or {}).get("problems") or {}
    if not problems:
        return "problems not recorded"
    text = (
        f"{problems.get('count')} {problems.get('split')} problems of {problems.get('generator')}, "
        f"problem seed {problems.get('seed')}"
    )
    if problems.get("excluding"):  # near-duplicates of the training problems left out
        text += ", none a near-duplicate of a training problem"
    return text


# ------------------------------------------------------------------------------------- notes
def _result_notes(points: list[ResultPoint], spec: TableSpec, results: Results) -> list[str]:
    """Where the rows come from: run, examples, hardware, what each metric is."""
    run = results.name
    if not points:
        return [f"No finished results for this table in run '{run}'."]
    notes = [f"Results: run '{run}', {len(points)} finished point(s)."]
    unfinished = [key for key in results.unfinished if key.split("/")[0] in spec.tasks]
    if unfinished:
        notes.append(f"Left out, not finished (no metrics.json): {', '.join(unfinished)}.")
    examples = sorted({p.metrics.get("examples") for p in points}, key=str)
    timed = sorted({p.speed("timed_examples") for p in points if p.speed("timed_examples")})
    text = f"Examples per point: {', '.join(map(str, examples))}"
    if timed:
        text += f" (timed for speed: {', '.join(map(str, timed))})"
    notes.append(text + ".")
    notes.append("Hardware (ours): " + _grouped(points, hardware_summary) + ".")
    decoded = [p for p in points if p.metrics.get("speed", {}).get("timed_examples")]
    if decoded:
        notes.append("Speed protocol: " + _grouped(decoded, speed_protocol_of) + ".")
    for metric in spec.metrics:  # defined by the points that report it (a table may mix tasks)
        reporting = [p for p in points if metric.name in p.metrics.get("quality", {})]
        if reporting:
            notes.append(f"{metric.label}: " + _grouped(reporting, _definition(metric.name)) + ".")
    return notes


def _definition(name: str):
    def definition(metrics: dict) -> str:
        entry = metrics.get("quality", {}).get(name)
        if entry is None:
            return "not reported"
        return entry.get("definition", "no definition").rstrip(".")

    return definition


def _grouped(points: list[ResultPoint], describe) -> str:
    """One description if every point shares it, else each description with its points."""
    by_text: dict[str, list[str]] = {}
    for point in points:
        by_text.setdefault(describe(point.metrics), []).append(point.key)
    if len(by_text) == 1:
        return next(iter(by_text))
    return "; ".join(f"{text} [{', '.join(keys)}]" for text, keys in by_text.items())
