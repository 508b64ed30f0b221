"""The one table of task facts: every place that needs to know something about an evaluation
task asks here, and an unknown task is an error that lists the known ones.

A task is one kind of result folder (``<run>/<task>/<model>/<point>/``, setdlm/results/
layout.py) and one key of a workflow configuration's ``tasks``. Its row says which
``setdlm eval`` command runs it and with which arguments, which schema node holds its settings
(workflows/config/schema.yaml), which checkpoints evaluate it, what its metrics.json records,
the quality it is judged by and the quality columns it shows, the paper table its points are
rows of (each paper table: its title, files and units), its speed-quality figure, and which
checks hold it.

Adding a task is its evaluation code (a module of this package, next to gsm8k, cnndm, infill,
unconditional, likelihood and arithmetic), a row here, its schema node and its tests
(docs/extending.md, "Adding a task"): the workflow's checks and jobs, the result reader, the
tables, the figures, the checks and MLflow read everything else from this table. The module
imports nothing heavy, and none of the task modules: the workflow reads it before any job runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from setdlm.families import UnknownNameError


class UnknownTaskError(UnknownNameError):
    """A task or paper table name that the table does not hold."""


# A likelihood task's name: likelihood-<data>, the held-out set it scores.
LIKELIHOOD_PREFIX = "likelihood-"
# The domain of the synthetic arithmetic problems: no published checkpoint is trained on them,
# so only models trained here (train.corpus: arithmetic) evaluate its tasks.
ARITHMETIC = "arithmetic"
# Settings of the likelihood node read only with the arithmetic problems (likelihood-arithmetic).
ARITHMETIC_ONLY = ("generator", "problem_seed")

# The ``setdlm eval`` commands and the schema node each builds its options from: the node's
# task settings are the command's options, with the same rules and defaults (util/validation.py).
COMMAND_NODES = {
    "gsm8k": "gsm8k",
    "cnndm": "cnndm",
    "infill": "infill",
    "unconditional": "unconditional",
    "likelihood": "likelihood",
    "arithmetic": "arithmetic-solve",  # infill's settings are solve's, less the budget
}
# The module of this package whose ``run_point(args, loaded, tokenizer, base, out, settings)``
# runs one point of each decoding command (likelihood scores a held-out set, no τ point).
COMMAND_MODULES = {
    "gsm8k": "gsm8k",
    "cnndm": "cnndm",
    "infill": "infill",
    "unconditional": "unconditional",
    "arithmetic": "arithmetic_task",
}


@dataclass(frozen=True)
class PaperTable:
    """One of the paper's tables (`setdlm report tables`; the workflow's rule table_<name>):
    its rows are its tasks' points, its quality columns those its tasks show (in task order)."""

    name: str
    stem: str  # its files: <tables>/<stem>.{md,csv,tex} (and <stem>_seeds.* with seeds)
    title: str
    units: str  # the note saying what its columns' numbers are
    claims: bool = False  # written with the claims table (setdlm/report/claims.py)
    # Tasks of other tables whose points its claims compare too (its job waits for them).
    claims_also: tuple[str, ...] = ()


@dataclass(frozen=True)
class Quality:
    """A quality column of a task's rows in its paper table (setdlm/report/tables.py)."""

    name: str  # its name in metrics.json
    label: str
    scale: float = 1.0  # shown value = metrics.json value × scale
    digits: int = 2
    spread: bool = False  # the entry carries a "std" as well
    interval: bool = False  # the entry carries a 95 % bootstrap interval ("bootstrap_95")


def _percent(name: str, label: str) -> Quality:
    """A fraction shown in % with its interval (accuracies, shares of samples)."""
    return Quality(name, label, 100.0, interval=True)


def _rouge(*names: str) -> tuple[Quality, ...]:
    labels = {
        "rouge1": "ROUGE-1",
        "rouge2": "ROUGE-2",
        "rougeL": "ROUGE-L",
        "rougeLsum": "ROUGE-Lsum",
    }
    return tuple(_percent(name, labels[name]) for name in names)


@dataclass(frozen=True)
class FigureQuality:
    """A further row of a task's figure: another quality against the same two speed axes."""

    metric: str  # its name in metrics.json
    label: str  # the axis label
    scale: float = 1.0  # shown value = metrics.json value × scale


@dataclass(frozen=True)
class FigureInfo:
    """A decoding task's speed-quality figure: <figures>/<task>_pareto.{png,pdf}."""

    title: str
    label: str  # the quality axis (the task's headline quality)
    scale: float = 1.0  # shown value = metrics.json value × scale
    more: tuple[FigureQuality, ...] = ()  # further rows, below the headline's


