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

RUNS_FOLDER = "runs"
MODELS_FOLDER = "models"  # runs/<config>/models/<model>/: trained or fetched checkpoints
TRAINED_MARKER = "checkpoint.json"
ARTIFACTS_FOLDER = "mlartifacts"
# The files of a result folder (mirrored as MLflow artifacts, when present).
RESULT_FILES = ("samples.jsonl", "metrics.json", "run.json", "throughput.json")

# arithmetic-*: the synthetic task of setdlm/eval/arithmetic.py (solve, infill one step, and
# sample whole problems from BOS: `setdlm eval unconditional --references arithmetic-<n>`)
ARITHMETIC_TASKS = ("arithmetic-solve", "arithmetic-infill", "arithmetic-unconditional")
DECODING_TASKS = ("gsm8k", "cnndm", "infill-1", "infill-3", "unconditional", *ARITHMETIC_TASKS)
# likelihood-<data>: the held-out set each likelihood task reads
LIKELIHOOD_TASKS = {
    "likelihood-wikitext2": "wikitext2",
    "likelihood-owt": "owt",
    "likelihood-lm1b": "lm1b",
    # the synthetic arithmetic test problems, one per row (models trained on arithmetic)
    "likelihood-arithmetic": "arithmetic",
}
TASKS = (*DECODING_TASKS, *LIKELIHOOD_TASKS)
LIKELIHOOD_PREFIX = "likelihood-"
LIKELIHOOD_POINT = "default"
# Task folder -> the ``task`` field its evaluation writes into metrics.json (likelihood-<data>:
# "likelihood", on the data its config names).
TASK_FIELDS = {
    "gsm8k": "gsm8k",
    "cnndm": "cnndm",
    "infill-1": "rocstories-infill-1",
    "infill-3": "rocstories-infill-3",
    "unconditional": "unconditional",
    "arithmetic-solve": "arithmetic-solve",
    "arithmetic-infill": "arithmetic-infill",
    "arithmetic-unconditional": "unconditional",
}
# The quality each task is plotted and compared by (its figure's y axis, MLflow's `quality`).
HEADLINE_QUALITY = {
    "gsm8k": "paper_exact",
    "cnndm": "rougeL",
    "infill-1": "rougeL",
    "infill-3": "rougeL",
    "unconditional": "mauve",
    "arithmetic-solve": "strict_match",
    "arithmetic-infill": "step_exact",
    "arithmetic-unconditional": "correct",
}
LIKELIHOOD_HEADLINE = "nll"

# Which published checkpoint a task uses (models.yaml is keyed "<domain>:<model>"): the paper
# infills and samples with the OWT models, and scores each held-out set with its own models.
# WikiText-2 has no published models; the OWT ones (GPT-2 tokenizer) are the closest.
TASK_DOMAIN = {
    "gsm8k": "gsm8k",
    "cnndm": "cnndm",
    "infill-1": "owt",
    "infill-3": "owt",
    "unconditional": "owt",
    "likelihood-wikitext2": "owt",
    "likelihood-owt": "owt",
    "likelihood-lm1b": "lm1b",
    # no published checkpoint is trained on it: only models trained here evaluate it
    "arithmetic-solve": "arithmetic",
    "arithmetic-infill": "arithmetic",
    "arithmetic-unconditional": "arithmetic",
    "likelihood-arithmetic": "arithmetic",
}
DOMAINS = ("gsm8k", "cnndm", "owt", "lm1b")

# The paper's tables and the tasks each is built from.
TABLES = {
    "gsm8k": ("gsm8k",),
    "cnndm": ("cnndm",),
    "infill": ("infill-1", "infill-3"),
    "unconditional": ("unconditional",),
    "likelihood": tuple(LIKELIHOOD_TASKS),
    "arithmetic": ("arithmetic-solve", "arithmetic-infill"),
    "arithmetic_unconditional": ("arithmetic-unconditional",),
}
TABLE_FORMATS = ("md", "csv", "tex")
# The file name `setdlm report tables` gives each table: <tables>/<stem>.{md,csv,tex}.
TABLE_FILES = {
    "gsm8k": "gsm8k_pareto",
    "cnndm": "cnndm",
    "infill": "rocstories_infill",
    "unconditional": "unconditional",
    "likelihood": "likelihood",
    "arithmetic": "arithmetic_pareto",
    "arithmetic_unconditional": "arithmetic_unconditional",
}
# One speed-quality figure per decoding task: <figures>/<task>_pareto.{png,pdf}.
FIGURE_FORMATS = ("png", "pdf")


# Written with the arithmetic table: the paper's comparisons as paired differences.
CLAIMS_FILE = "claims"
# A table whose rows aggregate training seeds has a companion with every seed's values.
SEEDS_SUFFIX = "_seeds"


def table_files(folder: str, table: str, seeded: bool = False) -> list[str]:
    """The files of a paper table: its own, its per-seed companion (``seeded``: some of its
    rows aggregate seeds), and for the arithmetic table the claims table."""
    stems = [TABLE_FILES[table]]
    if seeded:
        stems.append(TABLE_FILES[table] + SEEDS_SUFFIX)
    if table == "arithmetic":
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
