"""The third sweep of bad inputs (issue 50): what the suite READS must be refused as clearly as
the options it is given. Each case ends in a short message naming the file, key or option, what
was found and what was expected; exit status 2; no traceback; nothing the command did not make
is changed, and nothing computed is lost.

The classes of the issue (docs/bad-inputs.md lists them with their rules):

0. the trap that costs hours: a missing, misspelled or file-valued ``reference_models``;
1. outputs written over what the command did not make: ``report --out`` into a user's folder,
   another run's tables;
2. tracebacks on corrupt committed inputs: reference models and their checkpoint.json,
   baselines of the wrong shape, tampered data files, a configuration's results folder that is
   a file, a full disk;
3. silently accepted: stale aggregates over seeds, impossible metrics, a data file that no
   longer matches SHA256SUMS, configuration mistakes past the schema, a server that cannot
   serve what `setdlm ui` announced;
4. unclear: "File exists" for an ``--out`` that is a file, impossible baseline tolerances.

The results are made by the real commands from the committed reference models (a few
problems each, seconds), in this process through ``setdlm``'s entry point, except what needs a
process of its own (Snakemake, the MLflow server).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_bad_inputs import Bad, _fingerprint  # the first sweep's case record and file hashes

from setdlm.cli import main as setdlm

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "results" / "reference" / "models"
SOLVE = "arithmetic-solve/ar-arith/tau-1e+06"  # a point over two training seeds
INFILL = "arithmetic-infill/ar-arith/tau-1e+06"  # a point of one model


def _eval(out: Path, seed: int, variant: str = "solve") -> None:
    argv = ["eval", "arithmetic", "--model", str(REFERENCE / "ar-arith" / f"seed-{seed}")]
    argv += ["--out", str(out), "--limit", "4", "--warmup", "0", "--generator", "arithmetic-4"]
    argv += ["--threshold", "1e6", "--max-new-tokens", "26", "--variant", variant]
    assert setdlm(argv) == 0


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A finished run (a point over two seeds and a point of one model) with its tables, and
    copies of it broken one way each; folders of someone else's."""
    work = tmp_path_factory.mktemp("bad-inputs-third")
    run = work / "results" / "runs" / "done"
    for seed in (0, 1):
        _eval(run / SOLVE / f"seed-{seed}", seed)
    assert setdlm(["aggregate", str(run / SOLVE)]) == 0
    _eval(run / INFILL, 0, "infill")
    assert setdlm(["report", "tables", str(run), "--out", str(work / "tables" / "done")]) == 0
    _broken_results(work)
    _foreign_folders(work / "foreign")
    _broken_baselines(work / "baselines")
    _broken_references(work / "refs", work / "configs")
    _configs(work / "configs", work / "foreign")
    _short_run_models(work / "short-run", work / "reference-copy")
    _broken_mirrors(work / "mirrors")
    _broken_stores(work / "stores")
    return work


def _edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def _broken_results(work: Path) -> None:
    runs = work / "results" / "runs"
    shutil.copytree(runs / "done", runs / "other")  # another run, sound

    def broken(name: str, point: str, edit) -> None:
        shutil.copytree(runs / "done", runs / name)
        edit(runs / name / point)

    def metrics(edit):
        return lambda point: _edit_json(point / "metrics.json", edit)

    def quality(key: str, value):
        return metrics(lambda m: m["quality"]["result_exact"].update({key: value}))

    # 3. stale aggregates: a seed deleted, edited, emptied, recomputed by other code, added
    broken("seed-deleted", SOLVE, lambda point: shutil.rmtree(point / "seed-1"))
    broken(
        "seed-edited",
        SOLVE + "/seed-1",
        metrics(lambda m: m["quality"]["strict_match"].update(value=0.25)),
    )
    broken("seed-emptied", SOLVE, lambda point: (point / "seed-1" / "metrics.json").write_text(""))
    broken(
        "seed-other-code",
        SOLVE + "/seed-1",
        metrics(lambda m: m.update(code_versions=["0123456789abcdef"])),
    )
    broken("seed-added", SOLVE, lambda point: shutil.copytree(point / "seed-1", point / "seed-2"))
    broken(
        "seed-evaluated-again",  # the same quality, newer timings
        SOLVE + "/seed-0",
        metrics(lambda m: m["speed"].update(tokens_per_second_mean=1.5)),
    )
    broken(
        "seed-out-of-range",
        SOLVE + "/seed-0",
        metrics(lambda m: m["quality"]["strict_match"].update(value=1.7)),
    )
    # 3. impossible values in a point's own metrics.json
    broken("fraction-1.7", INFILL, quality("value", 1.7))
    broken("fraction-negative", INFILL, quality("value", -0.1))
    broken("value-null", INFILL, quality("value", None))
    broken("value-text", INFILL, quality("value", "0.9"))
    broken("interval-inverted", INFILL, quality("bootstrap_95", [0.9, 0.1]))
    broken("interval-one-bound", INFILL, quality("bootstrap_95", [0.1]))
    broken("examples-negative", INFILL, metrics(lambda m: m.update(examples=-4)))
    broken("speed-missing", INFILL, metrics(lambda m: m.pop("speed")))
    broken("speed-negative", INFILL, metrics(lambda m: m["speed"].update(nfe_mean=-3)))
    broken("aggregate-seeds-broken", SOLVE, metrics(lambda m: m.update(seeds={"0": 1})))
    broken("quality-a-list", INFILL, metrics(lambda m: m.update(quality=[1, 2])))


