# One job per task x model x decoding point, writing <run>/<task>/<model>/<point>/
# (samples.jsonl, metrics.json, run.json) with `setdlm eval`, which reads the prepared data.
# Around it (setdlm/workflow/points.py): a folder left by another configuration or code version
# starts over while the same job's interrupted samples are resumed, and the result is accepted
# only when metrics.json covers every sample exactly once.


from setdlm.workflow.config import digest
from setdlm.workflow.points import seed_sweeps, sweep_points


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
        "{PYTHON:q} -m setdlm.workflow.points start {params.folder:q} "
        "{params.config_hash} {params.code_version:q} && "
        "SETDLM_DATA_DIR={RUN:q}/data {SETDLM:q} --threads {threads} eval {params.args} "
        "> {log:q} 2>&1 && "
        "{PYTHON:q} -m setdlm.workflow.points finish {params.folder:q}"


# A model trained once per seed: every τ point of one (task, model, decoding policy) and seed
# in one job (`python -m setdlm.workflow.points sweep`: the same guards and `setdlm eval` per
# point, in one process, since starting Python with torch costs more than decoding a point of
# the default), each seed's result in <point>/seed-<k>/. Then the aggregate over the seeds in
# <point>/metrics.json (`setdlm aggregate`: the mean over seeds with a two-level bootstrap
# interval, and each seed's values), which the tables, figures, check and MLflow read like any
# point's. One rule per sweep, since a rule's outputs are fixed patterns.
for (_task, _model, _policy), _points in seed_sweeps(PLAN).items():

    rule:
        name:
            f"evaluate_sweep_{_task}_{_model}_{_policy}".replace("-", "_")
        input:
            unpack(
                lambda wildcards, task=_task, model=_model, policy=_policy: sweep_points(
                    PLAN, task, model, policy, int(wildcards.seed)
                )[0].inputs
            ),
        output:
            [
                ensure(f"{RUN}/{_task}/{_model}/{point}/seed-{{seed}}/metrics.json", non_empty=True)
                for point in _points
            ],
        wildcard_constraints:
            seed=r"\d+",
        params:
            config_hash=lambda wildcards, task=_task, model=_model, policy=_policy: digest(
                [p.config_hash for p in sweep_points(PLAN, task, model, policy, int(wildcards.seed))]
            ),
            code_version=CODE_VERSION,
            sweep=f"{_task} {_model} {_policy}",
        log:
            f"{RUN}/logs/evaluate_{_task}_{_model}_{_policy}_seed-{{seed}}.log",
        threads: threads_of(lambda wildcards, task=_task: task)
        resources:
            **resources_of(lambda wildcards, task=_task: task),
        shell:
            "SETDLM_DATA_DIR={RUN:q}/data {PYTHON:q} -m setdlm.workflow.points sweep {RUN:q} "
            "{params.sweep} {wildcards.seed} {params.code_version:q} --threads {threads} "
            "> {log:q} 2>&1"


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
        "{SETDLM:q} aggregate {params.folder:q} > {log:q} 2>&1"
