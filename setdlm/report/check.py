"""The regression check: a finished run's metrics against a committed baseline.

The baseline is JSON: per result point (``task/model/point``), per metric (a dotted path into
that point's ``metrics.json``, e.g. ``quality.paper_exact.value``), the value and what
difference is allowed::

    {"format": 1, "points": {"gsm8k/ar/default": {"metrics": {
        "quality.paper_exact.value": {"value": 0.5, "tolerance": 0},
        "speed.tokens_per_second_mean": {"value": 812.0, "rel_tolerance": 0.9}}}}}

``tolerance`` is an absolute difference, ``rel_tolerance`` a fraction of the baseline value; a
metric passes if it is within either. ``--write`` records every metric that is deterministic on
a CPU (quality, example counts, NFE, parallelism, tokens per forward, positions per token,
generated tokens) with tolerance 0. Timings (tokens/s, latency, memory) depend on the machine
and its load, so they are left out; a maintainer may add one by hand with a loose declared
tolerance, and later ``--write`` runs keep that tolerance and only refresh the value. Each
point also records its config hash and hardware, named in the hints when a check fails.

Float results are reproducible on one CPU model with one thread count, not across them:
another SIMD width, vendor or thread count sums in another order, and training and decoding
amplify the difference into other weights and tokens. So each point also records its numerics
(device, CPU model, CPU capability, torch threads). Where they match, the check is exact (the
tolerances above). Where they differ, each metric is held to its declared ``across_numerics``
rule instead, which ``--write`` records beside the value:

- ``{"statistical": true}`` for a quality mean with a 95 % bootstrap interval: the difference
  of two independent estimates must stay within sqrt(h_baseline^2 + h_now^2) + 1/n, h the
  half-widths of the two intervals and n the examples (one example of slack). On 300 problems
  that is at most 8.3 percentage points, so an accuracy 10 points lower fails wherever the
  weights are the same (a published checkpoint or a committed reference model, on any CPU). A
  point over several training seeds has a two-level interval (seeds, then examples), which
  holds the spread between trainings, so the same rule covers models the run trains once per
  seed. A model the run trains once is another model on another CPU, and its interval ignores
  that (the tables say so); no blanket factor widens it: train several seeds instead
  (`make check`, setdlm/report/decoding_check.py, holds the decoder to token agreement on
  committed weights, whatever the CPU);
- ``{"rel_tolerance": r}`` for counted speed (NFE, parallelism, positions per token, generated
  tokens: 10 %; 50 % where a handful of samples decide it), likelihood (NLL and bits: 5 %;
  perplexity, its exponential: 30 %) and the noisy few-sample quality of unconditional
  generation (50 %: MAUVE and gen-PPL of three samples);
- exact for example counts, whatever the machine.

A note names every point compared by these rules rather than exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from setdlm.report.table import hardware_summary
from setdlm.results.reader import (
    ResultError,
    ResultPoint,
    Results,
    is_number,
    point_sample_problems,
)
from setdlm.tasks import TASKS
from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_json

FORMAT = 1
# Counted, not timed: identical on every rerun of the same code and config on a CPU.
EXACT_SPEED = (
    "generated_tokens",
    "nfe_mean",
    "nfe_total",
    "parallelism_mean",
    "tokens_per_forward_mean",
    "positions_per_token",
    "timed_examples",
    "warmup_examples",
)
COUNTS = ("examples", "speed.timed_examples", "speed.warmup_examples")
TOLERANCES = ("tolerance", "rel_tolerance")  # the declared ones, kept by --write
# The across-numerics rules (module docstring): relative tolerances by kind of metric.
COUNTED_SPEED_TOLERANCE = 0.10
LIKELIHOOD_TOLERANCE = 0.05
PERPLEXITY_TOLERANCE = 0.30
FEW_SAMPLE_TOLERANCE = 0.50
ABOUT = (
    "setdlm check baseline: per result point, per metric (dotted path into metrics.json), the "
    "value and the allowed difference (tolerance: absolute; rel_tolerance: fraction of the "
    "value). Written by `setdlm check --baseline FILE RUN_DIR --write`; timings are left out."
)


class BaselineError(UserError, ValueError):
    """The baseline file is missing or malformed."""


@dataclass(frozen=True)
class Difference:
    point: str
    metric: str
    baseline: str
    now: str
    tolerance: str


def refuse_unbacked_results(results: Results) -> None:
    """Every point's samples.jsonl must hold the examples its metrics.json counts: metrics
    whose samples were lost or cut would pass the comparison while nothing backs them."""
    problems = [problem for point in results.points for problem in point_sample_problems(point)]
    if problems:
        raise ResultError(
            "; ".join(problems) + " (the samples no longer back the metrics.json beside "
            "them, so it is not checked: rerun the point, as the workflow does itself)"
        )


def checked_metrics(point: ResultPoint) -> dict[str, float]:
    """The metrics ``--write`` records for a point: dotted path -> value."""
    metrics = point.metrics
    values = {"examples": metrics.get("examples")}
    for name, entry in sorted(metrics.get("quality", {}).items()):
        values[f"quality.{name}.value"] = entry.get("value")
    for name in EXACT_SPEED:
        values[f"speed.{name}"] = metrics.get("speed", {}).get(name)
    return {path: value for path, value in values.items() if is_number(value)}


def lookup(metrics: dict, path: str):
    value = metrics
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if is_number(value) else None


def load_baseline(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise BaselineError(f"baseline {path} does not exist (create it with --write)")
    try:
        baseline = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8 text
        raise BaselineError(f"baseline {path} is not valid JSON: {error}") from None
    if not isinstance(baseline, dict):
        raise BaselineError(f"baseline {path}: expected format {FORMAT} with a 'points' object")
    if baseline.get("format") != FORMAT or not isinstance(baseline.get("points"), dict):
        raise BaselineError(f"baseline {path}: expected format {FORMAT} with a 'points' object")
    from setdlm.results.baselines import CHECK, check_baseline

    check_baseline(path, baseline, CHECK, BaselineError)
    for key, entry in baseline["points"].items():
        for metric, spec in entry.get("metrics", {}).items():
            _validate(path, key, metric, spec)
    return baseline


def _validate(path: Path, key: str, metric: str, spec) -> None:
    where = f"baseline {path}, point {key}, metric {metric}"
    if not isinstance(spec, dict) or not is_number(spec.get("value")):
        raise BaselineError(f"{where}: expected {{'value': number, 'tolerance': number}}")
    tolerances = [spec.get(name) for name in TOLERANCES if name in spec]
    if not tolerances:
        raise BaselineError(f"{where}: declare a tolerance (0 for exact) or a rel_tolerance")
    if not all(is_number(t) and t >= 0 for t in tolerances):
        raise BaselineError(f"{where}: tolerances must be numbers >= 0, got {tolerances}")
    rule = spec.get("across_numerics")
    if rule is not None and not _valid_rule(rule):
        raise BaselineError(
            f"{where}: across_numerics must be {{'statistical': true}}, {{'tolerance': x}} or "
            f"{{'rel_tolerance': x}} with x >= 0, got {rule!r}"
        )


def _valid_rule(rule) -> bool:
    if not isinstance(rule, dict):
        return False
    if rule.get("statistical") is True:
        spread = rule.get("training_spread", 0)
        return is_number(spread) and spread >= 0
    values = [rule.get(name) for name in TOLERANCES if name in rule]
    return bool(values) and all(is_number(v) and v >= 0 for v in values)


def numerics(metrics: dict) -> dict:
    """What float results depend on besides code and config."""
    hardware = metrics.get("hardware") or {}
    return {key: hardware.get(key) for key in ("device", "cpu", "cpu_capability", "torch_threads")}


def across_numerics_rule(point: ResultPoint, metric: str) -> dict:
    """How ``metric`` of ``point`` is compared when computed with other numerics."""
    if metric in COUNTS:
        return {"tolerance": 0}
    if metric.startswith("speed."):
        # a task whose counted speed rests on a handful of samples (setdlm/tasks/__init__.py)
        few = point.task in TASKS and TASKS[point.task].few_samples
        return {"rel_tolerance": FEW_SAMPLE_TOLERANCE if few else COUNTED_SPEED_TOLERANCE}
    name = metric.split(".")[1]
    # Likelihood before intervals: its NLL has had an interval over sequences since the
    # likelihood-arithmetic task, but the statistical rule's one-example slack is a proportion's.
    if point.task in TASKS and not TASKS[point.task].decoding:
        if name == "perplexity":  # exp(NLL): 5 % of an NLL near 5 nats is 29 % of it
            return {"rel_tolerance": PERPLEXITY_TOLERANCE}
        return {"rel_tolerance": LIKELIHOOD_TOLERANCE}
    if point.interval(name) is not None:
        return {"statistical": True}
    return {"rel_tolerance": FEW_SAMPLE_TOLERANCE}


def statistical_tolerance(baseline_interval, now_interval, examples: int) -> float:
    """The difference two independent estimates may show: their half-widths in quadrature,
    plus one example's worth."""
    half = [(high - low) / 2 for low, high in (baseline_interval, now_interval)]
    return math.hypot(*half) + 1 / max(examples, 1)


