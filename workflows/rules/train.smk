# Models: those with `train:` settings are trained here exactly like the tiny job's families
# (<run>/models/<name>/ becomes the model folder, checkpoint.json is written last); published
# ones are fetched into the Hugging Face cache and checked, one marker per domain
# (<run>/models/<name>/checkpoint-<domain>.json). Both read the resolved <run>/config.yaml.


rule train_model:
    input:
        lambda wildcards: PLAN.train_inputs(wildcards.model),
    output:
        ensure(f"{RUN}/models/{{model}}/checkpoint.json", non_empty=True),
    wildcard_constraints:
        model=PLAN.model_wildcard(seeded=False),
    params:
        config_hash=lambda wildcards: PLAN.trained[wildcards.model],
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/train_{{model}}.log",
    benchmark:
        f"{RUN}/benchmarks/train_{{model}}.tsv"
    threads: threads_of("train")
    # trainings before evaluations, the longest first (setdlm/workflow/plan.py)
    priority: lambda wildcards: PLAN.train_priority(wildcards.model)
    resources:
        **resources_of("train"),
    # exec: the trainer replaces the job's shell, so a scheduler's SIGTERM or SIGUSR1 (time
    # limit, preemption) reaches it with no shell that dies first; it saves a checkpoint and
    # exits 75, and the retry resumes (setdlm/train/preemption.py).
    shell:
        "exec env SETDLM_DATA_DIR={RUN:q}/data {SETDLM:q} --threads {threads} train "
        "--config {RUN:q}/config.yaml --model {wildcards.model} "
        "--out {RUN:q}/models/{wildcards.model} > {log:q} 2>&1"


# A model trained once per seed (train.seeds): one job per seed, <run>/models/<name>/seed-<k>/.
rule train_model_seed:
    input:
        lambda wildcards: PLAN.train_inputs(wildcards.model),
    output:
        ensure(f"{RUN}/models/{{model}}/seed-{{seed}}/checkpoint.json", non_empty=True),
    wildcard_constraints:
        model=PLAN.model_wildcard(seeded=True),
        seed=r"\d+",
    params:
        config_hash=lambda wildcards: PLAN.trained_seeds[(wildcards.model, int(wildcards.seed))],
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/train_{{model}}_seed-{{seed}}.log",
    benchmark:
        f"{RUN}/benchmarks/train_{{model}}_seed-{{seed}}.tsv"
    threads: threads_of("train")
    priority: lambda wildcards: PLAN.train_priority(wildcards.model)
    resources:
        **resources_of("train"),
    shell:
        "exec env SETDLM_DATA_DIR={RUN:q}/data {SETDLM:q} --threads {threads} train "
        "--config {RUN:q}/config.yaml --model {wildcards.model} --seed {wildcards.seed} "
        "--out {RUN:q}/models/{wildcards.model}/seed-{wildcards.seed} > {log:q} 2>&1"


# A model whose every seed the reference folder holds with this recipe (tiny.yaml's
# reference_models): one job copies its seeds (`setdlm train --seeds`; a Python process per
# seed would cost more than the copies), each checked against the sha256 its marker lists.
for _model, _seeds in PLAN.copied.items():

    rule:
        name:
            f"copy_reference_{_model}".replace("-", "_")
        output:
            [
                ensure(f"{RUN}/models/{_model}/seed-{seed}/checkpoint.json", non_empty=True)
                for seed in _seeds
            ],
        params:
            model=_model,
            seeds=" ".join(map(str, _seeds)),
            config_hash=[PLAN.trained_seeds[(_model, seed)] for seed in _seeds],
            code_version=CODE_VERSION,
        log:
            f"{RUN}/logs/copy_reference_{_model}.log",
        benchmark:
            f"{RUN}/benchmarks/train_copy_reference_{_model}.tsv"
        localrule: True
        # before every evaluation: a copy takes seconds and opens all of its model's jobs
        priority: workflow_plan.TRAINING_PRIORITY
        shell:
            "{SETDLM:q} train --config {RUN:q}/config.yaml --model {params.model} "
            "--seeds {params.seeds} --out {RUN:q}/models/{params.model} > {log:q} 2>&1"


# A published checkpoint: fetched into the Hugging Face cache and checked, one job per model
# for every domain the configuration evaluates it on (one process loads them one after the
# other: on a cluster, one job's queue wait instead of one per domain).
for _model, _domains in PLAN.fetched_domains().items():

    rule:
        name:
            f"fetch_{_model}".replace("-", "_")
        output:
            [
                ensure(f"{RUN}/models/{_model}/checkpoint-{domain}.json", non_empty=True)
                for domain in _domains
            ],
        params:
            model=_model,
            domains=" ".join(_domains),
            config_hash=[PLAN.fetched[(_model, domain)] for domain in _domains],
            code_version=CODE_VERSION,
        log:
            f"{RUN}/logs/fetch_{_model}.log",
        benchmark:
            f"{RUN}/benchmarks/fetch_{_model}.tsv"
        threads: threads_of("fetch")
        priority: workflow_plan.TRAINING_PRIORITY  # before every evaluation, as a copy
        resources:
            **resources_of("fetch"),
        shell:
            "{SETDLM:q} --threads {threads} train --config {RUN:q}/config.yaml "
            "--model {params.model} --domain {params.domains} "
            "--out {RUN:q}/models/{params.model} > {log:q} 2>&1"
