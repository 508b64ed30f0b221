"""``setdlm train``: one model of a workflow configuration, trained here or fetched.

    setdlm train --config workflows/config/tiny.yaml --model setdlm-smax8 \\
        --out results/runs/tiny/models/setdlm-smax8
    setdlm train --config workflows/config/paper.yaml --model setdlm-smax8 --domain gsm8k \\
        --out results/runs/paper/models/setdlm-smax8

A model with ``train:`` settings is trained exactly like the tiny job's families
(setdlm/recipes/tiny.py: the same BPE, model config, initial weights and TrainConfig) on
WikiText-2 read through ``SETDLM_DATA_DIR``. OUT becomes a model folder (config.json,
model.safetensors, tokenizer files) and ``OUT/checkpoint.json``, written last, records the
settings and every file's sha256. Training state (checkpoints, losses) lives in ``--work``
(default ``<OUT's parent>/.training/ <name>``): a killed training resumes from its last
checkpoint, while other settings, data or code start it over. SIGUSR1 or SIGTERM (a scheduler's
preemption or time-limit warning) stops it after the current step with a checkpoint of that step
and exit status 75; the same command then resumes from there.

A model with ``checkpoint:`` keys is fetched: the published checkpoint of each domain is loaded
once (config, weights and tokenizer are downloaded into the Hugging Face cache and checked in
full, never running remote code), and ``OUT/checkpoint-<domain>.json`` records its key, Hub id,
snapshot and every file's sha256. Evaluations then load it from the cache by key.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from setdlm.train.preemption import EXIT_PREEMPTED, Preempted
from setdlm.util.errors import ArgumentParser
from setdlm.util.files import atomic_write_json, sha256_file
from setdlm.util.scheduler import current_job
from setdlm.workflow.config import WORKFLOW_DIR, load, train_settings
from setdlm.workflow.plan import code_version

TRAINED_MARKER = "checkpoint.json"


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="setdlm train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="workflow configuration")
    parser.add_argument("--model", required=True, help="a model name under `models`")
    parser.add_argument("--out", type=Path, required=True, help="the model's folder")
    parser.add_argument("--domain", default=None, help="fetch only this domain's checkpoint")
    parser.add_argument("--work", type=Path, default=None, help="training state folder")
    args = parser.parse_args(argv)

    config = load(args.config, check_data=False)
    if args.model not in config["models"]:
        parser.error(
            f"--model {args.model}: not under `models` in {args.config} "
            f"(defined: {', '.join(config['models'])})"
        )
    entry = config["models"][args.model]
    if "train" in entry:
        if args.domain:
            parser.error(f"--domain: {args.model} is trained here, not a published checkpoint")
        work = args.work or args.out.parent / ".training" / args.model
        try:
            train_model(args.model, config, args.out, work)
        except Preempted as stop:
            print(f"setdlm train: {stop}", file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        return 0
    domains = [args.domain] if args.domain else list(entry["checkpoint"])
    for domain in domains:
        if domain not in entry["checkpoint"]:
            parser.error(f"--domain {domain}: models.{args.model}.checkpoint has no {domain} key")
        fetch_checkpoint(args.model, entry, domain, args.out)
    return 0


def tiny_settings(config: dict, name: str):
    """The model's TinySettings: the configuration's train settings, S or d as block size."""
    from setdlm.recipes.tiny import TinySettings

    entry = config["models"][name]
    block_size = entry.get("block_size") or entry.get("d") or TinySettings.block_size
    return TinySettings(**train_settings(config, name), block_size=block_size)


def train_model(name: str, config: dict, out: Path, work: Path, log=print) -> dict:
    from dataclasses import asdict

    from setdlm.checkpoints.folders import save_model
    from setdlm.recipes.tiny import (
        build_tiny_model,
        corpus_documents,
        corpus_identity,
        tiny_tokenizer,
        tiny_train_config,
        training_set,
    )
    from setdlm.train import latest_checkpoint, load_weights, train
    from setdlm.train.checkpoint import read_manifest

    family = config["models"][name]["family"]
    settings = tiny_settings(config, name)
    identity = {
        "model": name,
        "family": family,
        "settings": asdict(settings),
        "data": corpus_identity(settings),
        "code_version": code_version(WORKFLOW_DIR.parent),
    }
    _start_over_unless_same(work, identity, log)
    documents = corpus_documents(settings)
    tokenizer = tiny_tokenizer(work / "tokenizer", documents, settings)
    model = build_tiny_model(family, tokenizer, settings)
    started = time.perf_counter()
    train_set = training_set(settings, tokenizer, documents)
    checkpoints = work / "train" / "checkpoints"
    saved = read_manifest(checkpoints)  # the step a resumed training starts from: the newest
    attempt = {"job": current_job(), "from_step": saved[-1]["step"] if saved else 0}
    try:
        result = train(model, train_set, tiny_train_config(settings), work / "train")
    except Preempted as stop:
        _record_attempt(work, attempt | {"to_step": stop.step, "stopped_by": stop.signal_name})
        raise
    attempts = _record_attempt(work, attempt | {"to_step": result.final_step, "stopped_by": None})
    load_weights(model, latest_checkpoint(work / "train" / "checkpoints"), use_ema=True)
    save_model(model, out)
    tokenizer.save_pretrained(out)  # a model folder is self-contained
    losses = [json.loads(line) for line in result.losses_path.read_text().splitlines()]
    marker = {
        "model": name,
        "source": "trained",
        **identity,
        "steps": result.final_step,
        "seconds_this_run": round(time.perf_counter() - started, 2),
        "first_logged_loss": losses[0]["loss"],
        "last_logged_loss": losses[-1]["loss"],
        "files": _file_hashes(out),
        "job": current_job(),
        # every run of this command on this training: which job took it from which step to which
        "attempts": attempts,
    }
    atomic_write_json(out / TRAINED_MARKER, marker)
    log(f"[{name}] {result.final_step} steps, last loss {losses[-1]['loss']:.3f} -> {out}")
    return marker


def _record_attempt(work: Path, attempt: dict) -> list[dict]:
    """Append ``attempt`` to ``work/attempts.json``; return every attempt so far."""
    path = work / "attempts.json"
    attempts = json.loads(path.read_text()) if path.exists() else []
    attempts.append(attempt)
    atomic_write_json(path, attempts)
    return attempts


def _start_over_unless_same(work: Path, identity: dict, log) -> None:
    """Keep a killed training's checkpoints only if they belong to the same settings."""
    identity = json.loads(json.dumps(identity))  # as read back: tuples become lists
    stamp = work / "settings.json"
    if stamp.exists() and json.loads(stamp.read_text()) != identity:
        log(f"{work}: other settings, data or code than the last training; starting over")
        shutil.rmtree(work)
    if not stamp.exists():
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_json(stamp, identity)


