"""The Snakemake workflow: configuration checks, the job plan, the paper matrix's dry run on the
SLURM profile, and a reduced tiny run end to end (it writes every result; a config change reruns
only what it affects; a dry run or a read-only command changes no file).

The end-to-end tests share one finished run (about a minute on 2 cores) and each works on its own
copy of it, ``.snakemake`` metadata included, so they can run alone or in any order. Faults in a
finished run, killed and interrupted runs and a second run with nothing to do are the end-to-end
tier's (tests/test_fault_injection.py, `make test-e2e`), on the main job's own DAG.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from configs import (
    TINY_PATH,
    tiny_config,
    tiny_quick_config,
    tiny_with_paper_tasks,
)
from workflow_env import copy_of_run, environ

from setdlm.results import layout
from setdlm.util.owned_files import MANIFEST  # the record of what `report` wrote
from setdlm.workflow import datasets, points
from setdlm.workflow.config import (
    MODELS_PATH,
    TINY_DEFAULTS,
    ConfigError,
    load_yaml,
    validate,
)
from setdlm.workflow.plan import build
from setdlm.workflow.references import copied_seeds

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "workflows" / "config"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# A reduced tiny configuration: two families, two tasks, a τ sweep, seconds of training.
MINI = {
    "name": "mini",
    "data": {"sources": {"gsm8k": "dir", "wikitext2": "dir"}},
    "train": {"steps": 8, "warmup_steps": 2, "hidden_size": 32, "batch_size": 8},
    "models": {
        "ar": {"family": "ar", "train": {}},
        "setdlm-smax8": {"family": "setdlm", "d": 4, "window": 4, "train": {}},
    },
    "tasks": {
        "gsm8k": {
            "models": ["ar", "setdlm-smax8"],
            "limit": 2,
            "max_new_tokens": 8,
            "thresholds": [1e6, 0.5],
            "overrides": {"ar": {"thresholds": [1e6]}},
        },
        "likelihood-wikitext2": {"models": ["ar", "setdlm-smax8"], "limit": 8},
    },
}
MINI_POINTS = [
    "gsm8k/ar/tau-1e+06",
    "gsm8k/setdlm-smax8/tau-1e+06",
    "gsm8k/setdlm-smax8/tau-0.5",
    "likelihood-wikitext2/ar/default",
    "likelihood-wikitext2/setdlm-smax8/default",
]


# ------------------------------------------------------------------------------ tables agree
def test_models_yaml_is_the_zoo_table():
    from setdlm.workflow.models import render

    assert MODELS_PATH.read_text() == render(), (
        "workflows/config/models.yaml differs from setdlm/checkpoints/zoo.py; regenerate it with "
        "`python -m setdlm.workflow.models > workflows/config/models.yaml`"
    )


def test_layout_agrees_with_the_loaders_and_the_tiny_recipe():
    from setdlm.data import text
    from setdlm.recipes.tiny import TinySettings
    from setdlm.tasks import cnndm, infill, likelihood

    files = {name: (d.folder, d.files) for name, d in datasets.DATASETS.items()}
    assert all(name == folder for name, (folder, _) in files.items())
    assert files["gsm8k"] == ("gsm8k", ("test.jsonl",))  # load_gsm8k: gsm8k/<split>.jsonl
    assert files["cnn_dailymail"] == (
        cnndm.OFFLINE_FILE[0],
        (cnndm.FULL_TEST_FILE[1], cnndm.OFFLINE_FILE[1]),
    )
    assert files["rocstories"] == (infill.ROCSTORIES_FILE[0], (infill.ROCSTORIES_FILE[1],))
    assert files["wikitext2"] == ("wikitext2", (text._WIKITEXT_FILES["test"],))
    for name, data in (("openwebtext", "owt"), ("lm1b", "lm1b")):
        folder, file = likelihood.PREPARED_FILES[data]
        assert files[name] == (folder, (file,)) and datasets.DATASETS[name].hub_file == file
    # the tables and figures against the task table: tests/test_tasks.py
    settings = TinySettings()
    assert {key: getattr(settings, key) for key in TINY_DEFAULTS} == TINY_DEFAULTS


# --------------------------------------------------------------------------- configuration
def _tiny() -> dict:
    return tiny_with_paper_tasks()


def _paper() -> dict:
    return load_yaml(CONFIG_DIR / "paper.yaml")


def _set(config: dict, dotted: str, value) -> dict:
    config = copy.deepcopy(config)
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return config


class _Deleted:
    """A key removed from the configuration (its repr names it, the same in every process)."""

    def __repr__(self) -> str:
        return "DELETED"


DELETE = _Deleted()
# (base, key to set, value, the key the error must name, and a phrase it must say)
BAD_CONFIGS = [
    (_tiny, "colour", "red", "colour", "unknown key"),
    (_tiny, "tasks.gsm8k.limt", 3, "tasks.gsm8k.limt", "unknown key"),
    (_tiny, "tasks.mmlu", {"models": ["ar"]}, "tasks.mmlu", "unknown key"),
    (_tiny, "tasks.gsm8k.limit", "three", "tasks.gsm8k.limit", "'three' is not an integer >= 1"),
    (_tiny, "tasks.gsm8k.thresholds", ["1e6"], "tasks.gsm8k.thresholds[0]", "1.0e+6"),
    (_tiny, "tasks.gsm8k.thresholds", [1e6, 1.5], "tasks.gsm8k.thresholds[1]", "(0, 1]"),
    (_tiny, "tasks.gsm8k.thresholds", [0.9, 0.90000000001], "tasks.gsm8k.thresholds[1]", "same"),
    (_tiny, "tasks.gsm8k.models", DELETE, "tasks.gsm8k", "'models' is a required property"),
    (_tiny, "tasks.cnndm.models", ["ar", "bd3lm-s8"], "tasks.cnndm.models[1]", "not defined"),
    (_tiny, "models.gpt2", {"family": "ar", "train": {}}, "models.gpt2", "not a model name"),
    (_tiny, "models.ar.family", "mdlm", "models.ar.family", "name says ar"),
    (_tiny, "models.ar.checkpoint", {"gsm8k": "gsm8k:ar"}, "models.ar", "not both"),
    (_tiny, "models.ar.train", DELETE, "models.ar", "not neither"),
    (_tiny, "models.bd3lm-s4.block_size", 8, "models.bd3lm-s4.block_size", "block_size = 4"),
    (_tiny, "models.bd3lm-s4.train", {"length": 66}, "models.bd3lm-s4.block_size", "divide"),
    (_tiny, "models.setdlm-smax8.window", DELETE, "models.setdlm-smax8.window", "W"),
    (_tiny, "models.setdlm-smax8.d", 8, "models.setdlm-smax8.d", "d = 4"),
    (_tiny, "models.mdlm.window", 4, "models.mdlm.window", "only SetDLM"),
    (_tiny, "train.hidden_size", 130, "train.hidden_size", "n_heads"),
    (_tiny, "train.warmup_steps", 500, "train.warmup_steps", "exceed"),
    (_tiny, "tasks.gsm8k.overrides.mdlm.window", 4, "tasks.gsm8k.overrides.mdlm.window", "SetDLM"),
    (_tiny, "tasks.gsm8k.overrides.mdlm.block_size", 5, "tasks.gsm8k.overrides.mdlm.block", "64"),
    (_tiny, "tasks.cnndm.overrides", {"gpt": {}}, "tasks.cnndm.overrides.gpt", "not one of"),
    (_tiny, "tasks.cnndm.policies", ["dual-cache"], "tasks.cnndm.policies", "not one of AR's"),
    (_tiny, "tasks.cnndm.policies", ["dual cache"], "tasks.cnndm.policies[0]", "does not match"),
    (
        _tiny,
        "tasks.gsm8k.overrides.mdlm.policies",
        ["default", "semi-ar"],
        "tasks.gsm8k.overrides.mdlm.policies",
        "twice",
    ),
    (
        _tiny,
        "tasks.gsm8k.overrides",
        {"bd3lm-s4": {"policies": ["sliding-window"]}},
        "tasks.gsm8k.overrides.bd3lm-s4.policies",
        "sliding-window decodes SetDLM",
    ),
    (
        _tiny,
        "tasks.unconditional.evaluator",
        {"model": "mdlm"},
        "tasks.unconditional.evaluator",
        "AR",
    ),
    (_tiny, "resources.default.mem_mb", "2G", "resources.default.mem_mb", "is not an integer"),
    (_tiny, "data.sources.rocstories", "hub", "data.sources.rocstories", "is not one of"),
    (_paper, "models.ar.checkpoint.gsm8k", "gsm8k:arr", "models.ar.checkpoint.gsm8k", "unknown"),
    (_paper, "models.ar.checkpoint.gsm8k", "cnndm:ar", "models.ar.checkpoint.gsm8k", "cnndm"),
    (
        _paper,
        "models.bd3lm-s4.checkpoint.owt",
        "owt:bd3lm-s8",
        "models.bd3lm-s4.checkpoint",
        "block_size = 8",
    ),
    (_paper, "models.mdlm.checkpoint.cnndm", DELETE, "models.mdlm.checkpoint", "'cnndm'"),
]


@pytest.mark.parametrize(
    "base, key, value, named, phrase", BAD_CONFIGS, ids=[f"{c[1]}={c[2]!r}" for c in BAD_CONFIGS]
)
def test_a_bad_configuration_is_rejected_naming_the_key(data_dir, base, key, value, named, phrase):
    with pytest.raises(ConfigError) as raised:
        validate(_set(base(), key, value), environ={"SETDLM_DATA_DIR": str(data_dir)})
    matching = [e for e in raised.value.errors if e.startswith(named)]
    assert matching, f"no error names {named}: {raised.value.errors}"
    assert any(phrase in e for e in matching), matching


def test_data_sources_are_checked_before_any_job(tmp_path, data_dir):
    config = _tiny()
    with pytest.raises(ConfigError) as raised:
        validate(config, environ={})
    assert any(e.startswith("data.dir: not set") for e in raised.value.errors)
    with pytest.raises(ConfigError) as raised:
        validate(_set(config, "data.dir", str(tmp_path)), environ={})
    assert any(
        e.startswith("data.sources.gsm8k") and "test.jsonl" in e for e in raised.value.errors
    )


def test_the_shipped_configurations_are_valid(data_dir):
    for config in (_tiny(), _paper(), tiny_quick_config()):
        validate(config, environ={"SETDLM_DATA_DIR": str(data_dir)})


def test_the_quick_overlay_keeps_every_rule_and_only_cuts_costs(data_dir):
    """tiny-quick.yaml (the fault injection) stands for the main job: the same models, tasks,
    policies and kinds of job; fewer seeds and points, one model trained on fewer steps and the
    others copied, its own run folder."""
    env = {"SETDLM_DATA_DIR": str(data_dir)}
    main_config, quick_config = tiny_config(), tiny_quick_config()
    main, quick = build(main_config, env), build(quick_config, env)
    assert quick.run == "results/runs/tiny-quick" != main.run
    assert {k[:2] for k in quick.points} == {k[:2] for k in main.points}  # (task, model)

    def policies(plan):
        return {layout.POINT_NAME.match(k[2])["policy"] for k in plan.points}

    assert policies(quick) == policies(main) and len(policies(main)) > 1
    assert len(quick.points) < len(main.points) and quick.trained.keys() == main.trained.keys()
    # Both ways a model comes to the run: ar-arith trained here on fewer steps (the faults on a
    # model aim at it), the other three copied from the reference models with their recipe.
    steps = {name: entry["train"]["steps"] for name, entry in quick_config["models"].items()}
    assert steps["ar-arith"] < main_config["models"]["ar-arith"]["train"]["steps"]
    quick_validated = validate(quick_config, environ=env)
    assert copied_seeds(quick_validated, "ar-arith") is None
    for name in ("mdlm-arith", "bd3lm-s4-arith", "setdlm-smax8-arith"):
        assert steps[name] == main_config["models"][name]["train"]["steps"], name
        assert copied_seeds(quick_validated, name) == [0, 1], name


def test_an_overlay_on_one_model_of_a_shared_yaml_block_changes_that_model_only(tmp_path):
    """tiny.yaml's arithmetic models share one `train` block (a YAML alias): an overlay that
    changes it for one model leaves the others as they were, in Snakemake's merge of two
    --configfile and in `setdlm plan`'s, which must agree."""
    from snakemake.utils import update_config

    from setdlm.commands.plan import merged

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("models: {ar-arith: {train: {steps: 7, curve: {every: 5}}}}\n")
    snakemakes: dict = {}
    for path in (TINY_PATH, overlay):  # as snakemake/cli.py merges --configfile A B
        update_config(snakemakes, yaml.safe_load(path.read_text()))
    assert merged([TINY_PATH, overlay]) == snakemakes
    models = snakemakes["models"]
    assert models["ar-arith"]["train"]["steps"] == 7
    assert models["ar-arith"]["train"]["curve"]["every"] == 5
    for name in ("mdlm-arith", "bd3lm-s4-arith", "setdlm-smax8-arith"):
        assert models[name]["train"]["steps"] in (4000, 24000), name
        assert models[name]["train"]["curve"]["every"] == 250, name