COMMITTED = REPO / "results" / "baselines"


def _broken_baselines(root: Path) -> None:
    """The committed baselines, each edited one way: wrong types, missing keys, impossible
    tolerances."""
    root.mkdir()

    def broken(name: str, source: str, edit) -> None:
        value = json.loads((COMMITTED / f"{source}.json").read_text())
        edit(value)
        (root / f"{name}.json").write_text(json.dumps(value))

    def first(points: dict) -> dict:
        return points[sorted(points)[0]]

    broken("decoding-accuracy-minus-50", "decoding", lambda b: b["tolerances"].update(accuracy=-50))
    broken(
        "decoding-agreement-150", "decoding", lambda b: b["tolerances"].update(min_agreement=1.5)
    )
    broken(
        "decoding-no-counted-speed",
        "decoding",
        lambda b: [point.pop("counted") for point in b["points"].values()],
    )
    broken("decoding-scores-a-list", "decoding", lambda b: first(b["points"]).update(scores=[1, 0]))
    broken(
        "decoding-accuracy-text", "decoding", lambda b: first(b["points"]).update(accuracy="0.9")
    )
    broken(
        "decoding-score-missing",
        "decoding",
        lambda b: first(b["points"])["scores"].pop(sorted(first(b["points"])["scores"])[0]),
    )
    broken(
        "training-tolerance-text",
        "training",
        lambda b: b["models"]["ar-arith"]["accuracy"].update(tolerance="0.05"),
    )
    broken(
        "training-tolerance-negative",
        "training",
        lambda b: b["models"]["ar-arith"]["accuracy"].update(tolerance=-0.5),
    )
    broken(
        "training-mean-missing",
        "training",
        lambda b: b["models"]["ar-arith"]["accuracy"].pop("mean"),
    )
    broken("training-models-a-list", "training", lambda b: b.update(models=[1]))
    broken("speed-factor-zero", "engine_speed", lambda b: b.update(factor=0))
    broken(
        "speed-ratio-text",
        "engine_speed",
        lambda b: b["host_per_forward"].update({"ar/1e+06": "fast"}),
    )
    broken("check-metrics-a-list", "tiny", lambda b: first(b["points"]).update(metrics=[1]))
    broken("check-points-a-list", "tiny", lambda b: b.update(points=[1]))


TINY = REPO / "workflows" / "config" / "tiny.yaml"


def _tiny() -> dict:
    return yaml.safe_load(TINY.read_text())


def _broken_references(root: Path, configs: Path) -> None:
    """Copies of a committed reference model (ar-arith, seed 0), each broken one way, and a
    configuration reusing each: what `setdlm train` copies instead of training."""
    configs.mkdir(exist_ok=True)
    source = REFERENCE / "ar-arith" / "seed-0"

    def broken(name: str, edit) -> None:
        folder = root / name / "ar-arith" / "seed-0"
        shutil.copytree(source, folder)
        edit(folder)
        config = _tiny()
        config["reference_models"] = str(root / name)
        (configs / f"reference-{name}.yaml").write_text(yaml.safe_dump(config))

    def flip(folder: Path) -> None:
        weights = bytearray((folder / "model.safetensors").read_bytes())
        weights[-100] ^= 0xFF
        (folder / "model.safetensors").write_bytes(bytes(weights))

    def marker(edit):
        return lambda folder: _edit_json(folder / "checkpoint.json", edit)

    broken("weights-flipped", flip)
    broken("weights-truncated", lambda folder: _truncate(folder / "model.safetensors"))
    broken("weights-missing", lambda folder: (folder / "model.safetensors").unlink())
    broken(
        "hash-edited",
        marker(lambda m: m["files"].update({"model.safetensors": "0" * 64})),
    )
    broken(
        "config-mismatched",
        lambda folder: _edit_json(folder / "config.json", lambda c: c.update(extra=1)),
    )
    broken("marker-not-json", lambda folder: (folder / "checkpoint.json").write_text("{oops"))
    broken("marker-a-list", lambda folder: (folder / "checkpoint.json").write_text("[]"))
    broken("marker-files-a-list", marker(lambda m: m.update(files=["model.safetensors"])))
    broken("marker-hash-short", marker(lambda m: m["files"].update({"config.json": "abc"})))


