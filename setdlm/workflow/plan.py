"""The jobs a validated configuration asks for; the Snakefile's rules read them from here.

One ``Plan`` per DAG build: the datasets to prepare, the models to train or fetch, one
evaluation ``Point`` per task x model x decoding point (with its complete ``setdlm eval``
arguments), and the tables. Every job carries the hash of exactly the part of the configuration
it depends on, so a changed setting reruns what it affects and nothing else.

Paths are relative to the working directory (where Snakemake runs), so moving a results folder
with its ``.snakemake`` metadata changes no job's parameters.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from setdlm.git import head_commit
from setdlm.workflow import datasets
from setdlm.workflow.config import (
    data_dir,
    datasets_needed,
    digest,
    load_published,
    resolve_key,
    task_dataset,
    train_settings,
    used_models,
    validate,
)
from setdlm.workflow.layout import (
    LIKELIHOOD_POINT,
    LIKELIHOOD_TASKS,
    TABLES,
    TASK_DOMAIN,
    figure_files,
    point_name,
    result_dir,
    run_dir,
    table_files,
)

# Resources of a stage that neither the stage nor `resources.default` sets.
BASE_RESOURCES = {"cpus": 1, "mem_mb": 4000, "runtime": 60, "gpus": 0}
# Settings that choose which jobs exist rather than what one job computes.
NOT_PER_POINT = ("models", "thresholds", "overrides")


@dataclass(frozen=True)
class Point:
    """One evaluation result folder and the command that fills it."""

    task: str
    model: str
    point: str
    folder: str
    args: tuple[str, ...]  # after `setdlm eval`
    inputs: dict[str, str]  # name -> file the job needs (model marker, data manifest, ...)
    config_hash: str

    @property
    def command(self) -> str:
        return shlex.join(self.args)


@dataclass
class Plan:
    config: dict
    run: str  # <results>/runs/<name>
    data_dir: Path | None  # where `dir` sources are copied from
    data: dict[str, dict] = field(default_factory=dict)  # dataset -> source identity
    trained: dict[str, str] = field(default_factory=dict)  # model -> config hash
    fetched: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, domain) -> hash
    points: dict[tuple[str, str, str], Point] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # why some points are not in the DAG

    # ------------------------------------------------------------------------------ paths
    def data_manifest(self, dataset: str) -> str:
        return f"{self.run}/data/{datasets.DATASETS[dataset].folder}/{datasets.MANIFEST}"

    def model_marker(self, name: str, domain: str | None = None) -> str:
        marker = "checkpoint.json" if domain is None else f"checkpoint-{domain}.json"
        return f"{self.run}/models/{name}/{marker}"

    def metrics(self, point: Point) -> str:
        return f"{point.folder}/metrics.json"

    @property
    def tables_dir(self) -> str:
        configured = self.config["report"]["tables"]
        return configured or f"{self.config['results']}/tables/{self.config['name']}"

    @property
    def figures_dir(self) -> str:
        configured = self.config["report"]["figures"]
        return configured or f"{self.config['results']}/figures/{self.config['name']}"

    # ------------------------------------------------------------------------------ jobs
    def point(self, task: str, model: str, point: str) -> Point:
        return self.points[(task, model, point)]

    def all_metrics(self, tasks=None) -> list[str]:
        return [
            self.metrics(point)
            for (task, _, _), point in self.points.items()
            if tasks is None or task in tasks
        ]

    def tables(self) -> dict[str, tuple[str, ...]]:
        """The paper tables some configured task feeds, with those tasks."""
        configured = self.config["tasks"]
        return {
            table: tuple(task for task in tasks if task in configured)
            for table, tasks in TABLES.items()
            if any(task in configured for task in tasks)
        }

    def table_files(self, table: str) -> list[str]:
        return table_files(self.tables_dir, table)

    def figure_tasks(self) -> list[str]:
        """The decoding tasks configured: each gets a speed-quality figure."""
        return [task for task in self.config["tasks"] if task not in LIKELIHOOD_TASKS]

    def figure_files(self) -> list[str]:
        return [f for task in self.figure_tasks() for f in figure_files(self.figures_dir, task)]

    def model_markers(self) -> list[str]:
        return [self.model_marker(name) for name in self.trained] + [
            self.model_marker(name, domain) for name, domain in self.fetched
        ]

    def resources(self, stage: str) -> dict[str, int]:
        configured = self.config["resources"]
        return {**BASE_RESOURCES, **configured.get("default", {}), **configured.get(stage, {})}

    def tracking_uri(self, environ) -> str:
        configured = self.config["tracking"]["uri"] or environ.get("MLFLOW_TRACKING_URI")
        if configured:
            return configured
        # relative to the working directory when the results root is, like every other path
        return f"sqlite:///{Path(self.config['results']) / 'mlflow.db'}"


def build(raw_config: dict, environ, log=None, source: str = "") -> Plan:
    """Validate ``raw_config`` (raises ConfigError naming every bad key and ``source``, the
    configuration files it came from) and plan its jobs."""
    config = validate(raw_config, source=source, environ=environ)
    published = load_published()
    plan = Plan(config, str(run_dir(config["results"], config["name"])), data_dir(config, environ))
    for name in datasets_needed(config):
        kind = config["data"]["sources"][name]
        plan.data[name] = datasets.source_identity(name, kind, plan.data_dir)
    for name in used_models(config):
        entry = config["models"][name]
        if "train" in entry:
            settings = {**entry, "train": train_settings(config, name)}
            plan.trained[name] = digest({"model": name, **settings, "data": plan.data["wikitext2"]})
    for task, settings in config["tasks"].items():
        for name in settings["models"]:
            _plan_model_points(plan, published, task, settings, name)
    for reason in plan.skipped:
        (log or _warn)(f"setdlm workflow: skipped {reason}")
    return plan


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def _plan_model_points(plan: Plan, published: dict, task: str, settings: dict, name: str):
    entry = plan.config["models"][name]
    inputs = {}
    if "train" in entry:
        model_arg = f"{plan.run}/models/{name}"
        inputs["model"] = plan.model_marker(name)
        model_identity = plan.trained[name]
    else:
        domain = TASK_DOMAIN[task]
        spec = resolve_key(entry["checkpoint"][domain], published)
        if not spec["loadable"]:
            plan.skipped.append(f"{task}/{name}: {spec['key']} cannot be loaded ({spec['note']})")
            return
        model_arg = spec["key"]
        inputs["model"] = plan.model_marker(name, domain)
        model_identity = digest({"key": spec["key"], "revision": spec["revision"]})
        plan.fetched[(name, domain)] = model_identity
    inputs["data"] = plan.data_manifest(task_dataset(task, settings))
    override = settings.get("overrides", {}).get(name, {})
    evaluator = settings.get("evaluator")
    if isinstance(evaluator, dict):
        inputs["evaluator"] = plan.model_marker(evaluator["model"])
    shared = {key: value for key, value in settings.items() if key not in NOT_PER_POINT}
    identity = {
        "task": task,
        "settings": shared,
        "override": {key: value for key, value in override.items() if key != "thresholds"},
        "model": name,
        "model_identity": model_identity,
        "evaluator": plan.trained.get(evaluator["model"]) if isinstance(evaluator, dict) else None,
    }
    if task in LIKELIHOOD_TASKS:
        thresholds = [None]
    else:
        thresholds = override.get("thresholds", settings["thresholds"])
    for tau in thresholds:
        point = LIKELIHOOD_POINT if tau is None else point_name(tau)
        folder = str(result_dir(plan.run, task, name, point))
        args = eval_args(task, settings, override, plan, name, model_arg, folder, tau)
        plan.points[(task, name, point)] = Point(
            task=task,
            model=name,
            point=point,
            args=args,
            folder=folder,
            inputs=inputs,
            config_hash=digest({**identity, "tau": tau}),
        )


def eval_args(task, settings, override, plan, name, model_arg, folder, tau) -> tuple[str, ...]:
    """The ``setdlm eval`` arguments of one point: every setting spelled out."""
    command = "likelihood" if task in LIKELIHOOD_TASKS else task.split("-")[0]
    args = [command, "--model", model_arg, "--out", folder, "--seed", settings["seed"]]
    args += ["--batch-size", override.get("batch_size", settings["batch_size"])]
    if settings.get("limit") is not None:
        args += ["--limit", settings["limit"]]
    if task in LIKELIHOOD_TASKS:
        args += ["--data", LIKELIHOOD_TASKS[task], "--samples", settings["samples"]]
        return tuple(str(arg) for arg in args)
    args += ["--threshold", repr(float(tau)), "--warmup", settings["warmup"]]
    entry = plan.config["models"][name]
    if entry["family"] == "setdlm":  # W is explicit: the model's, or this task's override
        args += ["--window", override.get("window", entry["window"])]
    if "block_size" in override:
        args += ["--block-size", override["block_size"]]
    if settings.get("paper_throughput"):
        args += ["--paper-throughput", settings["paper_throughput"]]
        args += ["--paper-warmup", settings["paper_warmup"]]
    args += _task_args(task, settings, plan)
    return tuple(str(arg) for arg in args)


def _task_args(task: str, settings: dict, plan: Plan) -> list:
    if task == "gsm8k":
        args = ["--protocol", settings["protocol"]]
        if settings["max_new_tokens"] is not None:
            args += ["--max-new-tokens", settings["max_new_tokens"]]
        return args
    if task == "cnndm":
        return ["--stop", settings["stop"]]
    if task.startswith("infill"):
        args = ["--variant", task, "--repetition", settings["repetition"]]
        return args + (["--skip-too-long"] if settings["skip_too_long"] else [])
    reject = settings["reject"]
    evaluator = settings["evaluator"]
    if isinstance(evaluator, dict):
        evaluator = f"{plan.run}/models/{evaluator['model']}"
    options = {
        "--samples": settings["samples"],
        "--reject": f"{reject['entropy']},{reject['length']},{reject['attempts']}",
        "--references": settings["references"],
        "--num-references": settings["num_references"],
        "--featurizer": settings["featurizer"],
        "--evaluator": evaluator,
        "--text-protocol": settings["text_protocol"],
        "--bootstrap-subsets": settings["bootstrap_subsets"],
    }
    args = [item for option in options.items() for item in option]
    if settings["max_new_tokens"] is not None:
        args += ["--max-new-tokens", settings["max_new_tokens"]]
    if settings["table4"]:
        args.append("--table4")
    if settings["top_p"] is not None:
        args += ["--top-p", settings["top_p"]]
    if settings["repetition_penalty"] is not None:
        args += ["--repetition-penalty", settings["repetition_penalty"]]
    if not settings["confidence_stop"]:
        args.append("--no-confidence-stop")
    if not settings["entropy_stop"]:
        args.append("--no-entropy-stop")
    return args


def where_results_are(plan: Plan, environ) -> str:
    """What a finished run tells its user: where its outputs are and how to open them."""
    uri = plan.tracking_uri(environ)
    database = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    browse = (
        f"setdlm ui --results {Path(database).parent}  (then open http://127.0.0.1:5000)"
        if database
        else f"open {uri} in a browser"
    )
    return "\n".join(
        [
            f"Run {plan.config['name']} done:",
            f"  tables   {plan.tables_dir}/  (Markdown, CSV, LaTeX)",
            f"  figures  {plan.figures_dir}/  (PNG, PDF speed-quality fronts)",
            f"  results  {plan.run}/<task>/<model>/<point>/metrics.json (the source of truth)",
            f"  MLflow   {uri}",
            f"           browse it: {browse}",
        ]
    )


def code_version(folder: str | Path) -> str:
    """The git commit of the checkout holding the workflow (uncommitted edits do not count:
    editing a configuration must not look like new code), else the package version.
    ``SETDLM_CODE_VERSION`` pins it (to keep results across a commit known not to matter)."""
    if os.environ.get("SETDLM_CODE_VERSION"):
        return os.environ["SETDLM_CODE_VERSION"]
    commit = head_commit(folder)
    if commit is None:
        import importlib.metadata

        return f"setdlm-{importlib.metadata.version('setdlm')}"
    return commit


def save_config(plan: Plan) -> Path:
    """``<run>/config.yaml``: the validated configuration with defaults, which the jobs read
    (``setdlm train --config``). Rewritten only when it changes, so it never looks newer."""
    import yaml

    from setdlm.files import atomic_write_text

    path = Path(plan.run) / "config.yaml"
    text = yaml.safe_dump(plan.config, sort_keys=False, allow_unicode=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        atomic_write_text(path, text)
    return path