def test_the_default_trains_and_judges_with_one_generator(data_dir):
    """tiny.yaml's arithmetic models learn the problems its tasks pose and judge: one generator
    (arithmetic-4) for every model's training and every arithmetic task, and rows long enough
    for its longest problem."""
    config = tiny_config()
    validate(config, environ={"SETDLM_DATA_DIR": str(data_dir)})
    trains = [entry["train"] for entry in config["models"].values()]
    assert {train["generator"] for train in trains} == {"arithmetic-4"}
    tasks = config["tasks"].values()
    assert {task.get("generator", task.get("references")) for task in tasks} == {"arithmetic-4"}
    # each model's rows hold the test problems its tasks pose (an error names one that does not)
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.tasks.likelihood import arithmetic_rows

    for name, entry in config["models"].items():
        tokenizer = load_tokenizer(REPO / config["reference_models"] / name / "seed-0")
        arithmetic_rows(tokenizer, entry["train"]["length"], 300, 0, "arithmetic-4")


@pytest.mark.parametrize(
    "argv, runs_jobs",
    [
        (["all_tables"], True),
        (["--profile", "workflows/profiles/local", "all_tables"], True),
        (["-c", "2", "-q", "all", "--configfile", "x.yaml"], True),
        (["--report", "r.html", "--report-after-run"], True),
        (["-n", "all_tables"], False),
        (["-np"], False),
        (["--dry-run"], False),
        (["--profile", "workflows/profiles/local", "-n"], False),
        (["--touch"], False),
        (["--dag"], False),
        (["--rulegraph"], False),
        (["--summary"], False),
        (["-D"], False),
        (["--list-changes", "params"], False),
        (["--unlock"], False),
        (["--lint"], False),
        (["--report", "r.html"], False),
        (["--delete-all-output"], False),
        (["--not-a-snakemake-option"], False),  # not a Snakemake command line: no repairs
    ],
)
def test_only_a_command_that_runs_jobs_may_repair_results(argv, runs_jobs):
    """The Snakefile's repairs change files, so they wait for a command that runs jobs; what it
    is comes from the command line, since workflow.dryrun is not set yet at parse time."""
    from setdlm.workflow.invocation import command_line_executes

    assert command_line_executes(argv) is runs_jobs