def compare(results: Results, baseline: dict, notes: list[str] | None = None):
    """Every difference between the results and the baseline, and the metrics compared.

    Points computed with other numerics than recorded are compared by each metric's
    ``across_numerics`` rule (the module docstring); a line per such point goes to ``notes``.
    """
    found = {point.key: point for point in results.points}
    expected = baseline["points"]
    differences, compared = [], 0
    for key in sorted(expected):
        point = found.get(key)
        if point is None:
            why = "unfinished (no metrics.json)" if key in results.unfinished else "missing"
            differences.append(Difference(key, "(whole point)", "present", why, "-"))
            continue
        specs = expected[key].get("metrics", {})
        recorded = expected[key].get("numerics")
        exact = recorded is None or recorded == numerics(point.metrics)
        if not exact and notes is not None:
            notes.append(
                f"note: {key}: computed with {_numerics_text(numerics(point.metrics))}, the "
                f"baseline with {_numerics_text(recorded)}: compared by the across-numerics "
                "rules (statistical for quality with an interval, declared relative "
                "tolerances otherwise), not exactly"
            )
        for metric, spec in sorted(specs.items()):
            compared += 1
            now = lookup(point.metrics, metric)
            rule = spec if exact else _across(point, metric, spec)
            if now is None:
                differences.append(
                    Difference(key, metric, _show(spec["value"]), "missing", _tolerance(rule))
                )
            elif not within(now, rule):
                differences.append(
                    Difference(key, metric, _show(spec["value"]), _show(now), _tolerance(rule))
                )
        for metric in sorted(set(checked_metrics(point)) - set(specs)):
            now = _show(lookup(point.metrics, metric))
            differences.append(Difference(key, metric, "not in baseline", now, "-"))
    for key in sorted(set(found) - set(expected)):
        differences.append(
            Difference(key, "(whole point)", "not in baseline", "present (extra point)", "-")
        )
    return differences, compared