@dataclass(frozen=True)
class TaskInfo:
    name: str  # result folder, workflow `tasks` key, MLflow experiment
    kind: Literal["decoding", "likelihood"]  # τ points of a decoding policy, or one NLL
    field: str  # the ``task`` its metrics.json records
    command: str  # `setdlm eval <command>` runs it (a key of COMMAND_NODES)
    schema_node: str  # its settings: $defs/<node> of workflows/config/schema.yaml
    # Which checkpoints evaluate it: models.yaml's "<domain>:<model>" (ARITHMETIC: only models
    # trained here on the arithmetic problems).
    domain: str
    table: str  # the paper table its points are rows of (a PAPER_TABLES name)
    headline: str  # the quality it is plotted and compared by (MLflow's `quality`)
    columns: tuple[Quality, ...]  # the qualities its table rows show
    higher_is_better: bool = True
    accuracy: bool = False  # its headline is an accuracy (MLflow logs it as `accuracy` too)
    variant: str | None = None  # `--variant`: which of its command's tasks it is
    data: str | None = None  # `--data`: the held-out set a likelihood task scores
    # The data set the workflow prepares for it (setdlm/workflow/datasets.py; None: none, the
    # problems are generated by code), or the setting that names it (unconditional's references).
    dataset: str | None = None
    dataset_setting: str | None = None
    # Settings of its schema node its evaluation does not read: left out of its identity (the
    # results computed before they existed keep their hash) and of its command line.
    unread: tuple[str, ...] = ()
    figure: FigureInfo | None = None  # decoding tasks
    decoding_check: bool = False  # `setdlm check-decoding` decodes its points (takes --limit)
    # Its counted speed rests on a handful of samples: `setdlm check` allows more across CPUs.
    few_samples: bool = False

    @property
    def decoding(self) -> bool:
        return self.kind == "decoding"

    @property
    def command_node(self) -> str:
        """The schema node its command's options are built from: the workflow writes the task's
        settings in that node's form (a flag, its negation), whatever its own node's defaults."""
        return COMMAND_NODES[self.command]

    @property
    def command_args(self) -> tuple[str, ...]:
        """The arguments that pick it among its command's tasks."""
        variant = ("--variant", self.variant) if self.variant else ()
        return variant + (("--data", self.data) if self.data else ())

    @property
    def trained_here(self) -> bool:
        """Only models trained here evaluate it (the synthetic arithmetic problems)."""
        return self.domain == ARITHMETIC


INTERVALS = "[low, high]: a 95 % interval (how it was computed: the interval note)."
ROUGE_UNITS = "Units: ROUGE F1 × 100; " + INTERVALS
ARITHMETIC_UNCONDITIONAL_UNITS = (
    "Units: % of samples (metrics.json value × 100), each sample read as a problem of the "
    "generator: valid = a question the generator could draw with a solution of its shape; "
    "correct = valid with every step and the answer right; novel = valid and not one of the "
    "model's training questions. MAUVE in [0, 1] against the generator's test problems, "
    "with the offline featurizer (not comparable with gpt2-large MAUVE); gen-PPL under the "
    "first seed of the trained AR arithmetic model (lower is better; that model scores its "
    "own family's samples too, so AR's gen-PPL is flattered); entropy in nats per sample. "
    + INTERVALS
    + " MAUVE and gen-PPL are one number per run: their interval is over seeds only."
)
PAPER_TABLES: dict[str, PaperTable] = {
    table.name: table
    for table in (
        PaperTable(
            "gsm8k",
            "gsm8k_pareto",
            "GSM8K speed-quality (Pareto) points",
            "Units: accuracy in % of problems (metrics.json value × 100); " + INTERVALS,
        ),
        PaperTable("cnndm", "cnndm", "CNN/DailyMail summarization", ROUGE_UNITS),
        PaperTable(
            "infill",
            "rocstories_infill",
            "ROCStories infilling",
            ROUGE_UNITS + " skipped: stories left out because they do not fit the model length.",
        ),
        PaperTable(
            "unconditional",
            "unconditional",
            "Unconditional generation",
            "Units: MAUVE in [0, 1] (bootstrap: mean ± std over reference subsets); gen-PPL is a "
            "perplexity (lower is better); entropy in nats; length in tokens per sample; "
            "rejected: attempts rejected and regenerated (count).",
        ),
        PaperTable(
            "likelihood",
            "likelihood",
            "Held-out likelihood",
            "Units: NLL in nats per counted token (an upper bound for the diffusion families, see "
            "the definitions); perplexity = exp(NLL); bits per token and per UTF-8 byte; tokens "
            "counted. " + INTERVALS,
        ),
        PaperTable(
            "arithmetic",
            "arithmetic_pareto",
            "Synthetic arithmetic: speed against quality as τ falls",
            "Units: % of test problems (metrics.json value × 100); "
            + INTERVALS
            + " arithmetic-solve rows are scored by accuracy (GSM8K answer extraction), "
            "arithmetic-infill rows by whether the masked step is correct as the generator "
            "writes it (either operand order of a + or * step in arithmetic-3 and -4), by "
            "exact match and by its result.",
            claims=True,
            claims_also=("arithmetic-unconditional",),
        ),
        PaperTable(
            "arithmetic_unconditional",
            "arithmetic_unconditional",
            "Synthetic arithmetic: whole problems sampled from BOS as τ falls",
            ARITHMETIC_UNCONDITIONAL_UNITS,
        ),
    )
}


