# MLflow: every finished result mirrored into the tracking store by one local writer
# (idempotent: a re-sync adds nothing). The store: tracking.uri, else $MLFLOW_TRACKING_URI,
# else sqlite:///<results>/mlflow.db.
import shlex

from setdlm.workflow.config import digest


rule sync_mlflow:
    input:
        PLAN.all_metrics(),
        PLAN.model_markers(),
    output:
        f"{RUN}/mlflow.synced",
    params:
        tracking_uri=shlex.quote(PLAN.tracking_uri(os.environ)),
        config_hash=digest(PLAN.tracking_uri(os.environ)),
        code_version=CODE_VERSION,
    log:
        f"{RUN}/logs/mlflow-sync.log",
    benchmark:
        f"{RUN}/benchmarks/mlflow-sync.tsv"
    localrule: True
    shell:
        "{SETDLM:q} sync {RUN:q} --tracking-uri {params.tracking_uri} --marker {output:q} "
        "> {log:q} 2>&1"