def _across(point: ResultPoint, metric: str, spec: dict) -> dict:
    """The baseline value with the tolerance of its across-numerics rule (recorded, or the
    rule for results written before rules were recorded)."""
    rule = spec.get("across_numerics")
    if rule is None and metric not in checked_metrics(point):
        return spec  # added by hand with its own tolerance: that one holds everywhere
    rule = rule or across_numerics_rule(point, metric)
    if not rule.get("statistical"):
        return {"value": spec["value"], **rule}
    name = metric.split(".")[1]
    now, recorded = point.interval(name), spec.get("bootstrap_95")
    if now is None or recorded is None:  # nothing to build the tolerance from: exact
        return {"value": spec["value"], "tolerance": 0}
    examples = point.metrics.get("examples") or 1
    tolerance = max(statistical_tolerance(recorded, now, examples), rule.get("training_spread", 0))
    return {"value": spec["value"], "tolerance": tolerance, "statistical": True}


def _numerics_text(numerics: dict | None) -> str:
    if not numerics:
        return "unrecorded numerics"
    return ", ".join(f"{key} {value}" for key, value in numerics.items())


def within(now: float, spec: dict) -> bool:
    expected = spec["value"]
    if math.isnan(expected) or math.isnan(now):
        return math.isnan(expected) and math.isnan(now)
    allowed = max(spec.get("tolerance", 0), spec.get("rel_tolerance", 0) * abs(expected))
    return abs(now - expected) <= allowed


