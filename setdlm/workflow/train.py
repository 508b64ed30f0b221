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
from setdlm.util.files import atomic_write_json, remove_leftover_temporaries, sha256_file
from setdlm.util.scheduler import current_job
from setdlm.util.validation import SEED, SettingError, output_path
from setdlm.workflow.config import (
    WORKFLOW_DIR,
    load,
    model_seeds,
    train_settings,
)
from setdlm.workflow.plan import code_version
from setdlm.workflow.references import (
    TRAINED_MARKER,
    model_recipe,
    read_marker,
    reference_model,
    reference_root,
    tiny_settings,
)


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="setdlm train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="workflow configuration")
    parser.add_argument("--model", required=True, help="a model name under `models`")
    parser.add_argument("--out", type=output_path, required=True, help="the model's folder")
    parser.add_argument(
        "--domain",
        nargs="+",
        default=None,
        help="fetch only these domains' checkpoints (default: every domain of the model)",
    )
    parser.add_argument(
        "--work",
        type=output_path,
        default=None,
        help="training state folder: a new one, or one an earlier `setdlm train` left",
    )
    parser.add_argument(
        "--seed",
        type=SEED,
        default=None,
        help="which of the model's train.seeds to train (required when it has several)",
    )
    parser.add_argument(
        "--seeds",
        type=SEED,
        nargs="+",
        default=None,
        help="several of the model's train.seeds, one after the other in this process, each "
        "into OUT/seed-<k> (the workflow copies a model's reference seeds so)",
    )
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
        seeds = model_seeds(config, args.model)
        if args.seeds is not None:
            if args.seed is not None or args.work is not None:
                parser.error("--seeds: each seed has its own folder; give no --seed or --work")
            unknown = [seed for seed in args.seeds if seed not in (seeds or [])]
            if unknown:
                parser.error(f"--seeds {unknown}: not among {args.model}'s train.seeds {seeds}")
            for seed in args.seeds:
                out = args.out / f"seed-{seed}"
                code = _train_or_stop(
                    args.model, config, out, _work_folder(out, args.model, seed), seed
                )
                if code:
                    return code
            return 0
        if seeds is not None and args.seed not in seeds:
            parser.error(
                f"--seed {args.seed}: {args.model} is trained once per seed of its train.seeds "
                f"{seeds}; name one of them"
            )
        if seeds is None and args.seed is not None:
            parser.error(f"--seed: {args.model} has no train.seeds (its one seed is train.seed)")
        work = args.work or _work_folder(args.out, args.model, args.seed)
        return _train_or_stop(args.model, config, args.out, work, args.seed)
    domains = args.domain or list(entry["checkpoint"])
    for domain in domains:
        if domain not in entry["checkpoint"]:
            parser.error(f"--domain {domain}: models.{args.model}.checkpoint has no {domain} key")
        fetch_checkpoint(args.model, entry, domain, args.out)
    return 0


