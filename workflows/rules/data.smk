# Prepared data: each dataset a task (or training) reads, copied from the data directory or
# fetched from the Hub into <run>/data/ (laid out like SETDLM_DATA_DIR) with its manifest part;
# data_manifest merges the parts into <run>/data/manifest.json.
import shlex

from setdlm.workflow.config import digest

DATA_DIR_ARG = f"--data-dir {shlex.quote(str(DATA_DIR))}" if DATA_DIR else ""
PREPARE_DATA = (
    "{SETDLM:q} data prepare --dataset {wildcards.dataset} --source {params.source} "
    "{DATA_DIR_ARG} --out {RUN:q}/data > {log:q} 2>&1"
)


# A Hub data set: downloaded by a job with the data stage's resources (paper.yaml: the whole
# OpenWebText corpus, hours and tens of GB on a cluster node).
rule prepare_data:
    output:
        ensure(f"{RUN}/data/{{dataset}}/manifest.json", non_empty=True),
    wildcard_constraints:
        dataset=PLAN.data_wildcard("hub"),
    params:
        source="hub",
        # the source's content (or Hub reference), not where it lies
        config_hash=lambda wildcards: digest(PLAN.data[wildcards.dataset]),
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/data_{{dataset}}.log",
    benchmark:
        f"{RUN}/benchmarks/data_{{dataset}}.tsv"
    threads: threads_of("data")
    resources:
        **resources_of("data"),
    shell:
        PREPARE_DATA


# A data set from the data directory: one file copied and hashed (about a second), where
# Snakemake runs. As a cluster job it would wait in the queue and start Python on a node to copy
# one file while every evaluation of that data set waited for it (the rehearsal's SLURM run:
# evaluations started at 72 s instead of 34 s).
rule copy_data:
    output:
        ensure(f"{RUN}/data/{{dataset}}/manifest.json", non_empty=True),
    wildcard_constraints:
        dataset=PLAN.data_wildcard("dir"),
    params:
        source="dir",
        # the source's content, not where it lies
        config_hash=lambda wildcards: digest(PLAN.data[wildcards.dataset]),
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/data_{{dataset}}.log",
    benchmark:
        f"{RUN}/benchmarks/data_{{dataset}}.tsv"
    localrule: True
    shell:
        PREPARE_DATA


rule data_manifest:
    input:
        [PLAN.data_manifest(dataset) for dataset in PLAN.data],
    output:
        ensure(f"{RUN}/data/manifest.json", non_empty=True),
    params:
        config_hash=digest(PLAN.data),
        code_version=CODE_VERSION,
    localrule: True
    shell:
        "{SETDLM:q} data manifest {RUN:q}/data"
