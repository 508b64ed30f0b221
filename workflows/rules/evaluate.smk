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