def _infill(variant: str) -> TaskInfo:
    """A ROCStories infilling task: ``variant`` (infill-1, infill-3) names its folder too."""
    return TaskInfo(
        name=variant,
        kind="decoding",
        field=f"rocstories-{variant}",
        command="infill",
        schema_node="infill",
        domain="owt",
        table="infill",
        headline="rougeL",
        columns=(
            *_rouge("rouge1", "rouge2", "rougeL"),
            Quality("skipped_too_long", "skipped", digits=0),
        ),
        variant=variant,
        dataset="rocstories",
        figure=FigureInfo(f"ROCStories {variant}", "ROUGE-L (F1 × 100)", 100.0),
    )


def _likelihood(
    data: str, domain: str, dataset: str | None = None, unread: tuple[str, ...] = ()
) -> TaskInfo:
    """likelihood-<data>: the held-out NLL of ``data`` under ``domain``'s checkpoints."""
    return TaskInfo(
        name=LIKELIHOOD_PREFIX + data,
        kind="likelihood",
        field="likelihood",
        command="likelihood",
        schema_node="likelihood",
        domain=domain,
        table="likelihood",
        headline="nll",
        columns=(
            Quality("nll", "NLL (nats/token)", digits=3, interval=True),
            Quality("perplexity", "perplexity"),
            Quality("bits_per_token", "bits/token", digits=3),
            Quality("bits_per_byte", "bits/byte", digits=3),
            Quality("tokens", "tokens", digits=0),
        ),
        higher_is_better=False,
        data=data,
        dataset=dataset,
        unread=unread,
    )