@pytest.mark.slow  # runs snakemake or setdlm train in a subprocess
def test_snakemake_refuses_a_bad_configuration_before_queueing_jobs(tmp_path, data_dir):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(_set(_tiny(), "tasks.gsm8k.thresholds", [0.9, 2.0])))
    result = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path / "work"), "-n"]
        + ["all_tables", "--configfile", str(config)],
        capture_output=True,
        text=True,
        env=environ(data_dir),
        timeout=120,
    )
    assert result.returncode == 2
    output = result.stdout + result.stderr
    assert "tasks.gsm8k.thresholds[1]: 2.0 is not a confidence τ in (0, 1]" in output
    assert f"invalid workflow configuration ({config})" in output  # names the file
    assert "Traceback" not in output and 'File "' not in output  # the message alone
    assert not (tmp_path / "work" / "results").exists()


# ------------------------------------------------------------------------------------ plan
def test_plan_points_commands_and_hashes(data_dir):
    env = {"SETDLM_DATA_DIR": str(data_dir)}
    plan = build(_tiny(), env)
    gsm8k = [key for key in plan.points if key[0] == "gsm8k"]
    assert ("gsm8k", "ar", "tau-1e+06") in gsm8k and ("gsm8k", "ar", "tau-0.9") not in gsm8k
    assert len(gsm8k) == 1 + 1 + 3 + 3  # AR and MDLM one point, the others the τ sweep
    point = plan.point("gsm8k", "setdlm-smax8", "tau-0.9")
    assert point.folder == "results/runs/tiny/gsm8k/setdlm-smax8/tau-0.9"
    assert "--threshold 0.9 " in point.command and "--window 4" in point.command
    assert point.inputs == {
        "model": "results/runs/tiny/models/setdlm-smax8/checkpoint.json",
        "data": "results/runs/tiny/data/gsm8k/manifest.json",
    }
    unconditional = plan.point("unconditional", "mdlm", "tau-1e+06")
    assert "--evaluator results/runs/tiny/models/ar" in unconditional.command
    assert unconditional.inputs["evaluator"] == "results/runs/tiny/models/ar/checkpoint.json"
    # One task's setting changes that task's points and nothing else.
    changed = build(_set(_tiny(), "tasks.cnndm.limit", 5), env)
    differ = {k for k, p in plan.points.items() if changed.points[k].config_hash != p.config_hash}
    assert differ == {k for k in plan.points if k[0] == "cnndm"}
    assert changed.trained == plan.trained and changed.data == plan.data
    # A τ added to the sweep is one more point; the others keep their hash.
    more = build(_set(_tiny(), "tasks.gsm8k.thresholds", [1e6, 0.9, 0.5, 0.7]), env)
    assert set(more.points) - set(plan.points) == {
        ("gsm8k", "bd3lm-s4", "tau-0.7"),
        ("gsm8k", "setdlm-smax8", "tau-0.7"),
    }
    assert all(more.points[k].config_hash == p.config_hash for k, p in plan.points.items())