def _short_run_models(run: Path, reference: Path) -> None:
    """Two seeds of a 60-step run of ar-arith (their records say so), and a copy of the
    committed 24,000-step reference folder they could be exported into."""
    shutil.copytree(REFERENCE / "ar-arith", reference / "ar-arith")
    for seed in (0, 1):
        folder = run / "ar-arith" / f"seed-{seed}"
        shutil.copytree(REFERENCE / "ar-arith" / f"seed-{seed}", folder)
        _edit_json(folder / "checkpoint.json", lambda m: m["settings"].update(steps=60))
    # a training log whose tenth record lost its loss
    losses = run.parent / "log-broken" / "ar-arith" / "seed-0" / "losses.jsonl"
    losses.parent.mkdir(parents=True)
    records = [json.loads(line) for line in (REFERENCE / "ar-arith/seed-0/losses.jsonl").open()]
    records[9].pop("loss")
    losses.write_text("".join(json.dumps(record) + "\n" for record in records))


DATA = Path(os.environ.get("SETDLM_DATA_DIR", REPO.parent / "shared" / "data"))


def _broken_mirrors(root: Path) -> None:
    """Copies of the data mirror's GSM8K folder and SHA256SUMS: one with an answer edited (still
    valid JSON lines), one not UTF-8 (and not listed, so only its reading can tell)."""
    for name in ("tampered", "not-utf-8"):
        shutil.copytree(DATA / "gsm8k", root / name / "gsm8k")
        shutil.copy(DATA / "SHA256SUMS", root / name / "SHA256SUMS")
    test = root / "tampered" / "gsm8k" / "test.jsonl"
    test.write_text(test.read_text(encoding="utf-8").replace("#### 18", "#### 19", 1))
    test = root / "not-utf-8" / "gsm8k" / "test.jsonl"
    test.write_bytes(test.read_bytes().replace(b"Janet", b"Jan\xe9t", 1))
    sums = root / "not-utf-8" / "SHA256SUMS"
    lines = sums.read_text().splitlines(keepends=True)
    sums.write_text("".join(line for line in lines if "gsm8k/test.jsonl" not in line))


def _broken_stores(root: Path) -> None:
    """Results folders whose mlflow.db is truncated, or corrupted past its header."""
    import sqlite3

    (root / "truncated").mkdir(parents=True)
    database = root / "truncated" / "mlflow.db"
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("CREATE TABLE experiments (name TEXT)")
        db.executemany("INSERT INTO experiments VALUES (?)", [("x" * 500,)] * 200)
        db.commit()
    _truncate(database)
    (root / "corrupted").mkdir()
    (root / "corrupted" / "mlflow.db").write_bytes(b"SQLite format 3\x00" + b"\x13" * 5000)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _configs(root: Path, foreign: Path) -> None:
    """Configurations that pass the schema but not what lies beyond it."""

    def variant(name: str, edit) -> None:
        config = _tiny()
        edit(config)
        (root / f"{name}.yaml").write_text(yaml.safe_dump(config))

    variant("reference-misspelled", lambda c: c.update(reference_models="results/refrence/models"))
    variant("reference-a-file", lambda c: c.update(reference_models=str(foreign / "a-file.txt")))
    variant("reference-blank", lambda c: c.update(reference_models=" "))
    variant(
        "reference-one-level-up",
        lambda c: c.update(reference_models=str(REPO / "results" / "reference")),
    )
    variant("results-a-file", lambda c: c.update(results=str(foreign / "a-file.txt")))
    variant("results-empty", lambda c: c.update(results=""))
    variant("results-in-the-package", lambda c: c.update(results=str(REPO / "setdlm" / "out")))
    variant(
        "tables-over-the-reference",
        lambda c: c.update(report={"tables": str(REPO / "results/reference/tiny/tables")}),
    )
    variant("figures-blank", lambda c: c.update(report={"figures": "  "}))
    variant("name-with-a-newline", lambda c: c.update(name="tiny\n"))
    variant(
        "model-with-a-newline",
        lambda c: c["models"].update({"ar-arith\n": c["models"].pop("ar-arith")}),
    )
    variant("window-a-billion", lambda c: c["models"]["setdlm-smax8-arith"].update(window=10**9))
    text = TINY.read_text()
    (root / "key-twice.yaml").write_text(text + "\nname: tiny-again\n")
    solve = text.index("  arithmetic-solve:")
    block = text[solve : text.index("  arithmetic-infill:")]
    again = solve + len(block)  # the block given a second time, right after the first
    block = block.replace("300", "3").replace("&speed-subset ", "")  # an anchor is defined once
    (root / "task-twice.yaml").write_text(text[:again] + block + text[again:])


def _foreign_folders(root: Path) -> None:
    """Folders of someone else's: a user's own tables, a file where a folder is expected."""
    (root / "mine").mkdir(parents=True)
    (root / "mine" / "arithmetic_pareto.md").write_text("# my own notes on the arithmetic runs\n")
    (root / "mine" / "gsm8k_pareto.md").write_text("# my GSM8K table, from the paper's code\n")
    (root / "mine" / "learning_curves.md").write_text("# my notes on the learning curves\n")
    (root / "mine" / "arithmetic-solve_pareto.png").write_bytes(b"\x89PNG my own figure")
    (root / "a-file.txt").write_text("not a folder\n")