def _train_or_stop(name: str, config: dict, out: Path, work: Path, seed: int | None) -> int:
    """0 once the model is trained (or copied); 75 when a signal stopped it with a checkpoint."""
    try:
        train_model(name, config, out, work, seed=seed)
    except Preempted as stop:
        print(f"setdlm train: {stop}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    return 0


def _work_folder(out: Path, name: str, seed: int | None) -> Path:
    """Where a model's training state lives: beside the models, hidden (one per seed)."""
    if seed is None:
        return out.parent / ".training" / name
    return out.parent.parent / ".training" / f"{name}-seed-{seed}"


def train_model(
    name: str, config: dict, out: Path, work: Path, log=print, seed: int | None = None
) -> dict:
    family = config["models"][name]["family"]
    settings = tiny_settings(config, name, seed)
    recipe = model_recipe(config, name, settings)
    reference = reference_model(config, name, seed, recipe)
    if reference is not None:  # a copy: no torch (its import is 2-3 s of a 3 s job)
        return _copy_reference(name, reference, out, log)
    from setdlm.checkpoints.folders import save_model
    from setdlm.recipes.tiny import (
        build_tiny_model,
        corpus_documents,
        tiny_tokenizer,
        tiny_train_config,
        training_set,
    )
    from setdlm.train import latest_checkpoint, load_weights, train
    from setdlm.train.checkpoint import read_manifest

    if reference_root(config) is not None:  # hours, where minutes were perhaps expected
        log(f"[{name}] no reference model of this recipe in {reference_root(config)}: training it")
    identity = {**recipe, "code_version": code_version(WORKFLOW_DIR.parent)}
    _start_over_unless_same(work, identity, log)
    documents = corpus_documents(settings)
    tokenizer = tiny_tokenizer(work / "tokenizer", documents, settings)
    model = build_tiny_model(family, tokenizer, settings)
    started = time.perf_counter()
    train_set = training_set(settings, tokenizer, documents)
    checkpoints = work / "train" / "checkpoints"
    saved = read_manifest(checkpoints)  # the step a resumed training starts from: the newest
    attempt = {"job": current_job(), "from_step": saved[-1]["step"] if saved else 0}
    curve = train_settings(config, name).get("curve")
    probe = None
    if curve is not None:
        from setdlm.recipes.learning_curve import DEFAULT_PROBLEMS, ArithmeticProbe

        problems = curve.get("problems", DEFAULT_PROBLEMS)
        probe = ArithmeticProbe.for_model(
            model,
            tokenizer,
            curve["every"],
            problems,
            settings.generator,
            curve.get("max_new_tokens"),
        )
    try:
        result = train(model, train_set, tiny_train_config(settings), work / "train", probe=probe)
    except Preempted as stop:
        _record_attempt(work, attempt | {"to_step": stop.step, "stopped_by": stop.signal_name})
        raise
    attempts = _record_attempt(work, attempt | {"to_step": result.final_step, "stopped_by": None})
    load_weights(model, latest_checkpoint(work / "train" / "checkpoints"), use_ema=True)
    save_model(model, out)
    tokenizer.save_pretrained(out)  # a model folder is self-contained
    _copy_curves(work / "train", out, with_curve=curve is not None)
    losses = [json.loads(line) for line in result.losses_path.read_text().splitlines()]
    marker = {
        "model": name,
        "source": "trained",
        **identity,
        "seed": settings.seed,
        "curve": curve,
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


def _copy_curves(train_dir: Path, out: Path, with_curve: bool) -> None:
    """The training's loss log, and its learning curve, into the model folder (small files:
    a line per 10 steps, a line per probe)."""
    from setdlm.recipes.learning_curve import CURVE_FILE, LOSSES_FILE
    from setdlm.train.trainer import LOSSES_NAME, PROBES_NAME

    shutil.copyfile(train_dir / LOSSES_NAME, out / LOSSES_FILE)
    if with_curve:
        shutil.copyfile(train_dir / PROBES_NAME, out / CURVE_FILE)


def _copy_reference(name: str, reference: Path, out: Path, log) -> dict:
    """The reference model's files into ``out``, checked against the hashes its marker lists,
    and a marker saying where they came from (the training record kept as it was)."""
    from setdlm.util.errors import DataError
    from setdlm.util.files import atomic_write_bytes

    recorded = read_marker(reference / TRAINED_MARKER)
    # The reference is checked before anything is copied: a corrupt copy in OUT would look
    # like a model to the next run.
    for file, sha256 in recorded["files"].items():
        source = reference / file
        found = sha256_file(source) if source.is_file() else "missing"
        if found != sha256:
            raise DataError(
                f"{source}: sha256 {found[:16]}..., but {reference / TRAINED_MARKER} records "
                f"{sha256[:16]}... (the committed model is damaged or was edited: restore it, "
                "e.g. `git checkout -- " + str(reference) + "`); nothing was copied"
            )
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(reference.iterdir()):
        if path.is_file() and path.name != TRAINED_MARKER:
            atomic_write_bytes(out / path.name, path.read_bytes())
    marker = {
        **recorded,
        "source": "reference",
        "reference": str(reference),
        "trained": {k: recorded.get(k) for k in ("source", "code_version", "job", "attempts")},
        "files": _file_hashes(out),
        "job": current_job(),
    }
    atomic_write_json(out / TRAINED_MARKER, marker)
    log(f"[{name}] the reference model {reference} (its recipe is this one) -> {out}")
    return marker


def _record_attempt(work: Path, attempt: dict) -> list[dict]:
    """Append ``attempt`` to ``work/attempts.json``; return every attempt so far."""
    path = work / "attempts.json"
    attempts = json.loads(path.read_text()) if path.exists() else []
    attempts.append(attempt)
    atomic_write_json(path, attempts)
    return attempts


def _start_over_unless_same(work: Path, identity: dict, log) -> None:
    """Keep a killed training's checkpoints only if they belong to the same settings. Starting
    over removes the work folder, so a folder that holds anything but a training's own work
    (its settings.json stamp says so) is refused, never removed."""
    identity = json.loads(json.dumps(identity))  # as read back: tuples become lists
    stamp = work / WORK_STAMP
    recorded = _training_stamp(work)
    if recorded is None and work.exists() and (not work.is_dir() or any(work.iterdir())):
        raise SettingError(
            f"--work {work}: exists and is not a training's work folder (no {WORK_STAMP} "
            "written by `setdlm train`), so nothing in it is used or removed; expected a new "
            "or empty folder, or the one an earlier training of this model left"
        )
    if recorded is not None and recorded != identity:
        log(f"{work}: other settings, data or code than the last training; starting over")
        shutil.rmtree(work)
    if not stamp.exists():
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_json(stamp, identity)
    remove_leftover_temporaries(work)  # what a killed job's writes left; the job is its writer


WORK_STAMP = "settings.json"
# What a work folder's stamp holds (train_model's identity): the mark of a training's folder.
STAMP_KEYS = ("model", "family", "settings", "data", "code_version")


def _training_stamp(work: Path) -> dict | None:
    """The identity a training recorded in ``work``, or None: no stamp, or a file of that
    name that is not a training's (another program's settings.json)."""
    try:
        stamp = json.loads((work / WORK_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or not all(key in stamp for key in STAMP_KEYS):
        return None
    return stamp


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


REFERENCE_FILES = ("losses.jsonl", "learning_curve.jsonl")


def export_references(models: Path, out: Path, names: list[str] | None = None, log=print) -> int:
    """Copy the trained model folders of a run (``<run>/models/<name>[/seed-<k>]``) into a
    reference folder (``make reference-models``), each as `setdlm train` left it; a folder
    already there is replaced only once its copy is complete. Returns how many were copied."""
    copied = 0
    markers = sorted(models.glob(f"*/{TRAINED_MARKER}")) + sorted(
        models.glob(f"*/seed-*/{TRAINED_MARKER}")
    )
    exported = []
    for marker in markers:
        folder = marker.parent
        seeded = folder.name.startswith("seed-")
        name = folder.parent.name if seeded else folder.name
        if names is not None and name not in names:
            continue
        recorded = read_marker(marker)
        if recorded.get("source") != "trained":
            continue  # a copy of a reference model, or a published checkpoint's marker
        exported.append((folder, name, seeded, recorded))
    refuse_mixed_references(out, exported)  # before anything is copied
    for folder, name, seeded, _ in exported:
        target = out / name / (folder.name if seeded else "")
        staging = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(folder, staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        copied += 1
        log(f"{folder} -> {target}")
    return copied


def recipe_of(marker: dict) -> dict:
    """What a trained model is a function of, but its seed: one reference folder holds the
    seeds of one recipe."""
    settings = {k: v for k, v in (marker.get("settings") or {}).items() if k != "seed"}
    return {"family": marker.get("family"), "settings": settings, "data": marker.get("data")}


def refuse_mixed_references(out: Path, exported) -> None:
    """A model folder at ``out`` would hold seeds of two recipes after the export (2 seeds of
    a 60-step run over seeds 0-1 of the 24,000-step reference, seeds 2-4 left as they were):
    refused, naming the setting that differs, before anything is copied."""
    from setdlm.util.errors import UserError

    by_model: dict[str, list] = {}
    for folder, name, seeded, recorded in exported:
        by_model.setdefault(name, []).append((folder.name if seeded else None, recorded))
    for name, seeds in by_model.items():
        recipes = {json.dumps(recipe_of(r), sort_keys=True) for _, r in seeds}
        if len(recipes) > 1:
            raise UserError(f"export-references: the run's {name} seeds differ in their recipe")
        new = recipe_of(seeds[0][1])
        replaced = {seed for seed, _ in seeds}
        for marker in sorted((out / name).glob(f"seed-*/{TRAINED_MARKER}")):
            if marker.parent.name in replaced:
                continue
            kept = recipe_of(read_marker(marker))
            if kept != new:
                key, old, now = _first_difference(kept, new)
                raise UserError(
                    f"--out {out}: {marker.parent} (kept) was trained with {key} = {old}, the "
                    f"exported {name} with {now}: the reference folder would mix two recipes; "
                    f"export every seed of the new recipe, or move {out / name} away first "
                    "(nothing was copied)"
                )


def _first_difference(old: dict, new: dict, prefix: str = "") -> tuple[str, object, object]:
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                return _first_difference(a, b, f"{prefix}{key}.")
            return f"{prefix}{key}", a, b
    return prefix.rstrip("."), old, new


def export_main(argv: list[str]) -> int:
    parser = ArgumentParser(
        prog="setdlm export-references",
        description="copy a run's trained models into the committed reference folder",
    )
    parser.add_argument("models", type=Path, help="a run's models folder")
    parser.add_argument("--out", type=output_path, required=True, help="the reference folder")
    parser.add_argument("--names", nargs="+", default=None, help="only these models")
    args = parser.parse_args(argv)
    if not args.models.is_dir():
        parser.error(f"{args.models}: not a folder")
    copied = export_references(args.models, args.out, args.names)
    if not copied:
        parser.error(
            f"{args.models}: no model trained here (a checkpoint.json of source 'trained')"
        )
    print(f"{copied} model folder(s) in {args.out}")
    return 0