def _with_policies(config: dict, bd3lm: list[str], mdlm: list[str] | None = None) -> dict:
    """GSM8K's bd3lm-s4 and mdlm decoding with these policies (mdlm: as bd3lm-s4)."""
    overrides = config["tasks"]["gsm8k"]["overrides"]
    overrides.setdefault("bd3lm-s4", {})["policies"] = bd3lm
    overrides.setdefault("mdlm", {})["policies"] = mdlm or bd3lm
    return config


def test_each_policy_is_its_own_points_and_the_familys_own_keeps_its_folders(data_dir):
    """policies: [default, dual-cache] gives a model a second curve: <policy>-tau-<τ> folders
    decoded with --policy; its own policy's points keep their folders, commands and hashes."""
    env = {"SETDLM_DATA_DIR": str(data_dir)}
    plan = build(_tiny(), env)
    dual = build(_with_policies(_tiny(), bd3lm=["default", "dual-cache"]), env)
    added = set(dual.points) - set(plan.points)
    assert added == {
        ("gsm8k", "bd3lm-s4", "dual-cache-tau-1e+06"),
        ("gsm8k", "bd3lm-s4", "dual-cache-tau-0.9"),
        ("gsm8k", "bd3lm-s4", "dual-cache-tau-0.5"),
        ("gsm8k", "mdlm", "dual-cache-tau-1e+06"),
    }
    for key, point in plan.points.items():
        assert dual.points[key].config_hash == point.config_hash
        assert dual.points[key].command == point.command
    point = dual.point("gsm8k", "bd3lm-s4", "dual-cache-tau-0.9")
    assert point.folder == "results/runs/tiny/gsm8k/bd3lm-s4/dual-cache-tau-0.9"
    assert "--threshold 0.9 " in point.command and "--policy dual-cache" in point.command
    same = plan.point("gsm8k", "bd3lm-s4", "tau-0.9")
    assert point.config_hash != same.config_hash
    # naming the family's own policy is the same as "default"
    own = build(_set(_tiny(), "tasks.gsm8k.policies", ["default"]), env)
    named = build(_with_policies(_tiny(), bd3lm=["block-cache"], mdlm=["semi-ar"]), env)
    assert set(own.points) == set(named.points) == set(plan.points)
    assert all(named.points[k].config_hash == p.config_hash for k, p in plan.points.items())


@pytest.mark.parametrize("task", ["cnndm", "unconditional"])
def test_batching_reaches_the_command_and_only_a_non_default_changes_a_point(data_dir, task):
    env = {"SETDLM_DATA_DIR": str(data_dir)}
    plan = build(_tiny(), env)
    auto = build(_set(_tiny(), f"tasks.{task}.batching", "auto"), env)
    assert all(auto.points[k].config_hash == p.config_hash for k, p in plan.points.items())
    # every setting is spelled out in the command, auto included (setdlm eval's default)
    assert all("--batching auto" in p.command for k, p in plan.points.items() if k[0] == task)
    pooled = build(
        _set(_set(_tiny(), f"tasks.{task}.batching", "continuous"), f"tasks.{task}.batch_size", 4),
        env,
    )
    differ = {k for k, p in plan.points.items() if pooled.points[k].config_hash != p.config_hash}
    assert differ == {k for k in plan.points if k[0] == task} != set()
    point = next(p for k, p in pooled.points.items() if k[0] == task)
    assert "--batch-size 4 " in point.command and "--batching continuous" in point.command
    with pytest.raises(ConfigError, match="batching"):
        build(_set(_tiny(), f"tasks.{task}.batching", "dynamic"), env)


def test_paper_plan_skips_unloadable_checkpoints_with_a_warning(data_dir, monkeypatch):
    from setdlm.workflow import plan as plan_module

    published = plan_module.load_published()
    published["checkpoints"]["owt:ar"] = {
        **published["checkpoints"]["owt:ar"],
        "loadable": False,
        "note": "a test marks it unloadable",
    }
    monkeypatch.setattr(plan_module, "load_published", lambda: published)
    warnings = []
    plan = build(_paper(), {"SETDLM_DATA_DIR": str(data_dir)}, log=warnings.append)
    assert len([k for k in plan.points if k[0] == "gsm8k"]) == 2 + 6 * 10
    assert ("infill-1", "ar", "tau-1e+06") not in plan.points
    assert any("infill-1/ar: owt:ar cannot be loaded" in w for w in warnings)
    assert "--window 32" in plan.point("infill-3", "setdlm-smax32", "tau-1e+06").command
    assert (
        plan.point("gsm8k", "bd3lm-s8", "tau-0.6")
        .inputs["model"]
        .endswith("models/bd3lm-s8/checkpoint-gsm8k.json")
    )
    assert set(plan.data) == {"gsm8k", "cnn_dailymail", "rocstories", "openwebtext", "lm1b"}


