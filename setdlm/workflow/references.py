"""The committed reference models a configuration reuses (``reference_models``), found, read
and checked, and what the plan will train instead of copying.

The default copies 20 reference models (results/reference/models) instead of training them for
hours each. A missing, misspelled or file-valued ``reference_models`` used to turn that into 20
trainings without a word: the dry run showed the same jobs. So:

- ``reference_errors`` (run with the configuration's other checks) refuses a ``reference_models``
  that is not a folder, or a folder that holds none of the models the configuration trains. A
  relative path is looked for in the working directory, then in the checkout holding the
  workflow, where the committed folder lives: running Snakemake from another folder (``-d``)
  finds the same models;
- ``read_marker`` reads a reference model's ``checkpoint.json`` (and every marker of a trained
  model) by one rule: a JSON object whose ``files`` maps each file to its sha256;
- ``model_recipe`` is what a trained model is a function of, and ``reference_model`` the
  reference copy trained with exactly that recipe; ``copied_seeds`` says when every seed of a
  model is there, so that one job copies them all (setdlm/workflow/plan.py);
- ``forecast`` says, before any job starts, how many models the plan trains rather than copies
  and about how long that takes, and why the reference copies do not serve.

Read when the DAG is built and by ``setdlm train``, so nothing here imports torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from setdlm.recipes.tiny_settings import TinySettings, corpus_identity
from setdlm.results.layout import TRAINED_MARKER
from setdlm.util.errors import DataError

MARKER = TRAINED_MARKER
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Seconds of one CPU core per unit of training cost (steps x batch x length x the family's
# positions per token): the default's 24,000-step AR model (64 wide, 2 layers) takes about 35
# minutes on the development machines (tiny.yaml's resources note).
SECONDS_PER_COST = 35 * 60 / (24_000 * 32 * 64)
CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding setdlm/ and workflows/


def reference_root(config: dict, cwd: Path | None = None) -> Path | None:
    """The folder ``reference_models`` names (None: null), resolved as the module says; the
    first candidate when it exists nowhere (``reference_errors`` reports that)."""
    value = config.get("reference_models")
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_absolute() or not str(value).strip():
        return path
    candidates = [(cwd or Path.cwd()) / path, CHECKOUT / path]
    return next((c for c in candidates if c.exists()), candidates[0])


def reference_errors(config: dict, trained: list[str]) -> list[str]:
    """What is wrong with ``reference_models`` for a configuration that trains ``trained``."""
    value = config.get("reference_models")
    if value is None:
        return []
    null = "or null to train every model here (hours each)"
    if not str(value).strip():
        return [f"reference_models: {value!r} names no folder; expected a folder of models, {null}"]
    root = reference_root(config)
    if not root.exists():
        where = str(root) if Path(value).is_absolute() else f"{Path.cwd()} or {CHECKOUT}"
        return [
            f"reference_models: {value!r} does not exist (looked in {where}); expected the "
            f"folder of committed reference models (results/reference/models), {null}"
        ]
    if not root.is_dir():
        return [f"reference_models: {root} is a file; expected a folder of models, {null}"]
    if trained and not any((root / name).is_dir() for name in trained):
        return [
            f"reference_models: {root} holds none of the models this configuration trains "
            f"({', '.join(trained)}); expected <folder>/<model>/[seed-<k>/]{MARKER}, {null}"
        ]
    return []


def read_marker(path: Path) -> dict:
    """A trained model's ``checkpoint.json``: a JSON object whose ``files`` maps every file of
    the folder to its sha256; else a DataError naming the file and the key."""
    try:
        marker = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise DataError(f"{path}: cannot read it ({error.strerror or error})") from None
    except ValueError as error:
        raise DataError(
            f"{path}: not valid JSON ({error}); expected the record `setdlm train` writes"
        ) from None
    if not isinstance(marker, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(marker).__name__}")
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        raise DataError(f"{path}: files is {files!r}; expected an object of file: sha256")
    for name, digest in files.items():
        if "/" in name or name in ("", ".", "..") or not isinstance(digest, str):
            raise DataError(f"{path}: files.{name}: {digest!r}; expected a file name: sha256")
        if not SHA256.match(digest):
            raise DataError(
                f"{path}: files.{name} is {digest!r}; expected a sha256 (64 hex digits)"
            )
    return marker


# ------------------------------------------------------------------------------ recipes
def tiny_settings(config: dict, name: str, seed: int | None = None) -> TinySettings:
    """The model's TinySettings: the configuration's train settings, S or d as block size,
    and ``seed`` (one of train.seeds) as the training seed."""
    from setdlm.workflow.config import NOT_A_TRAINING_SETTING, train_settings  # imports this

    entry = config["models"][name]
    block_size = entry.get("block_size") or entry.get("d") or TinySettings.block_size
    settings = {
        key: value
        for key, value in train_settings(config, name).items()
        if key not in NOT_A_TRAINING_SETTING
    }
    if seed is not None:
        settings["seed"] = seed
    return TinySettings(**settings, block_size=block_size)


def model_recipe(config: dict, name: str, settings: TinySettings) -> dict:
    """What a trained model is a function of (with the code): model, family, settings
    (``tiny_settings``, the seed among them) and training data. A reference copy is reused only
    for the same recipe."""
    return {
        "model": name,
        "family": config["models"][name]["family"],
        "settings": asdict(settings),
        "data": corpus_identity(settings),
    }


def reference_model(config: dict, name: str, seed: int | None, recipe: dict) -> Path | None:
    """The committed reference copy of this model (``reference_models``/<name>[/seed-<k>]),
    when the configuration names a reference folder and the copy there was trained with
    exactly this recipe (model, family, settings, data); else None: train it here."""
    root = reference_root(config)
    if root is None:
        return None
    folder = root / name / (f"seed-{seed}" if seed is not None else "")
    marker = folder / TRAINED_MARKER
    if not marker.is_file():
        return None
    recorded = read_marker(marker)  # a malformed one is refused, naming it
    same = json.loads(json.dumps(recipe))  # as read back: tuples become lists
    if {key: recorded.get(key) for key in same} != same:
        return None
    return folder


def copied_seeds(config: dict, name: str) -> list[int] | None:
    """The seeds of a model trained once per seed when the reference folder holds every one of
    them with its recipe (one job copies them all), else None (each seed is its own job, which
    trains it, or copies what the reference folder holds)."""
    from setdlm.workflow.config import model_seeds  # which imports this module

    seeds = model_seeds(config, name)
    if not seeds or reference_root(config) is None:
        return None
    for seed in seeds:
        if _reference_of(config, name, seed) is None:
            return None
    return list(seeds)


def _reference_of(config: dict, name: str, seed: int | None) -> Path | None:
    """The reference copy of a model (seed) with this configuration's whole recipe, or None
    (a malformed marker counts as none here: ``setdlm train`` refuses it, naming it)."""
    try:
        recipe = model_recipe(config, name, tiny_settings(config, name, seed))
        return reference_model(config, name, seed, recipe)
    except DataError:
        return None


# ------------------------------------------------------------------------------- forecast
def forecast(plan, cwd: Path | None = None) -> str | None:
    """ "N models will be trained (about H hours)" for a plan that trains models rather than
    copying them, with the reason; None when it trains none. A model is copied when its
    reference copy has the whole recipe (``reference_model``, as ``setdlm train`` decides)."""
    from setdlm.families import family as family_info
    from setdlm.workflow.config import NOT_A_TRAINING_SETTING, resolved_train_settings

    config = plan.config
    root = reference_root(config, cwd)
    seeded = {name for name, _ in plan.trained_seeds}
    jobs = [(name, seed) for name, seed in plan.trained_seeds]
    jobs += [(name, None) for name in plan.trained if name not in seeded]
    trained, reasons, seconds = [], {}, 0.0
    for name, seed in jobs:
        if root is not None and _reference_of(config, name, seed) is not None:
            continue  # copied
        entry = config["models"][name]
        settings = resolved_train_settings(config, name)
        wanted = {k: v for k, v in settings.items() if k not in NOT_A_TRAINING_SETTING}
        if seed is not None:
            wanted["seed"] = seed
        block = entry.get("block_size") or entry.get("d")
        if block is not None:
            wanted["block_size"] = block
        reason = _why_not_copied(root, name, seed, entry["family"], wanted) or (
            "the reference copy's recorded recipe (its data or a setting the configuration "
            "leaves at its default) is another"
        )
        trained.append(name if seed is None else f"{name}/seed-{seed}")
        reasons.setdefault(reason, name)
        cost = settings["steps"] * settings["batch_size"] * settings["length"]
        seconds += cost * family_info(entry["family"]).training_cost * SECONDS_PER_COST
    if not trained:
        return None
    hours = seconds / 3600
    took = f"about {hours:.1f} hours" if hours >= 1 else f"about {seconds / 60:.0f} minutes"
    why = "; ".join(f"{reason} ({name})" for reason, name in list(reasons.items())[:3])
    return (
        f"setdlm workflow: {len(trained)} model(s) will be trained here, not copied from "
        f"reference models ({took} of one CPU core in all): {why}"
    )


def _why_not_copied(root, name, seed, family, wanted: dict) -> str | None:
    if root is None:
        return "reference_models is null"
    folder = root / name / (f"seed-{seed}" if seed is not None else "")
    marker = folder / MARKER
    if not marker.is_file():
        return f"{folder} has no {MARKER}"
    try:
        recorded = read_marker(marker)
    except DataError as error:
        return str(error)
    if recorded.get("family") != family:
        return f"{marker} is a {recorded.get('family')} model"
    settings = recorded.get("settings") or {}
    for key, value in wanted.items():
        if key in settings and settings[key] != json.loads(json.dumps(value)):
            return f"{marker} was trained with {key} = {settings[key]}, this recipe has {value}"
    return None