# The paper infills and samples with the OWT models, and scores each held-out set with its own
# models; WikiText-2 has no published models, and the OWT ones (GPT-2 tokenizer) are the closest.
TASKS: dict[str, TaskInfo] = {
    info.name: info
    for info in (
        TaskInfo(
            name="gsm8k",
            kind="decoding",
            field="gsm8k",
            command="gsm8k",
            schema_node="gsm8k",
            domain="gsm8k",
            table="gsm8k",
            headline="paper_exact",
            columns=(
                _percent("paper_exact", "acc paper_exact (%)"),
                _percent("strict_match", "acc strict_match (%)"),
                _percent("flexible_extract", "acc flexible_extract (%)"),
            ),
            accuracy=True,
            dataset="gsm8k",
            figure=FigureInfo("GSM8K", "accuracy, paper_exact (%)", 100.0),
        ),
        TaskInfo(
            name="cnndm",
            kind="decoding",
            field="cnndm",
            command="cnndm",
            schema_node="cnndm",
            domain="cnndm",
            table="cnndm",
            headline="rougeL",
            columns=_rouge("rouge1", "rouge2", "rougeL", "rougeLsum"),
            dataset="cnn_dailymail",
            figure=FigureInfo("CNN/DailyMail", "ROUGE-L (F1 × 100)", 100.0),
        ),
        _infill("infill-1"),
        _infill("infill-3"),
        TaskInfo(
            name="unconditional",
            kind="decoding",
            field="unconditional",
            command="unconditional",
            schema_node="unconditional",
            domain="owt",
            table="unconditional",
            headline="mauve",
            columns=(
                Quality("mauve", "MAUVE", digits=3),
                Quality("mauve_bootstrap", "MAUVE bootstrap", digits=3, spread=True),
                Quality("gen_ppl", "gen-PPL"),
                Quality("unigram_entropy", "entropy (nats)"),
                Quality("length", "length (tokens)", digits=1),
                Quality("rejection", "rejected", digits=0),
            ),
            dataset_setting="references",
            figure=FigureInfo("Unconditional generation", "MAUVE"),
            few_samples=True,  # the default's 3 samples
        ),
        TaskInfo(
            name="arithmetic-solve",
            kind="decoding",
            field="arithmetic-solve",
            command="arithmetic",
            schema_node="arithmetic-solve",
            domain=ARITHMETIC,
            table="arithmetic",
            headline="strict_match",
            columns=(
                _percent("strict_match", "acc strict (%)"),
                _percent("flexible_extract", "acc flexible (%)"),
            ),
            accuracy=True,
            variant="solve",
            figure=FigureInfo("Synthetic arithmetic (solve)", "accuracy, strict match (%)", 100.0),
            decoding_check=True,
        ),
        TaskInfo(
            name="arithmetic-infill",
            kind="decoding",
            field="arithmetic-infill",
            command="arithmetic",
            schema_node="arithmetic-infill",
            domain=ARITHMETIC,
            table="arithmetic",
            headline="step_correct",
            columns=(
                _percent("step_correct", "infill step correct (%)"),
                _percent("step_exact", "infill step exact (%)"),
                _percent("result_exact", "infill result exact (%)"),
            ),
            variant="infill",
            figure=FigureInfo("Synthetic arithmetic (infill one step)", "step correct (%)", 100.0),
            decoding_check=True,
        ),
        # `setdlm eval unconditional --references arithmetic-<n>`: whole problems sampled from
        # BOS, each judged as a problem of that generator (setdlm/tasks/arithmetic.py)
        TaskInfo(
            name="arithmetic-unconditional",
            kind="decoding",
            field="unconditional",
            command="unconditional",
            schema_node="arithmetic-unconditional",
            domain=ARITHMETIC,
            table="arithmetic_unconditional",
            headline="correct",
            columns=(
                _percent("correct", "correct (%)"),
                _percent("valid", "valid (%)"),
                _percent("novel", "novel (%)"),
                Quality("mauve", "MAUVE", digits=3, interval=True),
                Quality("gen_ppl", "gen-PPL", interval=True),
                Quality("unigram_entropy", "entropy (nats)", interval=True),
                Quality("length", "length (tokens)", digits=1),
            ),
            figure=FigureInfo(
                "Synthetic arithmetic (whole problems sampled from BOS)",
                "correct samples (%)",
                100.0,
                # the paper's unconditional figure plots MAUVE against parallelism
                more=(FigureQuality("mauve", "MAUVE (offline featurizer)"),),
            ),
        ),
        _likelihood("wikitext2", domain="owt", dataset="wikitext2", unread=ARITHMETIC_ONLY),
        _likelihood("owt", domain="owt", dataset="openwebtext", unread=ARITHMETIC_ONLY),
        _likelihood("lm1b", domain="lm1b", dataset="lm1b", unread=ARITHMETIC_ONLY),
        # the synthetic test problems, one per row (models trained on arithmetic)
        _likelihood(ARITHMETIC, domain=ARITHMETIC),
    )
}
TASK_NAMES = tuple(TASKS)  # the order of command-line choices, tables' rows and figures


def task(name: str) -> TaskInfo:
    """The table row of task ``name``; an error naming the known tasks."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise UnknownTaskError(
            f"task {name!r} is not one of {', '.join(TASK_NAMES)} (setdlm/tasks/__init__.py)"
        ) from None


def decoding_tasks() -> tuple[str, ...]:
    return tuple(name for name, info in TASKS.items() if info.decoding)


def likelihood_tasks() -> tuple[str, ...]:
    return tuple(name for name, info in TASKS.items() if not info.decoding)


def figure_tasks() -> tuple[str, ...]:
    """The tasks with a speed-quality figure (every decoding task)."""
    return tuple(name for name, info in TASKS.items() if info.figure is not None)


def variants(command: str) -> tuple[str, ...]:
    """The ``--variant`` choices of a ``setdlm eval`` command (its tasks')."""
    return tuple(
        info.variant for info in TASKS.values() if info.command == command and info.variant
    )


def likelihood_data() -> tuple[str, ...]:
    """The held-out sets ``setdlm eval likelihood --data`` scores."""
    return tuple(info.data for info in TASKS.values() if info.data is not None)


def paper_table(name: str) -> PaperTable:
    """The paper table ``name``; an error naming the known tables."""
    try:
        return PAPER_TABLES[name]
    except (KeyError, TypeError):
        raise UnknownTaskError(
            f"table {name!r} is not one of {', '.join(PAPER_TABLES)} (setdlm/tasks/__init__.py)"
        ) from None


def table_columns(table: str) -> tuple[Quality, ...]:
    """The quality columns of paper table ``table``: its tasks' columns in task order, each
    once."""
    return tuple(dict.fromkeys(q for name in table_tasks(table) for q in TASKS[name].columns))


def table_tasks(table: str) -> tuple[str, ...]:
    """The tasks whose points are rows of paper table ``table``, in the table's order."""
    paper_table(table)
    return tuple(name for name, info in TASKS.items() if info.table == table)