# ----------------------------------------------------------------------------- result guards
def test_a_result_folder_resumes_the_same_job_and_clears_another(tmp_path):
    folder = tmp_path / "point"
    points.start(folder, "hash-a", "v1")
    (folder / "samples.jsonl").write_text('{"id": "a"}\n')
    points.start(folder, "hash-a", "v1")  # rerun of the same job: keep its samples
    assert (folder / "samples.jsonl").exists()
    points.start(folder, "hash-b", "v1")  # another configuration: start over
    assert not (folder / "samples.jsonl").exists()
    (folder / "samples.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n{"id": "a"}\n')
    (folder / "metrics.json").write_text(json.dumps({"examples": 3}))
    with pytest.raises(RuntimeError, match="repeats examples"):
        points.finish(folder)
    (folder / "samples.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')
    with pytest.raises(RuntimeError, match="counts 3 examples"):
        points.finish(folder)
    (folder / "metrics.json").write_text(json.dumps({"examples": 2}))
    assert points.finish(folder)["examples"] == 2


# ------------------------------------------------------------------------------------ data
def test_prepared_data_has_a_manifest_that_matches_the_mirror(tmp_path, data_dir):
    from setdlm.workflow.data import main

    out = tmp_path / "data"
    for name in ("gsm8k", "rocstories"):
        assert main(["prepare", "--dataset", name, "--source", "dir", "--out", str(out)]) == 0
    assert main(["manifest", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    entries = {entry["path"]: entry for entry in manifest["files"]}
    assert entries["gsm8k/test.jsonl"]["rows"] == 1319
    assert entries["rocstories/cloze_test_val__spring2016.csv"]["rows"] == 1871
    sums = {}
    for line in (data_dir / "SHA256SUMS").read_text().splitlines():
        digest, path = line.split("  ")
        sums[path.removeprefix("./")] = digest
    for path, entry in entries.items():
        assert sums[path] == entry["sha256"], path
    assert main(["verify", str(out)]) == 0
    with open(out / "gsm8k" / "test.jsonl", "a") as handle:
        handle.write('{"question": "q", "answer": "#### 1"}\n')
    assert datasets.verify(out) == ["gsm8k/test.jsonl: sha256 differs from the manifest"]


def test_hub_sources_are_written_in_the_mirror_format(tmp_path, monkeypatch):
    import datasets as hf_datasets

    from setdlm.tasks import cnndm, likelihood

    fake = {
        "abisee/cnn_dailymail": [{"id": "c1", "article": "A story .", "highlights": "Short ."}],
        "wikitext": [{"text": " = Title = \n"}, {"text": "\n"}, {"text": " Body text .\n"}],
        "lm1b": [{"text": "one sentence ."}, {"text": "another ."}],
    }
    monkeypatch.setattr(
        hf_datasets,
        "load_dataset",
        lambda hub_id, config=None, split=None: hf_datasets.Dataset.from_list(fake[hub_id]),
    )
    # The Hub "answers" (load_dataset is the fake above): the offline refusal does not apply.
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    out = tmp_path / "data"
    for name in ("cnn_dailymail", "wikitext2", "lm1b"):
        part = datasets.prepare(name, "hub", out, None, log=lambda *_: None)
        assert part["files"][0]["source"]["kind"] == "hub"
    assert (out / "wikitext2" / "wiki.test.raw").read_text() == " = Title = \n Body text .\n"
    monkeypatch.setenv("SETDLM_DATA_DIR", str(out))
    # The task loaders read the prepared copies: CNN/DM's full split, LM1B's documents.
    assert cnndm.load_test_articles() == [cnndm.Article("c1", "A story .", "Short .")]
    assert cnndm.data_source()["source"] == "cnn_dailymail/test.jsonl"
    assert likelihood.heldout_documents("lm1b") == ["one sentence .", "another ."]


# ------------------------------------------------------------------------------- training
@pytest.mark.slow  # runs snakemake or setdlm train in a subprocess
def test_setdlm_train_trains_exactly_like_the_tiny_job(tmp_path, data_dir, monkeypatch):
    from safetensors.torch import load_file

    from setdlm.recipes.tiny import TinySettings, run_tiny
    from setdlm.workflow.train import main

    monkeypatch.setenv("SETDLM_DATA_DIR", str(data_dir))
    small = {"steps": 3, "warmup_steps": 1, "hidden_size": 32, "batch_size": 4}
    config = copy.deepcopy(MINI) | {"train": small}
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    out = tmp_path / "models" / "setdlm-smax8"
    assert main(["--config", str(config_path), "--model", "setdlm-smax8", "--out", str(out)]) == 0
    run_tiny(
        tmp_path / "tiny",
        TinySettings(**small, num_prompts=1, new_tokens=2),
        ("setdlm",),
        log=lambda *_: None,
    )
    ours = load_file(out / "model.safetensors")
    tiny = load_file(tmp_path / "tiny" / "setdlm" / "model" / "model.safetensors")
    assert ours.keys() == tiny.keys()
    assert all(ours[name].equal(tiny[name]) for name in ours)
    assert (out / "tokenizer.json").read_bytes() == (
        tmp_path / "tiny" / "setdlm" / "model" / "tokenizer.json"
    ).read_bytes()
    marker = json.loads((out / "checkpoint.json").read_text())
    assert marker["steps"] == 3 and set(marker["files"]) >= {"model.safetensors", "config.json"}


@pytest.mark.slow  # runs snakemake or setdlm train in a subprocess
def test_a_preempted_setdlm_train_exits_75_and_the_same_command_resumes(
    tmp_path, data_dir, monkeypatch
):
    import threading

    from safetensors.torch import load_file

    from setdlm.train.preemption import EXIT_PREEMPTED
    from setdlm.workflow.train import main

    monkeypatch.setenv("SETDLM_DATA_DIR", str(data_dir))
    small = {"steps": 200, "warmup_steps": 1, "hidden_size": 32, "batch_size": 4}
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(copy.deepcopy(MINI) | {"train": small}))
    out = tmp_path / "models" / "ar"
    work = tmp_path / "models" / ".training" / "ar"
    command = ["--config", str(config_path), "--model", "ar", "--out", str(out)]

    def warn_once_training():  # the scheduler's warning, 20 steps in
        losses = work / "train" / "losses.jsonl"
        while not (losses.exists() and len(losses.read_text().splitlines()) >= 2):
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGUSR1)

    # A signal arriving after the training would otherwise end pytest itself.
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        threading.Thread(target=warn_once_training, daemon=True).start()
        assert main(command) == EXIT_PREEMPTED
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not (out / "checkpoint.json").exists()
    [attempt] = json.loads((work / "attempts.json").read_text())
    stopped = attempt["to_step"]
    assert attempt["stopped_by"] == "SIGUSR1" and attempt["from_step"] == 0
    assert 20 <= stopped < 200

    assert main(command) == 0  # the same command again: resumes, does not start over
    marker = json.loads((out / "checkpoint.json").read_text())
    assert [(a["from_step"], a["to_step"]) for a in marker["attempts"]] == [
        (0, stopped),
        (stopped, 200),
    ]
    undisturbed = tmp_path / "undisturbed" / "ar"
    assert main(command[:-1] + [str(undisturbed)]) == 0
    ours, reference = (
        load_file(out / "model.safetensors"),
        load_file(undisturbed / "model.safetensors"),
    )
    assert all(ours[name].equal(reference[name]) for name in reference)


# --------------------------------------------------------------------- the SLURM dry run
@pytest.mark.slow  # runs snakemake or setdlm train in a subprocess
def test_profile_install_and_paper_dry_run_on_slurm(tmp_path, data_dir):
    from setdlm.workflow.profile import main

    env = environ(data_dir) | {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    installed = subprocess.run(
        [str(Path(sys.executable).with_name("setdlm")), "profile", "install", "slurm"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "xdg" / "snakemake" / "slurm" / "config.yaml").is_file()
    assert main(["install", "slurm", "--dest", str(tmp_path / "xdg" / "snakemake")]) == 1
    # The user's command, from the repository, with no SLURM installed.
    work = tmp_path / "work"
    result = subprocess.run(
        [SNAKEMAKE, "--profile", "slurm", "-n", "all_tables", "-d", str(work)]
        + ["--configfile", "workflows/config/paper.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", output, flags=re.MULTILINE))
    # One fetch per model (its four domains); GSM8K's 62 points in 4 shards each, CNN/DM's 8
    # in 8, the unconditional samples' 8 in 4 (the OWT AR and MDLM checkpoints, loadable as
    # DITLegacy, included), each point's own job merging its shards; infilling and likelihood
    # one job per model and task.
    fetches = {name for name in counts if name.startswith("fetch_")}
    assert len(fetches) == 8 and {counts[name] for name in fetches} == {"1"}
    assert counts["evaluate_shard"] == str(62 * 4 + 8 * 8 + 8 * 4)
    merges = [name for name in counts if re.match(r"evaluate_(gsm8k|cnndm|unconditional)_", name)]
    assert len(merges) == 62 + 8 + 8
    # the Hub's four data sets downloaded by jobs, the Story Cloze CSV copied by a local rule
    assert counts["prepare_data"] == "4" and counts["copy_data"] == "1"
    assert counts["total"] == "468"
    job = re.search(
        r"rule evaluate_shard:\n(?:    .*\n)*?    wildcards: where=gsm8k/setdlm-smax32/"
        r"tau-0\.6, shard=0-of-4\n    threads: (\d+)\n    resources: (.*)",
        output,
    )
    assert job, "the first shard of the GSM8K SetDLM-smax32 τ = 0.6 point is not listed"
    assert job.group(1) == "4"
    resources = dict(item.split("=", 1) for item in job.group(2).split(", "))
    assert resources["gpu"] == "1" and resources["gpu_model"] == "h100"
    assert resources["mem_mb"] == "64000" and resources["runtime"] == "720"
    assert resources["slurm_partition"] == "CHANGE_ME_partition"
    assert "points shard results/runs/paper gsm8k/setdlm-smax32/tau-0.6 0-of-4" in output
    assert not (work / "results").exists()  # a dry run writes nothing


@pytest.mark.slow  # runs snakemake or setdlm train in a subprocess
def test_each_table_target_needs_only_its_own_tasks(tmp_path, data_dir):
    def dry_run(*args):
        command = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n", *args]
        done = subprocess.run(command, capture_output=True, text=True, env=environ(data_dir))
        return done.returncode, done.stdout + done.stderr

    code, output = dry_run("table_arithmetic")  # the embedded default: tiny.yaml
    assert code == 0, output[-3000:]
    counts = job_counts(output)
    # tiny.yaml evaluates each model in two jobs of all its seeds (its samples from BOS; every
    # other task, the likelihood too), MDLM, not sampled, in one; each task's points of a model
    # are aggregated over the seeds in one job (3 tasks: the table's solve and infill, and the
    # unconditional samples its claims compare); the reference models (found in the checkout,
    # since the working directory holds none) are copied, one job per model for its five seeds
    evaluations = {name: n for name, n in counts.items() if name.startswith("evaluate_")}
    assert len(evaluations) == 4 + 3 and set(evaluations.values()) == {1}
    aggregates = {name: n for name, n in counts.items() if name.startswith("aggregate_")}
    copies = {name: n for name, n in counts.items() if name.startswith("copy_reference_")}
    assert len(aggregates) == 2 * 4 + 3 and len(copies) == 4 and set(copies.values()) == {1}
    # the problems are generated by code: no data to prepare, only the -arith models
    assert set(counts) - set(evaluations) - set(aggregates) - set(copies) == {
        "table_arithmetic", "total"
    }  # fmt: skip
    # With a job per model of each task (`jobs: task`), a table's target needs only its own
    # tasks' jobs (and those its claims compare: the unconditional samples).
    (tmp_path / "per-task.yaml").write_text(
        yaml.safe_dump({"tasks": {task: {"jobs": "task"} for task in tiny_config()["tasks"]}})
    )
    overlay = ["--configfile", str(TINY_PATH), str(tmp_path / "per-task.yaml")]
    code, output = dry_run("table_likelihood", *overlay)
    assert code == 0, output[-3000:]
    evaluations = [n for n in job_counts(output) if n.startswith("evaluate_")]
    seeds = len(tiny_config()["models"]["ar-arith"]["train"]["seeds"])
    assert len(evaluations) == 4 * seeds
    assert all(n.startswith("evaluate_likelihood_arithmetic_") for n in evaluations)
    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(MINI))
    code, output = dry_run("table_cnndm", "--configfile", str(tmp_path / "mini.yaml"))
    assert code == 2 and "table_cnndm: the configuration has no task of this table" in output
    assert "Traceback" not in output and "mini.yaml" in output  # the message, naming the file
    code, output = dry_run("check", "--configfile", str(tmp_path / "mini.yaml"))
    assert code == 2 and "check: the configuration sets no check.baseline" in output
    assert "Traceback" not in output


# ------------------------------------------------------------------------ the tiny run, e2e
def snakemake(workdir: Path, data_dir: Path, *args, check=True, cores=2, **popen):
    command = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", str(cores)]
    command += [*args, "--configfile", str(workdir / "config.yaml")]
    if popen:
        return subprocess.Popen(command, env=environ(data_dir), **popen)
    result = subprocess.run(command, capture_output=True, text=True, env=environ(data_dir))
    if check:
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def nothing_to_do(result) -> bool:
    return "Nothing to be done" in result.stdout + result.stderr


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("\n\n")[0] if "Job stats:" in output else ""
    return {name: int(n) for name, n in re.findall(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def read_samples(folder: Path) -> list[dict]:
    """The complete lines of samples.jsonl (a killed run may leave a torn last line)."""
    lines = (folder / "samples.jsonl").read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines]


# The module's run writes its results into a folder with a space, in a working directory with
# one: every rule it runs (data, training, evaluation, tables, figures, MLflow) must quote them
# (test_bad_inputs_sweep checks the quoting of every rule's command in a dry run).
RESULTS = "my results"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_dir) -> Path:
    """The reduced configuration's all_tables, run once for the module."""
    workdir = tmp_path_factory.mktemp("workflow") / "a work dir"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(yaml.safe_dump(MINI | {"results": RESULTS}))
    result = snakemake(workdir, data_dir, "all_tables", "all")
    (workdir / "first-run.log").write_text(result.stdout + result.stderr)
    return workdir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    return copy_of_run(finished_run, tmp_path)


@pytest.mark.slow
@pytest.mark.e2e  # the module's workflow run (31 s of make test's setup, AMD EPYC), which the
# two e2e tests below need anyway: in that tier it costs its assertions only (issue 47)
def test_the_tiny_workflow_writes_every_result(finished_run):
    run = finished_run / RESULTS / "runs" / "mini"
    first = job_counts((finished_run / "first-run.log").read_text())
    evaluations = {name: n for name, n in first.items() if name.startswith("evaluate_")}
    # a job per model of each task (the default `jobs: task`): GSM8K's AR and SetDLM (its two
    # τ), the likelihood's two
    assert first["copy_data"] == 2 and first["train_model"] == 2 and len(evaluations) == 4
    # The run ends by saying where its outputs are and how to open MLflow.
    log = (finished_run / "first-run.log").read_text()
    assert "Run mini done:" in log and f"tables   {RESULTS}/tables/mini/" in log
    assert f"setdlm ui --results '{RESULTS}'" in log  # quoted, to paste into a shell
    for key in MINI_POINTS:
        folder = run / key
        metrics = json.loads((folder / "metrics.json").read_text())
        ids = [record["id"] for record in read_samples(folder)]
        assert len(ids) == len(set(ids)) == metrics["examples"], key
    # The evaluations read the prepared copies, which match the manifest.
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    assert {e["path"] for e in manifest["files"]} == {"gsm8k/test.jsonl", "wikitext2/wiki.test.raw"}
    assert datasets.verify(run / "data") == []
    gsm8k = json.loads((run / "gsm8k/ar/tau-1e+06/run.json").read_text())
    assert gsm8k["config"]["model_source"] == f"{RESULTS}/runs/mini/models/ar"
    for model in ("ar", "setdlm-smax8"):
        marker = json.loads((run / "models" / model / "checkpoint.json").read_text())
        assert marker["source"] == "trained" and marker["steps"] == 8
    tables = finished_run / RESULTS / "tables" / "mini"
    assert sorted(p.name for p in tables.iterdir() if p.name != MANIFEST) == sorted(
        f"{stem}.{fmt}" for stem in ("gsm8k_pareto", "likelihood") for fmt in ("csv", "md", "tex")
    )
    figures = finished_run / RESULTS / "figures" / "mini"
    assert sorted(p.name for p in figures.iterdir() if p.name != MANIFEST) == [
        "gsm8k_pareto.pdf",
        "gsm8k_pareto.png",
    ]
    assert (run / "mlflow.synced").exists() and (finished_run / RESULTS / "mlflow.db").exists()


@pytest.mark.slow
@pytest.mark.e2e  # a dry run and a rerun of the workflow (about 20 s)
def test_a_changed_task_setting_reruns_only_the_jobs_it_affects(run_copy, data_dir):
    run = run_copy / RESULTS / "runs" / "mini"
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["tasks"]["likelihood-wikitext2"]["limit"] = 6
    config["tasks"]["gsm8k"]["thresholds"].append(0.9)  # one more point, the others untouched
    (run_copy / "config.yaml").write_text(yaml.safe_dump(config))
    planned = snakemake(run_copy, data_dir, "all", "-n")
    counts = job_counts(planned.stdout + planned.stderr)
    # the 2 likelihood points' jobs, and the job of GSM8K's SetDLM points (one more τ)
    assert {name for name in counts if name.startswith("evaluate_")} == {
        "evaluate_likelihood_wikitext2_ar",
        "evaluate_likelihood_wikitext2_setdlm_smax8",
        "evaluate_gsm8k_setdlm_smax8",
    }
    assert not {"train_model", "prepare_data", "copy_data"} & set(counts)
    assert {"table_likelihood", "table_gsm8k", "figures", "sync_mlflow"} <= set(counts)

    def state(key):  # a point's samples (never decoded again) and what its metrics say
        metrics = json.loads((run / key / "metrics.json").read_text())
        samples = run / key / "samples.jsonl"
        return samples.stat().st_mtime_ns, samples.read_bytes(), metrics["quality"]

    untouched = {key: state(key) for key in MINI_POINTS[:3]}
    untouched_ar = (run / MINI_POINTS[0] / "metrics.json").stat().st_mtime_ns
    snakemake(run_copy, data_dir, "all")
    # GSM8K SetDLM's finished points are rescored from their samples when their job runs again
    # (Snakemake removes a job's outputs before it runs), never decoded again; AR's not touched
    assert untouched == {key: state(key) for key in untouched}
    assert (run / MINI_POINTS[0] / "metrics.json").stat().st_mtime_ns == untouched_ar
    for model in ("ar", "setdlm-smax8"):
        folder = run / "likelihood-wikitext2" / model / "default"
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["examples"] == len(read_samples(folder)) == 6
    assert (run / "gsm8k/setdlm-smax8/tau-0.9/metrics.json").exists()
    assert nothing_to_do(snakemake(run_copy, data_dir, "all"))


def _snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``folder``: its size, modification time and sha256; Snakemake's own
    logs and cache of file times (which a dry run keeps for the next one) aside."""
    import hashlib

    return {
        str(path.relative_to(folder)): (
            path.stat().st_size,
            path.stat().st_mtime_ns,
            hashlib.sha256(path.read_bytes()).hexdigest(),
        )
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and not path.is_symlink()
        and not str(path.relative_to(folder)).startswith((".snakemake/iocache", ".snakemake/log"))
    }


@pytest.mark.slow
@pytest.mark.e2e  # seven Snakemake invocations, then a repairing run (about 30 s)
def test_a_dry_run_or_a_read_only_command_changes_no_file(run_copy, data_dir):
    """Issue 27: `snakemake -n` (and --summary, --dag, --list-changes, --touch -n) on a finished
    run whose configuration gained a τ and a model, with a result lost, one unreadable and the
    MLflow store gone, moves, rewrites and deletes nothing; it says what a run would repair.
    The real run afterwards does repair it."""
    run = run_copy / RESULTS / "runs" / "mini"
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["tasks"]["gsm8k"]["thresholds"].append(0.9)  # a τ added
    config["models"]["bd3lm-s4"] = {"family": "bd3lm", "block_size": 4, "train": {}}
    config["tasks"]["likelihood-wikitext2"]["models"].append("bd3lm-s4")  # a model added
    (run_copy / "config.yaml").write_text(yaml.safe_dump(config))
    shutil.rmtree(run / MINI_POINTS[0])  # a point deleted
    (run / MINI_POINTS[2] / "metrics.json").write_text("{ torn")  # a point unreadable
    (run_copy / RESULTS / "mlflow.db").write_bytes(b"not a database")
    before = _snapshot(run_copy)
    assert (run_copy / RESULTS / "tables" / "mini" / "gsm8k_pareto.csv").as_posix() in {
        (run_copy / name).as_posix() for name in before
    }
    read_only = [["-n"], ["--dry-run", "-p"], ["--summary"], ["--dag"], ["--touch", "-n"]]
    read_only += [["--list-changes", "params"]]
    for options in read_only:
        result = snakemake(run_copy, data_dir, "all", *options, check=False)
        output = result.stdout + result.stderr
        assert result.returncode == 0, (options, output[-3000:])
        assert _snapshot(run_copy) == before, f"snakemake {' '.join(options)} changed files"
        if options == ["-n"]:
            assert f"{MINI_POINTS[2]}/metrics.json: unreadable result" in output
            assert "a run (not this dry run) moves it aside" in output
            assert "result file(s) are missing" in output and "not this dry run" in output
            assert "syncs the results again" in output
    result = snakemake(run_copy, data_dir, "all")  # the real run repairs what the dry run named
    output = result.stdout + result.stderr
    assert "moved to metrics.json.unreadable-" in output
    for key in MINI_POINTS:
        assert json.loads((run / key / "metrics.json").read_text())["examples"] >= 1, key
    assert (run / "likelihood-wikitext2/bd3lm-s4/default/metrics.json").is_file()
    assert (run / "gsm8k/setdlm-smax8/tau-0.9/metrics.json").is_file()
    assert nothing_to_do(snakemake(run_copy, data_dir, "all"))