def updated_baseline(results: Results, previous: dict | None) -> dict:
    """The baseline of these results; declared tolerances (and hand-added metrics) of points
    already in ``previous`` are kept, only their values are refreshed."""
    old_points = (previous or {}).get("points", {})
    points = {}
    for point in results.points:
        old = old_points.get(point.key, {}).get("metrics", {})
        metrics = {}
        recorded = checked_metrics(point)
        for metric in sorted(set(recorded) | set(old)):
            value = lookup(point.metrics, metric)
            if value is None:
                continue  # a hand-added metric this result no longer has
            tolerance = {k: v for k, v in old.get(metric, {}).items() if k in TOLERANCES}
            entry = {"value": value, **(tolerance or {"tolerance": 0})}
            rule = old.get(metric, {}).get("across_numerics")
            if rule is None and metric in recorded:
                rule = across_numerics_rule(point, metric)
            if rule is not None:
                entry["across_numerics"] = rule
            if rule and rule.get("statistical"):
                entry["bootstrap_95"] = list(point.interval(metric.split(".")[1]))
            metrics[metric] = entry
        points[point.key] = {
            "config_hash": point.metrics.get("config_hash"),
            "hardware": hardware_summary(point.metrics),
            "numerics": numerics(point.metrics),
            "metrics": metrics,
        }
    return {"about": ABOUT, "format": FORMAT, "points": points}


def write_baseline(results: Results, path: str | Path) -> tuple[dict, dict | None]:
    path = Path(path)
    previous = load_baseline(path) if path.exists() else None
    baseline = updated_baseline(results, previous)
    atomic_write_json(path, baseline)
    return baseline, previous


# ---------------------------------------------------------------------------------- reports
def failure_report(
    differences: list[Difference], results: Results, baseline: dict, baseline_path
) -> str:
    rows = [("point", "metric", "baseline", "now", "tolerance")]
    rows += [(d.point, d.metric, d.baseline, d.now, d.tolerance) for d in differences]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [
        f"setdlm check: FAILED, {len(differences)} difference(s) between {results.run_dir} "
        f"and baseline {baseline_path}",
        "",
        *(
            "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ),
    ]
    hints = _hints(differences, results, baseline)
    if hints:
        lines += ["", *hints]
    lines += [
        "",
        "If the change is intended, update the baseline and commit it:",
        f"  setdlm check --baseline {baseline_path} {results.run_dir} --write",
    ]
    return "\n".join(lines)


def _hints(differences, results: Results, baseline: dict) -> list[str]:
    """Why values may differ for reasons other than a regression: another config or machine."""
    found = {point.key: point for point in results.points}
    hints = []
    for key in sorted({d.point for d in differences}):
        point, recorded = found.get(key), baseline["points"].get(key)
        if point is None or recorded is None:
            continue
        if recorded.get("config_hash") not in (None, point.metrics.get("config_hash")):
            hints.append(
                f"hint: {key}: config hash {recorded['config_hash']} in the baseline, "
                f"{point.metrics.get('config_hash')} now (the configuration, or the model's "
                "path, changed)"
            )
        if recorded.get("hardware") not in (None, hardware_summary(point.metrics)):
            hints.append(
                f"hint: {key}: baseline written on {recorded['hardware']}, now "
                f"{hardware_summary(point.metrics)} (float results can differ across CPUs "
                "and thread counts)"
            )
    return hints


def _tolerance(spec: dict) -> str:
    parts = []
    if spec.get("statistical"):
        return f"±{spec['tolerance']:.4g} (95 % intervals)"
    if "tolerance" in spec:
        parts.append("0 (exact)" if spec["tolerance"] == 0 else f"±{_show(spec['tolerance'])}")
    if "rel_tolerance" in spec:
        parts.append(f"±{_show(spec['rel_tolerance'] * 100)}%")
    return " or ".join(parts)


def _show(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)