def fetch_checkpoint(name: str, entry: dict, domain: str, out: Path, log=print) -> dict:
    from setdlm.checkpoints.zoo import load_pretrained, load_tokenizer_for

    key = entry["checkpoint"][domain]
    loaded = load_pretrained(key)  # downloads config, weights and tokenizer, checks them all
    tokenizer = load_tokenizer_for(loaded)
    snapshot = loaded.folder
    marker = {
        "model": name,
        "source": "published",
        "domain": domain,
        "key": loaded.spec.key,
        "hub_id": loaded.spec.hub_id,
        "revision": loaded.spec.revision,
        # a Hugging Face cache snapshot folder is named after the commit it holds
        "commit": snapshot.name if snapshot.parent.name == "snapshots" else None,
        "snapshot": str(snapshot),
        "family": loaded.model.config.family,
        "length": loaded.model.config.length,
        "tokenizer": tokenizer.name_or_path,
        "files": _file_hashes(snapshot),
        "job": current_job(),
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"checkpoint-{domain}.json", marker)
    log(f"[{name}] {loaded.spec.key} ({loaded.spec.hub_id}) -> {snapshot}")
    return marker


def _file_hashes(folder: Path) -> dict[str, str]:
    return {
        path.name: sha256_file(path)
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != TRAINED_MARKER
    }
