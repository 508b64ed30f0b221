"""The results layout and the names every stage agrees on: the workflow writes it, the reader
(``setdlm/results/reader.py``) reads it for the report and the MLflow sync.

    <results>/runs/<config name>/
        data/                        prepared data laid out like SETDLM_DATA_DIR + manifest.json
        models/<model name>/         a trained model folder (checkpoint.json marks it done), or
                                     checkpoint-<domain>.json markers of fetched checkpoints
        <task>/<model name>/<point>/ one evaluation result: samples.jsonl, metrics.json,
                                     run.json (and throughput.json)
        logs/                        one log per job (flat: nothing in it looks like a result)
    <results>/mlflow.db, <results>/mlartifacts/ (the default MLflow store and its artifacts)
    <results>/tables/<config name>/, <results>/figures/<config name>/

Task names and everything known about each task (its metrics.json ``task``, headline quality,
checkpoint domain, table and figure) are rows of setdlm/tasks/__init__.py; the names below are
read from it.

Model names say the family and size (setdlm/families.py holds the grammar): ``ar``, ``mdlm``,
``bd3lm-s<S>``, ``setdlm-smax<M>`` (M = 2d, the paper's pairing of SetDLM-smax2S with
BD3LM-S), optionally followed by a tag that tells two models of one family and size apart
(``ar-arith``: trained on the arithmetic problems). A decoding point is
``tau-<τ:g>`` (always, even for one τ), or ``<policy>-tau-<τ:g>`` when it decodes with a
policy other than the family's own (setdlm/families.py); likelihood has the single point
``default``.
"""

from __future__ import annotations

import re
from pathlib import Path

from setdlm.families import (  # noqa: F401  (the layout's names)
    MODEL_WILDCARD,
    parse_model_name,
    without_group_names,
)
from setdlm.tasks import PAPER_TABLES, TASK_NAMES, paper_table, table_tasks

RUNS_FOLDER = "runs"
MODELS_FOLDER = "models"  # runs/<config>/models/<model>/: trained or fetched checkpoints
# The folders of a run that hold no results: checkpoints, the jobs' logs and benchmark files
# (logs/<rule>/<task>/<shard>/ is as deep as a result folder), and a run's prepared data.
NOT_RESULT_FOLDERS = frozenset({MODELS_FOLDER, "logs", "benchmarks", "data"})
TRAINED_MARKER = "checkpoint.json"
ARTIFACTS_FOLDER = "mlartifacts"
# The files of a result folder (mirrored as MLflow artifacts, when present).
RESULT_FILES = ("samples.jsonl", "metrics.json", "run.json", "throughput.json")

# The tasks (result folders) and the paper's tables with the tasks each is built from: the
# rows of the task table (setdlm/tasks/__init__.py), named here for the Snakefile's wildcards
# and rules.
TASKS = TASK_NAMES
LIKELIHOOD_POINT = "default"  # the one point of a likelihood task
# The domains of the published checkpoints (models.yaml is keyed "<domain>:<model>"); each
# task's row says which one evaluates it.
DOMAINS = ("gsm8k", "cnndm", "owt", "lm1b")
TABLES = {name: table_tasks(name) for name in PAPER_TABLES}
TABLE_FORMATS = ("md", "csv", "tex")
# One speed-quality figure per decoding task: <figures>/<task>_pareto.{png,pdf}.
FIGURE_FORMATS = ("png", "pdf")


# Written with the arithmetic table: the paper's comparisons as paired differences.
CLAIMS_FILE = "claims"
# A table whose rows aggregate training seeds has a companion with every seed's values.
SEEDS_SUFFIX = "_seeds"


def table_files(folder: str, table: str, seeded: bool = False) -> list[str]:
    """The files of a paper table: its own, its per-seed companion (``seeded``: some of its
    rows aggregate seeds), and the claims table where the table has one (arithmetic)."""
    info = paper_table(table)
    stems = [info.stem]
    if seeded:
        stems.append(info.stem + SEEDS_SUFFIX)
    if info.claims:
        stems.append(CLAIMS_FILE)
    return [f"{folder}/{stem}.{fmt}" for stem in stems for fmt in TABLE_FORMATS]


def figure_files(folder: str, task: str) -> list[str]:
    return [f"{folder}/{task}_pareto.{fmt}" for fmt in FIGURE_FORMATS]


def point_name(threshold: float, policy: str | None = None) -> str:
    """``tau-<τ>`` for the family's own decoding policy (policy None), ``<policy>-tau-<τ>`` for
    another one: each (policy, τ) is a point, and each policy a curve of its own."""
    return f"tau-{threshold:g}" if policy is None else f"{policy}-tau-{threshold:g}"


# A point folder: "default" (likelihood), or [<policy>-]tau-<τ>.
POINT_NAME = re.compile(r"^(?:default|(?:(?P<policy>[a-z][a-z0-9-]*?)-)?tau-(?P<tau>[^/]+))$")
# The same grammar for Snakemake's {point} wildcard (no anchors, no named groups).
POINT_WILDCARD = without_group_names(POINT_NAME.pattern.removeprefix("^").removesuffix("$"))


def run_dir(results: str | Path, name: str) -> Path:
    return Path(results) / "runs" / name


def result_dir(run: str | Path, task: str, model: str, point: str) -> Path:
    return Path(run) / task / model / point
