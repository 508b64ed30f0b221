# One job per task x model x decoding point, writing <run>/<task>/<model>/<point>/
# (samples.jsonl, metrics.json, run.json) with `setdlm eval`, which reads the prepared data.
# Around it (setdlm/workflow/points.py): a folder left by another configuration or code version
# starts over while the same job's interrupted samples are resumed, and the result is accepted
# only when metrics.json covers every sample exactly once.


def point_of(wildcards):
    return PLAN.point(wildcards.task, wildcards.model, wildcards.point)


rule evaluate:
    input:
        unpack(lambda wildcards: point_of(wildcards).inputs),
    output:
        metrics=ensure(f"{RUN}/{{task}}/{{model}}/{{point}}/metrics.json", non_empty=True),
    wildcard_constraints:
        model=PLAN.model_wildcard(seeded=False),
    params:
        folder=f"{RUN}/{{task}}/{{model}}/{{point}}",
        args=lambda wildcards: point_of(wildcards).command,
        config_hash=lambda wildcards: point_of(wildcards).config_hash,
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/evaluate_{{task}}_{{model}}_{{point}}.log",
    threads: threads_of(lambda wildcards: wildcards.task)
    resources:
        **resources_of(lambda wildcards: wildcards.task),
    shell:
        "{PYTHON} -m setdlm.workflow.points start {params.folder} "
        "{params.config_hash} {params.code_version} && "
        "SETDLM_DATA_DIR={RUN}/data {SETDLM} --threads {threads} eval {params.args} > {log} 2>&1 && "
        "{PYTHON} -m setdlm.workflow.points finish {params.folder}"


# A model trained once per seed: each seed's evaluation in <point>/seed-<k>/ (the same guards),
# then their aggregate in <point>/metrics.json (`setdlm aggregate`: the mean over seeds with a
# two-level bootstrap interval, and each seed's values), which the tables, figures, check and
# MLflow read like any point's.
def seed_point_of(wildcards):
    return PLAN.seed_point(wildcards.task, wildcards.model, wildcards.point, int(wildcards.seed))


rule evaluate_seed:
    input:
        unpack(lambda wildcards: seed_point_of(wildcards).inputs),
    output:
        metrics=ensure(
            f"{RUN}/{{task}}/{{model}}/{{point}}/seed-{{seed}}/metrics.json", non_empty=True
        ),
    wildcard_constraints:
        model=PLAN.model_wildcard(seeded=True),
        seed=r"\d+",
    params:
        folder=f"{RUN}/{{task}}/{{model}}/{{point}}/seed-{{seed}}",
        args=lambda wildcards: seed_point_of(wildcards).command,
        config_hash=lambda wildcards: seed_point_of(wildcards).config_hash,
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/evaluate_{{task}}_{{model}}_{{point}}_seed-{{seed}}.log",
    threads: threads_of(lambda wildcards: wildcards.task)
    resources:
        **resources_of(lambda wildcards: wildcards.task),
    shell:
        "{PYTHON} -m setdlm.workflow.points start {params.folder} "
        "{params.config_hash} {params.code_version} && "
        "SETDLM_DATA_DIR={RUN}/data {SETDLM} --threads {threads} eval {params.args} > {log} 2>&1 && "
        "{PYTHON} -m setdlm.workflow.points finish {params.folder}"


rule aggregate_seeds:
    input:
        unpack(lambda wildcards: point_of(wildcards).inputs),
    output:
        ensure(f"{RUN}/{{task}}/{{model}}/{{point}}/metrics.json", non_empty=True),
    wildcard_constraints:
        model=PLAN.model_wildcard(seeded=True),
    params:
        folder=f"{RUN}/{{task}}/{{model}}/{{point}}",
        config_hash=lambda wildcards: point_of(wildcards).config_hash,
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/aggregate_{{task}}_{{model}}_{{point}}.log",
    localrule: True
    shell:
        "{SETDLM} aggregate {params.folder} > {log} 2>&1"
