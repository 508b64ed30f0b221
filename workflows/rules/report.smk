# Tables and figures, built from the result files (not from MLflow) by `setdlm report`. Each
# table is its own job over its own tasks' results (rule table_<table>, also the target), so
# `snakemake table_gsm8k` needs GSM8K only.
from setdlm.workflow.config import digest

# What a rehearsal substitutes is printed in its tables and figures: a change rebuilds them
# (nothing is added where there is none, so other runs' parameters stay as they were).
SUBSTITUTED = [PLAN.config["substitutions"]] if PLAN.config["substitutions"] else []


def refuse(message):
    """A target this configuration cannot build: the message alone, exit code 2 (an exception
    here would come with Snakemake's traceback)."""
    print(f"{message} ({CONFIG_FILES})", file=sys.stderr)
    sys.exit(2)


def baseline(wildcards):
    if not PLAN.config["check"]["baseline"]:
        refuse("check: the configuration sets no check.baseline (the file to compare with)")
    return PLAN.config["check"]["baseline"]


def not_configured(table):
    def fail(wildcards):
        refuse(
            f"table_{table}: the configuration has no task of this table "
            f"({', '.join(layout.TABLES[table])})"
        )

    return fail


# table_gsm8k, table_cnndm, table_infill, table_unconditional, table_likelihood
for _table in layout.TABLES:
    if _table in PLAN.tables():

        rule:
            name:
                f"table_{_table}"
            input:
                PLAN.all_metrics(PLAN.table_inputs(_table)),
            output:
                [ensure(path, non_empty=True) for path in PLAN.table_files(_table)],
            params:
                table=_table,
                config_hash=digest([TABLES, PLAN.table_inputs(_table), *SUBSTITUTED]),
                code_version=CODE_VERSION,
            log:
                f"{RUN}/logs/table_{_table}.log",
            benchmark:
                f"{RUN}/benchmarks/table_{_table}.tsv"
            localrule: True
            shell:
                "{SETDLM:q} report tables {RUN:q} --out {TABLES:q} --only {params.table} "
                "> {log:q} 2>&1"

    else:

        rule:
            name:
                f"table_{_table}"
            input:
                not_configured(_table),
            localrule: True


rule figures:
    input:
        PLAN.all_metrics(PLAN.figure_tasks()),
    output:
        [ensure(path, non_empty=True) for path in PLAN.figure_files()],
    params:
        tasks=" ".join(PLAN.figure_tasks()),
        config_hash=digest([FIGURES, PLAN.figure_tasks(), *SUBSTITUTED]),
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/figures.log",
    benchmark:
        f"{RUN}/benchmarks/figures.tsv"
    localrule: True
    shell:
        "{SETDLM:q} report figures {RUN:q} --out {FIGURES:q} --only {params.tasks} > {log:q} 2>&1"


# Learning curves (models trained with train.curve): accuracy and loss along training, a line
# per seed, from the learning_curve.jsonl each model folder holds.
rule learning_curves:
    input:
        PLAN.curve_markers(),
    output:
        [ensure(path, non_empty=True) for path in PLAN.curve_files()],
    params:
        config_hash=digest(PLAN.curve_files()),
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/learning_curves.log",
    benchmark:
        f"{RUN}/benchmarks/learning_curves.tsv"
    localrule: True
    shell:
        "{SETDLM:q} report curves {RUN:q}/models --tables {TABLES:q} --figures {FIGURES:q} "
        "> {log:q} 2>&1"


rule check:
    input:
        baseline=baseline,
        metrics=PLAN.all_metrics(),
    output:
        f"{RUN}/check.passed",
    params:
        config_hash=digest(PLAN.config["check"]),
        code_version=CODE_VERSION,
    localrule: True
    shell:
        "{SETDLM:q} check --baseline {input.baseline:q} {RUN:q} && touch {output:q}"