RUN = "{results}/runs/"
TABLES = "report tables " + RUN
CHECK = "check --baseline {scratch}/b.json --write " + RUN
STALE = "stale aggregate over seeds"
# refused before any decoding: the committed configuration and reference models
DECODING = (
    f"check-decoding --config {REPO}/workflows/config/tiny.yaml --models {REFERENCE} "
    "--limit 1 --baseline {baselines}/"
)
TRAINING = f"check-training {REFERENCE} --baseline {{baselines}}/"

GSM8K = f"eval gsm8k --model {REFERENCE}/ar-arith/seed-0 --out {{scratch}}/g --limit 1 --warmup 0"
ARITHMETIC = (
    f"eval arithmetic --model {REFERENCE}/{{model}}/seed-0 --out {{{{scratch}}}}/a "
    "--generator arithmetic-4 --limit 2 --warmup 0"
)
TRAIN = "train --model ar-arith --seed 0 --out {scratch}/model --config {configs}/"

CASES = [
    # --------------------------------------------- 0. the trap that costs hours of training
    Bad(
        "reference-models-misspelled",
        TRAIN + "reference-misspelled.yaml",
        ("reference_models: 'results/refrence/models' does not exist", "null to train"),
    ),
    Bad(
        "reference-models-a-file",
        TRAIN + "reference-a-file.yaml",
        ("reference_models:", "a-file.txt is a file", "folder of models"),
    ),
    Bad("reference-models-blank", TRAIN + "reference-blank.yaml", ("reference_models: ' '",)),
    Bad(
        "reference-models-one-level-up",
        TRAIN + "reference-one-level-up.yaml",
        ("reference_models:", "holds none of the models", "ar-arith"),
    ),
    # ----------------------------------------- 2. corrupt reference models: no copy is made
    Bad(
        "reference-weights-flipped",
        TRAIN + "reference-weights-flipped.yaml",
        ("weights-flipped/ar-arith/seed-0/model.safetensors", "records", "nothing was copied"),
    ),
    Bad(
        "reference-weights-truncated",
        TRAIN + "reference-weights-truncated.yaml",
        ("weights-truncated/ar-arith/seed-0/model.safetensors", "nothing was copied"),
    ),
    Bad(
        "reference-weights-missing",
        TRAIN + "reference-weights-missing.yaml",
        ("model.safetensors: sha256 missing", "nothing was copied"),
    ),
    Bad(
        "reference-hash-edited",
        TRAIN + "reference-hash-edited.yaml",
        ("hash-edited/ar-arith/seed-0/model.safetensors", "records 0000000000000000"),
    ),
    Bad(
        "reference-config-mismatched",
        TRAIN + "reference-config-mismatched.yaml",
        ("config-mismatched/ar-arith/seed-0/config.json", "nothing was copied"),
    ),
    Bad(
        "reference-marker-not-json",
        TRAIN + "reference-marker-not-json.yaml",
        ("marker-not-json/ar-arith/seed-0/checkpoint.json", "not valid JSON"),
    ),
    Bad(
        "reference-marker-a-list",
        TRAIN + "reference-marker-a-list.yaml",
        ("marker-a-list/ar-arith/seed-0/checkpoint.json", "expected a JSON object"),
    ),
    Bad(
        "reference-marker-files-a-list",
        TRAIN + "reference-marker-files-a-list.yaml",
        ("checkpoint.json: files is ['model.safetensors']", "file: sha256"),
    ),
    Bad(
        "reference-marker-hash-short",
        TRAIN + "reference-marker-hash-short.yaml",
        ("checkpoint.json: files.config.json is 'abc'", "64 hex digits"),
    ),
    Bad(
        "export-references-mixing-two-recipes",
        "export-references {short-run} --out {reference-copy}",
        ("reference-copy/ar-arith/seed-2 (kept)", "steps = 24000", "with 60", "two recipes"),
    ),
    # ------------------------------------- 2 and 3. data files that are not what is listed
    Bad(
        "eval-on-tampered-data",
        GSM8K,
        ("tampered/gsm8k/test.jsonl", "SHA256SUMS lists", "nothing was computed"),
        {"SETDLM_DATA_DIR": "{mirrors}/tampered"},
    ),
    Bad(
        "eval-on-data-not-utf-8",
        GSM8K + " --limit 2",
        ("not-utf-8/gsm8k/test.jsonl", "not UTF-8 text"),
        {"SETDLM_DATA_DIR": "{mirrors}/not-utf-8"},
    ),
    Bad(
        "prepare-tampered-data",
        "data prepare --dataset gsm8k --source dir --out {scratch}/prepared",
        ("tampered/gsm8k/test.jsonl", "differs from", "SHA256SUMS"),
        {"SETDLM_DATA_DIR": "{mirrors}/tampered"},
    ),
    Bad(
        "prepare-data-not-utf-8",
        "data prepare --dataset gsm8k --source dir --out {scratch}/prepared-u",
        ("gsm8k/test.jsonl", "not UTF-8 text"),
        {"SETDLM_DATA_DIR": "{mirrors}/not-utf-8"},
    ),
    # ------------------------------------------ 2 and 3. configurations beyond the schema
    Bad(
        "config-results-a-file",
        TRAIN + "results-a-file.yaml",
        ("results:", "a-file.txt", "is a file", "expected a folder"),
    ),
    Bad(
        "config-results-empty",
        TRAIN + "results-empty.yaml",
        ("results: ''", "working directory"),
    ),
    Bad(
        "config-results-in-the-package",
        TRAIN + "results-in-the-package.yaml",
        ("results:", "inside the installed setdlm package"),
    ),
    Bad(
        "config-tables-over-the-reference",
        TRAIN + "tables-over-the-reference.yaml",
        ("report.tables:", "inside the committed reference outputs"),
    ),
    Bad("config-figures-blank", TRAIN + "figures-blank.yaml", ("report.figures: '  '",)),
    Bad(
        "config-name-with-a-newline",
        TRAIN + "name-with-a-newline.yaml",
        ("name: 'tiny\\n' does not match",),
    ),
    Bad(
        "config-model-with-a-newline",
        TRAIN + "model-with-a-newline.yaml",
        ("models.'ar-arith\\n': not a model name",),
    ),
    Bad(
        "config-key-twice",
        TRAIN + "key-twice.yaml",
        ("key-twice.yaml", "duplicate key 'name'", "give each key once"),
    ),
    Bad(
        "config-task-twice",
        TRAIN + "task-twice.yaml",
        ("task-twice.yaml", "duplicate key 'arithmetic-solve'"),
    ),
    # ------------------------------------- 1. outputs written over what the command did not make
    Bad(
        "tables-over-a-users-file",
        TABLES + "done --out {foreign}/mine",
        ("mine/arithmetic_pareto.md", "not written by this command", "--out"),
    ),
    Bad(
        "tables-over-another-runs-tables",
        TABLES + "other --out {tables}/done",
        ("done/arithmetic_pareto.md", "written for run done, not for run other"),
    ),
    Bad(
        "figures-over-a-users-file",
        "report figures " + RUN + "done --out {foreign}/mine --only arithmetic-solve",
        ("mine/arithmetic-solve_pareto.png", "not written by this command"),
    ),
    Bad(
        "curves-over-a-users-file",
        f"report curves {REFERENCE} --tables {{foreign}}/mine --figures {{scratch}}/f",
        ("mine/learning_curves.md", "not written by this command", "--tables"),
    ),
    # ----------------------------------------------------------------- 3. stale aggregates
    Bad(
        "tables-seed-deleted",
        TABLES + "seed-deleted --out {scratch}/t",
        ("seed-deleted/" + SOLVE + "/metrics.json", "seed-1/metrics.json is missing", "aggregate"),
    ),
    Bad(
        "check-seed-deleted",
        CHECK + "seed-deleted",
        ("seed-1/metrics.json is missing", "setdlm aggregate"),
    ),
    Bad(
        "tables-seed-edited",
        TABLES + "seed-edited --out {scratch}/t",
        (STALE, "seed-1/metrics.json has quality.strict_match 0.25", "recorded"),
    ),
    Bad(
        "figures-seed-edited",
        "report figures " + RUN + "seed-edited --out {scratch}/f",
        (STALE, "quality.strict_match 0.25"),
    ),
    Bad(
        "sync-seed-edited",
        "sync " + RUN + "seed-edited --tracking-uri sqlite:///{scratch}/m.db",
        (STALE, "quality.strict_match 0.25"),
    ),
    Bad(
        "tables-seed-emptied",
        TABLES + "seed-emptied --out {scratch}/t",
        ("seed-emptied/" + SOLVE + "/seed-1/metrics.json", "not valid JSON"),
    ),
    Bad(
        "tables-seed-from-other-code",
        TABLES + "seed-other-code --out {scratch}/t",
        (STALE, "computed by code 0123456789abcdef"),
    ),
    Bad(
        "tables-seed-added",
        TABLES + "seed-added --out {scratch}/t",
        (STALE, "seed-2 holds a result the aggregate leaves out"),
    ),
    Bad(
        "figures-seed-evaluated-again",
        "report figures " + RUN + "seed-evaluated-again --out {scratch}/f",
        (STALE, "seed-0/metrics.json has speed.tokens_per_second_mean 1.5", "evaluated again"),
    ),
    Bad(
        "aggregate-seed-out-of-range",
        "aggregate " + RUN + "seed-out-of-range/" + SOLVE,
        ("seed-0/metrics.json", "quality.strict_match.value is 1.7", "[0, 1]"),
    ),
    # ------------------------------------------------------------- 3. impossible values
    Bad(
        "tables-fraction-1.7",
        TABLES + "fraction-1.7 --out {scratch}/t",
        ("fraction-1.7/" + INFILL + "/metrics.json", "quality.result_exact.value is 1.7", "[0, 1]"),
    ),
    Bad(
        "check-fraction-negative",
        CHECK + "fraction-negative",
        ("quality.result_exact.value is -0.1", "[0, 1]"),
    ),
    Bad(
        "tables-value-null",
        TABLES + "value-null --out {scratch}/t",
        ("quality.result_exact.value is null", "expected a number"),
    ),
    Bad(
        "figures-value-text",
        "report figures " + RUN + "value-text --out {scratch}/f",
        ("quality.result_exact.value is '0.9'", "expected a number"),
    ),
    Bad(
        "tables-interval-inverted",
        TABLES + "interval-inverted --out {scratch}/t",
        ("quality.result_exact.bootstrap_95 is [0.9, 0.1]", "lower bound exceeds"),
    ),
    Bad(
        "sync-interval-one-bound",
        "sync " + RUN + "interval-one-bound --tracking-uri sqlite:///{scratch}/m.db",
        ("quality.result_exact.bootstrap_95 is [0.1]", "[low, high]"),
    ),
    Bad(
        "tables-examples-negative",
        TABLES + "examples-negative --out {scratch}/t",
        ("examples is -4", ">= 0"),
    ),
    Bad(
        "tables-speed-missing",
        TABLES + "speed-missing --out {scratch}/t",
        ("speed is missing", "decoding run"),
    ),
    Bad(
        "check-speed-negative",
        CHECK + "speed-negative",
        ("speed.nfe_mean is -3", ">= 0"),
    ),
    Bad(
        "tables-aggregate-seeds-broken",
        TABLES + "aggregate-seeds-broken --out {scratch}/t",
        ("seeds is {{'0': 1}}", "list of the aggregated seeds"),
    ),
    Bad(
        "tables-quality-a-list",
        TABLES + "quality-a-list --out {scratch}/t",
        ("quality-a-list/" + INFILL + "/metrics.json", "expected a 'quality' object"),
    ),
    # ------------------------------------------- 2 and 4. baselines of the wrong shape
    Bad(
        "decoding-baseline-scores-a-list",
        DECODING + "decoding-scores-a-list.json",
        ("decoding-scores-a-list.json", ".scores: [1, 0] is not of type 'object'"),
    ),
    Bad(
        "decoding-baseline-accuracy-text",
        DECODING + "decoding-accuracy-text.json",
        (".accuracy: '0.9' is not of type 'number'",),
    ),
    Bad(
        "decoding-baseline-score-missing",
        DECODING + "decoding-score-missing.json",
        (".scores: no score for", "expected one per output"),
    ),
    Bad(
        "decoding-baseline-without-counted-speed",
        DECODING + "decoding-no-counted-speed.json",
        ("'counted' is a required property",),
    ),
    Bad(
        "decoding-baseline-accuracy-minus-50-points",
        DECODING + "decoding-accuracy-minus-50.json",
        ("tolerances.accuracy: -50 is less than the minimum of 0",),
    ),
    Bad(
        "decoding-baseline-agreement-150-percent",
        DECODING + "decoding-agreement-150.json",
        ("tolerances.min_agreement: 1.5 is greater than the maximum of 1",),
    ),
    Bad(
        "training-baseline-tolerance-text",
        TRAINING + "training-tolerance-text.json",
        ("models.ar-arith.accuracy.tolerance: '0.05' is not of type 'number'",),
    ),
    Bad(
        "training-baseline-tolerance-negative",
        TRAINING + "training-tolerance-negative.json",
        ("models.ar-arith.accuracy.tolerance: -0.5 is less than the minimum of 0",),
    ),
    Bad(
        "training-baseline-mean-missing",
        TRAINING + "training-mean-missing.json",
        ("models.ar-arith.accuracy: 'mean' is a required property",),
    ),
    Bad(
        "training-baseline-models-a-list",
        TRAINING + "training-models-a-list.json",
        ("models: [1] is not of type 'object'",),
    ),
    Bad(
        "training-log-without-a-loss",
        f"check-training {{log-broken}} --baseline {COMMITTED}/training.json",
        ("log-broken/ar-arith/seed-0/losses.jsonl: record 10: loss is None", "expected a number"),
    ),
    Bad(
        "speed-baseline-factor-zero",
        "check-speed --baseline {baselines}/speed-factor-zero.json",
        ("factor: 0 is less than the minimum of 1",),
    ),
    Bad(
        "speed-baseline-ratio-text",
        "check-speed --baseline {baselines}/speed-ratio-text.json",
        ("host_per_forward.ar/1e+06: 'fast' is not of type 'number'",),
    ),
    Bad(
        "check-baseline-metrics-a-list",
        "check --baseline {baselines}/check-metrics-a-list.json " + RUN + "done",
        (".metrics: [1] is not of type 'object'",),
    ),
    Bad(
        "check-baseline-points-a-list",
        "check --baseline {baselines}/check-points-a-list.json " + RUN + "done",
        ("check-points-a-list.json", "'points' object"),
    ),
    # --------------------------------------------- 3. `setdlm ui` announcing what it cannot serve
    Bad(
        "ui-on-a-truncated-store",
        "ui --results {stores}/truncated --port 5431",
        ("truncated/mlflow.db is corrupted", "left as it is", "setdlm sync"),
    ),
    Bad(
        "ui-on-a-corrupted-store",
        "ui --results {stores}/corrupted --port 5432",
        ("corrupted/mlflow.db is corrupted", "not served"),
    ),
    Bad(
        "ui-host-unresolvable",
        "ui --results {scratch}/r --host no-such-host.invalid",
        ("--host no-such-host.invalid: cannot be resolved",),
    ),
    Bad(
        "ui-host-not-this-machine",
        "ui --results {scratch}/r --host 192.0.2.1 --port 5433",  # TEST-NET-1: never local
        ("--host 192.0.2.1 --port 5433: cannot listen there",),
    ),
    # ------------------------------------------------- 3. options the model contradicts
    Bad(
        "eval-window-a-billion",
        ARITHMETIC.format(model="setdlm-smax8-arith") + " --window 1000000000",
        ("--window", "'1000000000' is not an integer >= 1 and <= 32768"),
    ),
    Bad(
        "eval-window-wider-than-the-model",
        ARITHMETIC.format(model="setdlm-smax8-arith") + " --window 100",
        ("--window 100: wider than the model length 64", "at most 64"),
    ),
    Bad(
        "eval-another-generator-than-the-models",
        ARITHMETIC.format(model="ar-arith").replace("arithmetic-4", "arithmetic-2"),
        (
            "--generator arithmetic-2",
            "trained on arithmetic-4",
            "expected --generator arithmetic-4",
        ),
    ),
    Bad(
        "likelihood-another-generator-than-the-models",
        f"eval likelihood --model {REFERENCE}/ar-arith/seed-0 --out {{scratch}}/l "
        "--data arithmetic --generator arithmetic-3 --limit 2",
        ("--generator arithmetic-3", "trained on arithmetic-4"),
    ),
    Bad(
        "config-window-a-billion",
        TRAIN + "window-a-billion.yaml",
        ("models.setdlm-smax8-arith.window", "<= 32768"),
    ),
    # ---------------------------------------------------------------------------- 4. unclear
    Bad(
        "eval-out-a-file",
        f"eval arithmetic --model {REFERENCE}/ar-arith/seed-0 --out {{foreign}}/a-file.txt "
        "--generator arithmetic-4 --limit 1 --warmup 0 --max-new-tokens 26",
        ("a-file.txt: File exists", "a file is where a folder is needed"),
    ),
    Bad(
        "eval-out-under-a-file",
        f"eval arithmetic --model {REFERENCE}/ar-arith/seed-0 --out {{foreign}}/a-file.txt/x "
        "--generator arithmetic-4 --limit 1 --warmup 0 --max-new-tokens 26",
        ("a-file.txt/x: Not a directory", "a file is on the way"),
    ),
    Bad(
        "train-out-a-file",
        "train --model ar-arith --seed 0 --out {foreign}/a-file.txt --config " + str(TINY),
        ("a-file.txt: File exists", "a folder is needed"),
    ),
    Bad(
        "check-a-results-file",
        "check --baseline {scratch}/b.json {foreign}/a-file.txt",
        ("a-file.txt: is a file; expected a results folder",),
    ),
    Bad(
        "tables-out-a-file",
        TABLES + "done --out {foreign}/a-file.txt",
        ("--out", "a-file.txt", "is a file; expected a folder"),
    ),
]


