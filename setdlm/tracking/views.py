"""Saved views of an experiment in the MLflow UI: what opens, in zero clicks, from one URL.

MLflow's front end keeps a view (search, sort, grouping, columns, charts) as an experiment tag
``mlflow.sharedViewState.<key>`` and opens it from ``#/experiments/<id>/runs?viewStateShareKey=
<key>``. The format below is the one the installed front end reads and writes; it is not a
public API, so it is pinned to MLflow 3.17.2 here and in tests/test_tracking.py (a test fails
when the installed front end no longer contains what this module relies on). Read from
mlflow/server/js/build/static/js (MLflow 3.17.2):

- main.*.js: ``U="viewStateShareKey"``, ``$="mlflow.sharedViewState."`` (the tag prefix) and
  ``T="mlflow.runColor"`` (a run's colour in tables and charts, a run tag);
- 3448.*.chunk.js, module 53787: the tag's value is an envelope,
  ``JSON.stringify({name, createdAt, updatedAt, state})``, refused unless ``name`` is a string,
  ``createdAt`` a number and ``state`` a string; ``state`` is read as
  ``ib(state) ? await U1(state) : state`` and then ``JSON.parse``d;
- main.*.js, module 58180: ``ib`` tests the prefix ``"deflate;"`` and ``U1`` inflates
  ``base64(pako.deflate(text))`` after it (zlib). The UI writes that compressed form; the
  plain JSON string written here is the other branch of the same read, and stays readable;
- 5439.*.chunk.js (the "Save view" dialog): ``state`` is ``{...searchFacetsState,
  ...uiState}`` without the per-user keys; the view's link is the runs tab with
  ``viewStateShareKey`` and ``compareRunsMode`` (``TABLE`` or ``CHART``); the UI refuses to
  save an envelope over 20,000 characters and more than 40 views per experiment;
- 3793.*.chunk.js, module 57637: the search facets are ``searchFilter``, ``orderByKey``,
  ``orderByAsc``, ``startTime``, ``lifecycleFilter``, ``modelVersionFilter`` and
  ``datasetsFilter``; a link that carries any of them in its query ignores the shared view;
- main.*.js, module 1395: the UI state keys a view restores (``selectedColumns``,
  ``columnOrder``, ``columnWidths``, ``runsHiddenMode``, ``compareRunCharts``,
  ``compareRunSections``, ``isAccordionReordered``, ``groupBy``, ``useGroupedValuesInCharts``,
  ``hideEmptyCharts``, ...); a column is ``<params|metrics|attributes>.`<name>```;
- main.*.js, module 7975: ``workflowType=machine_learning`` in the link's query opens the
  classic (model training) view instead of the GenAI one, without changing the user's default.

The views themselves are pure data (no MLflow import): ``experiment_views`` says what each
experiment shows, ``view_tag`` writes the tag, ``view_url`` the link.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import dataclass

MLFLOW_FRONT_END = "3.17.2"  # the front end the format below was read from
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
SHARE_KEY_PARAM = "viewStateShareKey"
COMPRESSED_PREFIX = "deflate;"  # the front end's own compressed form (read here, not written)
MAX_ENVELOPE_CHARACTERS = 20_000  # the front end refuses to save a larger view
MAX_VIEWS = 40  # per experiment, in the front end's "Views" menu
RUN_COLOR_TAG = "mlflow.runColor"
CLASSIC_VIEW = "workflowType=machine_learning"

# What the views filter on: the run tag setdlm.level (record.py) is "sweep", "point" or "seed".
LEVEL_TAG = "setdlm.level"
CHART, TABLE = "CHART", "TABLE"


@dataclass(frozen=True)
class View:
    key: str  # the share key: the tag is VIEW_TAG_PREFIX + key
    name: str  # as the "Views" menu lists it
    mode: str  # CHART or TABLE: the link's compareRunsMode
    state: dict  # search facets and UI state, as the front end keeps them


@dataclass(frozen=True)
class ExperimentFacts:
    """What the views of one experiment need to know about its runs."""

    task: str
    config_name: str
    quality: str  # the y axis: "accuracy" on accuracy tasks, else "quality"
    headline: str | None  # which quality it is (strict_match, rougeL, nll, ...)
    higher_is_better: bool
    decoding: bool  # the points have speed metrics (parallelism, tokens per second)
    thresholds: bool  # some points have a confidence threshold τ (tau_log10)
    sweeps: bool  # some sweep has several points: a table of the sweeps is worth a view


def column(kind: str, name: str) -> str:
    """A runs-table column as the front end names it: params.`W`, metrics.`quality`."""
    return f"{kind}.`{name}`"


def share_key(config_name: str, name: str) -> str:
    """A share key that is safe in a URL and in a tag name: setdlm-<config>-<name>."""
    config = re.sub(r"[^A-Za-z0-9_-]+", "-", config_name).strip("-") or "results"
    return f"setdlm-{config}-{name}"


def experiment_views(facts: ExperimentFacts) -> list[View]:
    """The views of one experiment: the speed-quality charts (the one to open first), the
    points' key metrics by family, and the sweeps' summaries."""
    better = "higher" if facts.higher_is_better else "lower"
    quality = facts.quality
    title = f"{quality} ({facts.headline}, {better} is better)" if facts.headline else quality
    config = facts.config_name
    points = _filter("point", config)
    charts, sections = _charts(facts)
    chart_name = f"{config}: {title} vs speed" if facts.decoding else f"{config}: {title}"
    # one state for both: the same runs, order, columns and charts; the link's mode differs
    point_state = _state(
        points,
        column("metrics", quality),
        ascending=not facts.higher_is_better,
        columns=_point_columns(facts),
        group_by_family=True,
        charts=charts,
        sections=sections,
    )
    views = [
        View(
            share_key(config, "charts"),
            chart_name,
            CHART,
            point_state,
        ),
        View(
            share_key(config, "points"),
            f"{config}: key metrics by family",
            TABLE,
            point_state,
        ),
    ]
    if facts.sweeps:
        summary = "aup" if facts.decoding and facts.higher_is_better else f"best_{quality}"
        bars = [
            _bar(f"setdlm-{name}", name) for name in dict.fromkeys([summary, f"best_{quality}"])
        ]
        views.append(
            View(
                share_key(config, "sweeps"),
                f"{config}: sweeps (best {quality}" + (", AUP)" if summary == "aup" else ")"),
                TABLE,
                _state(
                    _filter("sweep", config),
                    column("metrics", summary),
                    ascending=summary != "aup" and not facts.higher_is_better,
                    columns=_sweep_columns(facts),
                    group_by_family=False,
                    charts=bars,
                    sections=_sections("Sweeps"),
                ),
            )
        )
    return views


def _filter(level: str, config_name: str) -> str:
    return f"tags.`{LEVEL_TAG}` = '{level}' and params.config_name = '{config_name}'"


def _point_columns(facts: ExperimentFacts) -> list[str]:
    params = ["model", "policy", "tau"] if facts.decoding else ["model"]
    metrics = [facts.quality, "quality_low", "quality_high"]
    if facts.decoding:
        metrics += ["parallelism", "tokens_per_forward", "tokens_per_second", "nfe"]
    if facts.thresholds:
        metrics += ["tau_log10"]
    return [column("params", p) for p in params] + [column("metrics", m) for m in metrics]


def _sweep_columns(facts: ExperimentFacts) -> list[str]:
    params = ["model", "policy", "family"] if facts.decoding else ["model", "family"]
    metrics = [f"best_{facts.quality}"]
    if facts.decoding and facts.higher_is_better:
        metrics += ["aup", "aup_tokens_per_forward"]
    metrics.append("points")
    return [column("params", p) for p in params] + [column("metrics", m) for m in metrics]


SECTION = "setdlm-speed-quality"


def _charts(facts: ExperimentFacts) -> tuple[list[dict], list[dict]]:
    """Scatter charts of quality against the parallelism factor, tokens per forward and tokens
    per second (and log10 τ), or a bar chart of quality where nothing was decoded
    (likelihood), in a section of their own above MLflow's generated ones (one chart per
    metric, folded away)."""
    y = facts.quality
    if facts.decoding:
        axes = ["parallelism", "tokens_per_forward", "tokens_per_second"]
        axes += ["tau_log10"] if facts.thresholds else []
        charts = [_scatter(f"setdlm-{y}-vs-{x}", x, y) for x in axes]
        name = "Speed and quality"
    else:
        better = "higher" if facts.higher_is_better else "lower"
        label = f"{y} ({facts.headline}, {better} is better)" if facts.headline else y
        charts = [_bar(f"setdlm-{y}", y, label)]
        name = "Quality"
    return charts, _sections(name)


def _sections(name: str) -> list[dict]:
    return [
        {"uuid": SECTION, "name": name, "display": True, "isReordered": False,
         "deleted": False, "isGenerated": False, "columns": 2, "cardHeight": 420},
        # MLflow adds a chart for every other metric; they stay in its own sections, folded.
        {"uuid": "setdlm-model-metrics", "name": "Model metrics", "display": False,
         "isReordered": False, "deleted": False, "isGenerated": True},
        {"uuid": "setdlm-system-metrics", "name": "System metrics", "display": False,
         "isReordered": False, "deleted": False, "isGenerated": True},
    ]  # fmt: skip


def _card(uuid: str, kind: str) -> dict:
    return {
        "uuid": uuid,
        "type": kind,
        "runsCountToCompare": 100,
        "metricSectionId": SECTION,
        "deleted": False,
        "isGenerated": False,
    }


def _scatter(uuid: str, x: str, y: str) -> dict:
    return _card(uuid, "SCATTER") | {
        "xaxis": {"key": x, "type": "METRIC"},
        "yaxis": {"key": y, "type": "METRIC"},
    }


def _bar(uuid: str, metric: str, label: str | None = None) -> dict:
    return _card(uuid, "BAR") | {"metricKey": metric, "displayName": label or metric}


def _state(
    search: str,
    order_by: str,
    ascending: bool,
    columns: list[str],
    group_by_family: bool,
    charts: list[dict],
    sections: list[dict],
) -> dict:
    run_name = column("attributes", "Run Name")
    family = {"mode": "param", "groupByData": "family"}
    group = {"aggregateFunction": "average", "groupByKeys": [family]}
    return {
        # search facets (module 57637; the rest of them at the front end's defaults)
        "searchFilter": search,
        "orderByKey": order_by,
        "orderByAsc": ascending,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        # UI state (module 1395)
        "selectedColumns": columns,
        "columnOrder": [run_name, *columns],
        "columnWidths": {run_name: 260, column("params", "model"): 170},
        "runsHiddenMode": "SHOW_ALL",  # the default shows only the first 10 runs in charts
        "compareRunCharts": charts,
        "compareRunSections": sections,
        "isAccordionReordered": True,  # keep this section order
        "groupBy": group if group_by_family else None,
        "groupsExpanded": {},
        "useGroupedValuesInCharts": False,  # every point in the charts, not a group's mean
        "hideEmptyCharts": True,
        "viewMaximized": False,
        "runListHidden": False,
    }


def view_tag(view: View, created_ms: int, updated_ms: int | None = None) -> tuple[str, str]:
    """The experiment tag that holds ``view``: its name and value (the envelope)."""
    envelope = {
        "name": view.name,
        "createdAt": created_ms,
        "updatedAt": created_ms if updated_ms is None else updated_ms,
        "state": json.dumps(view.state, sort_keys=True),
    }
    return VIEW_TAG_PREFIX + view.key, json.dumps(envelope)


def read_view_tag(value: str) -> tuple[str, dict, int, int] | None:
    """(name, state, createdAt, updatedAt) of a view tag's value, the front end's compressed
    form included; None for a value the front end would refuse."""
    try:
        envelope = json.loads(value)
        name, state = envelope["name"], envelope["state"]
        created = envelope["createdAt"]
        if not (isinstance(name, str) and isinstance(state, str)):
            return None
        if not isinstance(created, int | float) or isinstance(created, bool):
            return None
        if state.startswith(COMPRESSED_PREFIX):
            raw = base64.b64decode(state.removeprefix(COMPRESSED_PREFIX))
            state = zlib.decompress(raw).decode()
        updated = envelope.get("updatedAt", created)
        return name, json.loads(state), int(created), int(updated)
    except (ValueError, KeyError, TypeError, zlib.error):
        return None


def mode_of(key: str) -> str:
    """The mode a view of ``experiment_views`` opens in, from its share key."""
    return CHART if key.endswith("-charts") else TABLE


@dataclass(frozen=True)
class SavedView:
    experiment: str
    experiment_id: str
    key: str
    name: str
    updated_ms: int

    def url(self, base: str) -> str:
        return view_url(base, self.experiment_id, self.key, mode_of(self.key))


def saved_views(experiments) -> list[SavedView]:
    """This project's views (share key setdlm-...) among the experiments' tags: the main
    experiment's speed-quality charts first (the first task of DECODING_ORDER that has them,
    the latest saved), then every experiment's views by name."""
    found = []
    for experiment in experiments:
        for tag, value in experiment.tags.items():
            key = tag.removeprefix(VIEW_TAG_PREFIX)
            if tag == key or not key.startswith("setdlm-"):
                continue
            saved = read_view_tag(value)
            if saved is not None:
                name, _, _, updated = saved
                found.append(
                    SavedView(experiment.name, experiment.experiment_id, key, name, updated)
                )

    def order(view: SavedView) -> tuple:
        rank = DECODING_ORDER.index(view.experiment) if view.experiment in DECODING_ORDER else 99
        kind = next((i for i, end in enumerate(VIEW_ORDER) if view.key.endswith(end)), 9)
        return (rank, view.experiment, kind, -view.updated_ms, view.name)

    return sorted(found, key=order)


VIEW_ORDER = ("-charts", "-points", "-sweeps")  # an experiment's views, as listed
# The experiment whose charts `setdlm ui` opens: the first of these that has them (the paper's
# headline task, then the default's), else any.
DECODING_ORDER = (
    "gsm8k",
    "arithmetic-solve",
    "cnndm",
    "infill-1",
    "infill-3",
    "unconditional",
    "arithmetic-infill",
    "arithmetic-unconditional",
)


def view_url(base: str, experiment_id: str, key: str, mode: str) -> str:
    """The link that opens a view in the classic (model training) experiment page."""
    query = f"{SHARE_KEY_PARAM}={key}&compareRunsMode={mode}&{CLASSIC_VIEW}"
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"
