"""The benchmark as a DAG: prepare data -> train or fetch models -> evaluate every point ->
MLflow -> tables and figures.

    snakemake --cores 2 all_tables                   # the tiny default (workflows/config/tiny.yaml)
    snakemake --profile slurm all_tables             # the paper's matrix on SLURM (README)
    snakemake --profile slurm -n all_tables --configfile workflows/config/paper.yaml

Targets: all_tables (tables, figures, MLflow, the data manifest; `all`, the default, is the
same), all_figures, all_evaluations, one per paper table (table_gsm8k, table_cnndm,
table_infill, table_unconditional, table_likelihood) and check (against check.baseline).
The configuration is validated before any job is queued; the jobs come from
setdlm/workflow/plan.py, and each rule in workflows/rules/ runs one `setdlm ...` command.
"""

import os
import sys
from pathlib import Path

from setdlm.results import layout
from setdlm.workflow import datasets
from setdlm.workflow import plan as workflow_plan
from setdlm.workflow.config import ConfigError, check_files
from setdlm.workflow.references import forecast
from setdlm.workflow.invocation import command_line_skips_the_lock, executes
from setdlm.workflow.locks import lock_holders, lock_message

# Snakemake's own lock message is the same whether the run holding the lock is alive or was
# killed; say which, before it refuses to start (nothing is printed when nothing is locked,
# nor in a job's own process, which runs under the head's lock). Under --nolock it does not
# refuse: then say only that another run is alive here.
_HOLDERS = lock_holders(Path.cwd()) if workflow.is_main_process else None
if _HOLDERS is not None:
    _MESSAGE = lock_message(Path.cwd(), _HOLDERS, nolock=command_line_skips_the_lock())
    if _MESSAGE:
        print(_MESSAGE, file=sys.stderr)


# The embedded default, unless --configfile (or the profile) names a configuration: loading
# both would merge them key by key.
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/workflows/config/tiny.yaml"


# The files the configuration came from, named in its errors.
CONFIG_FILES = ", ".join(map(str, workflow.overwrite_configfiles)) or "workflows/config/tiny.yaml"
try:
    # what Snakemake's own reading lets through (a key given twice: the last silently won)
    check_files(
        workflow.overwrite_configfiles or [f"{workflow.basedir}/workflows/config/tiny.yaml"]
    )
    # the configuration's revisions table (its `revisions`), for this process and every job
    workflow_plan.use_revisions(config, os.environ, source=CONFIG_FILES)
    PLAN = workflow_plan.build(config, os.environ, source=CONFIG_FILES)
    # a pinned commit the offline cache lacks fails here, not in its job hours later
    workflow_plan.check_pins_cached(PLAN, source=CONFIG_FILES)
except ConfigError as error:
    # The message alone, before any job is queued: it names every bad key (Snakemake's
    # WorkflowError would add a traceback-like location of this line).
    print(error, file=sys.stderr)
    sys.exit(2)


# A result file that cannot be read is an error naming it, then recomputed: moved aside here,
# so that the job writing it runs again (a missing one is simply missing: its job runs too).
# Only when this command runs jobs: a dry run (-n), --touch, --dag, --summary and the like
# change nothing (workflow.dryrun is not set yet at parse time: setdlm/workflow/invocation.py).
# Not while another run is alive in this folder: it owns these files (a killed run's lock does
# not stop the repairs).
# A dry run says what a run would repair, and changes nothing.
if workflow.is_main_process and not _HOLDERS:
    _APPLY = executes(workflow)
    for _message in [
        *workflow_plan.set_aside_unreadable(PLAN, apply=_APPLY),
        *workflow_plan.rebuild_after_losses(PLAN, apply=_APPLY),
        *workflow_plan.resync_lost_store(PLAN, os.environ, apply=_APPLY),
    ]:
        print(_message, file=sys.stderr)


# Trainings take hours where copies of the reference models take seconds: say so before any
# job starts, dry runs included (a missing reference folder is refused by the checks above).
if workflow.is_main_process and (_FORECAST := forecast(PLAN)) is not None:
    print(_FORECAST, file=sys.stderr)


onstart:
    # <run>/config.yaml, the validated configuration the jobs read (not in a dry run)
    workflow_plan.save_config(PLAN)


onsuccess:
    print(workflow_plan.where_results_are(PLAN, os.environ))


onerror:
    # A full disk empties the failed job's log too (Snakemake then shows "empty file"): say so.
    if (_full := workflow_plan.disk_full_report(PLAN)) is not None:
        print(_full, file=sys.stderr)

RUN = PLAN.run
CODE_VERSION = workflow_plan.code_version(workflow.basedir)
# Jobs run the `setdlm` of this installation, the command a user would type by hand.
SETDLM = str(Path(sys.executable).with_name("setdlm"))
PYTHON = sys.executable
DATA_DIR = PLAN.data_dir  # where `dir` sources are copied from
TABLES = PLAN.tables_dir
FIGURES = PLAN.figures_dir


def resources_of(stage):
    """Generic resources of a stage (a name, or a function of the wildcards): memory and
    runtime grow with the attempt, so a profile's retries ask for more each time."""
    pick = stage if callable(stage) else (lambda wildcards: stage)
    return {
        "mem_mb": lambda wildcards, attempt: PLAN.resources(pick(wildcards))["mem_mb"] * attempt,
        "runtime": lambda wildcards, attempt: PLAN.resources(pick(wildcards))["runtime"]
        * attempt,
        "gpu": lambda wildcards: PLAN.resources(pick(wildcards))["gpus"],
    }


def threads_of(stage):
    pick = stage if callable(stage) else (lambda wildcards: stage)
    return lambda wildcards: PLAN.resources(pick(wildcards))["cpus"]


wildcard_constraints:
    dataset="|".join(datasets.DATASETS),
    model=layout.MODEL_WILDCARD,
    domain="|".join(layout.DOMAINS),
    task="|".join(layout.TASKS),
    point=layout.POINT_WILDCARD,


include: "workflows/rules/data.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/evaluate.smk"
include: "workflows/rules/track.smk"
include: "workflows/rules/report.smk"


localrules:
    all,
    all_tables,
    all_figures,
    all_evaluations,
    all_models,


rule all_tables:
    input:
        [file for table in PLAN.tables() for file in PLAN.table_files(table)],
        PLAN.figure_files(),
        PLAN.curve_files(),
        f"{RUN}/mlflow.synced",
        # a configuration whose tasks and models read no data set (the arithmetic problems
        # are generated by code) has no prepared data and no manifest
        [f"{RUN}/data/manifest.json"] if PLAN.data else [],


rule all:
    default_target: True
    input:
        rules.all_tables.input,


rule all_figures:
    input:
        PLAN.figure_files(),


rule all_evaluations:
    input:
        PLAN.all_metrics(),


# Every model this configuration trains or fetches (make reference-models trains them).
rule all_models:
    input:
        PLAN.model_markers(),