def _paths(work: Path, scratch: Path) -> dict[str, str]:
    names = ("results", "tables", "foreign", "baselines", "configs", "short-run", "reference-copy")
    names += ("mirrors", "stores", "log-broken")
    return {name: str(work / name) for name in names} | {"scratch": str(scratch)}


def test_the_sweep_holds_distinct_cases():
    assert len({case.id for case in CASES}) == len(CASES)
    assert len({case.argv for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_bad_input_is_refused_in_a_line_and_changes_nothing(
    case, work, tmp_path, monkeypatch, capsys
):
    paths = _paths(work, tmp_path)
    monkeypatch.chdir(tmp_path)  # what a command would write into the working directory
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value.format(**paths))
    before = _fingerprint(work)
    try:
        code = setdlm(shlex.split(case.argv.format(**paths)))
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


# --------------------------------------------------- 0. what the plan trains instead of copying
def _forecast(config: dict) -> str | None:
    from setdlm.workflow.plan import build
    from setdlm.workflow.references import forecast

    return forecast(build(config, {}, log=lambda message: None))


def test_the_plan_says_how_many_models_it_trains_and_for_how_long(tmp_path, monkeypatch):
    from configs import tiny_config, tiny_quick_config, tiny_with_overlay

    monkeypatch.chdir(tmp_path)  # another folder: the committed models are found all the same
    assert _forecast(tiny_config()) is None  # every model copied
    trained = _forecast(tiny_with_overlay(TINY.with_name("tiny-train.yaml")))
    assert "20 model(s) will be trained here" in trained and "reference_models is null" in trained
    assert "hours of one CPU core" in trained
    quick = _forecast(tiny_quick_config())  # ar-arith's 60 steps: not the reference's recipe
    assert "2 model(s) will be trained" in quick and "steps = 24000, this recipe has 60" in quick
    assert "minutes" in quick


@pytest.mark.slow  # two Snakemake dry runs (about 10 s)
def test_a_dry_run_from_another_folder_copies_and_an_overlay_says_it_trains(tmp_path, data_dir):
    from workflow_env import environ

    command = [str(Path(sys.executable).with_name("snakemake")), "-s", str(REPO / "Snakefile")]
    command += ["-d", str(tmp_path), "-n", "--cores", "1", "all_models"]
    default = subprocess.run(command, capture_output=True, text=True, env=environ(data_dir))
    assert default.returncode == 0, default.stderr[-3000:]
    assert "will be trained here" not in default.stdout + default.stderr
    overlay = ["--configfile", str(TINY), str(TINY.with_name("tiny-train.yaml"))]
    train = subprocess.run(
        [*command, *overlay], capture_output=True, text=True, env=environ(data_dir)
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert "20 model(s) will be trained here" in train.stderr
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


# ------------------------------------------------------------- 3. a port another server holds
def test_ui_refuses_a_port_in_use_before_announcing_it(work, tmp_path, capsys):
    with socket.socket() as other:  # another server on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        code = setdlm(["ui", "--results", str(tmp_path), "--port", str(port)])
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    assert f"--port {port}: already in use on 127.0.0.1" in captured.err
    assert "MLflow UI on" not in captured.out and "http://" not in captured.out  # no links
    assert not any(tmp_path.iterdir())  # no store created


# ------------------------------------------------------------------------ 2. a full disk
def test_a_full_disk_is_one_line_naming_the_file_and_what_is_kept(capsys):
    """/dev/full answers every write with ENOSPC, as a full disk does: the samples log (what an
    evaluation appends to) fails in one line that names it, with no chained traceback."""
    from setdlm.eval.records import SampleLog
    from setdlm.util.errors import report

    code = report("setdlm eval", lambda: SampleLog(Path("/dev/full")).append({"id": "test-0"}))
    message = capsys.readouterr().err
    assert code == 2 and message.count("\n") == 1, message
    assert message.startswith("setdlm eval: /dev/full: No space left on device")
    assert "what was finished before is kept" in message and "Traceback" not in message


# ------------------------------------------------------------ 1. what `report --out` may replace
def test_tables_rewrite_their_own_files_and_leave_the_rest(work, tmp_path):
    """The same run's tables are replaced (the manifest says whose they are); a user's file
    of another name beside them is left, and a run's tables are only those it has results
    for: no empty GSM8K table of published numbers over a user's own."""
    out = tmp_path / "tables"
    out.mkdir()
    (out / "gsm8k_pareto.md").write_text("# mine\n")
    (out / "notes.txt").write_text("mine too\n")
    run = work / "results" / "runs" / "done"
    assert setdlm(["report", "tables", str(run), "--out", str(out)]) == 0
    first = _fingerprint(out)
    assert setdlm(["report", "tables", str(run), "--out", str(out)]) == 0  # a rerun: its own
    assert _fingerprint(out) == first
    assert (out / "gsm8k_pareto.md").read_text() == "# mine\n"
    assert (out / "notes.txt").read_text() == "mine too\n"
    assert not (out / "cnndm.md").exists()  # no CNN/DM results, no CNN/DM table
    assert (out / "arithmetic_pareto.md").is_file()


# --------------------------------------------------------------- 3. tables say what code they mix
def test_tables_name_the_code_versions_their_rows_mix(work, tmp_path):
    run = tmp_path / "runs" / "mixed"
    shutil.copytree(work / "results" / "runs" / "done", run)
    _edit_json(run / INFILL / "metrics.json", lambda m: m.update(code_versions=["feedface"]))
    assert setdlm(["report", "tables", str(run), "--out", str(tmp_path / "t")]) == 0
    markdown = (tmp_path / "t" / "arithmetic_pareto.md").read_text()
    assert "mix 2 versions of the code" in markdown and "feedface (1 point" in markdown
    clean = tmp_path / "t-clean"
    assert setdlm(["report", "tables", str(work / "results/runs/done"), "--out", str(clean)]) == 0
    assert "versions of the code" not in (clean / "arithmetic_pareto.md").read_text()


def test_an_aggregate_rebuilt_after_a_change_is_read_again(work, tmp_path):
    """The refusal's advice works: `setdlm aggregate` over the changed seeds, then the
    tables."""
    run = tmp_path / "runs" / "seed-edited"
    shutil.copytree(work / "results" / "runs" / "seed-edited", run)
    assert setdlm(["report", "tables", str(run), "--out", str(tmp_path / "t")]) == 2
    assert setdlm(["aggregate", str(run / SOLVE)]) == 0
    assert setdlm(["report", "tables", str(run), "--out", str(tmp_path / "t")]) == 0
    aggregate = json.loads((run / SOLVE / "metrics.json").read_text())
    assert [s["code_versions"] for s in aggregate["seeds"]] == [
        aggregate["code_versions"]
    ] * 2  # each seed's code, recorded for the next comparison
