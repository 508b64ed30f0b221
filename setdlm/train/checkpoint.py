"""Checkpoint folders: written atomically, listed in a manifest, only the last K kept.

Layout under ``<run>/checkpoints/``::

    manifest.json                 {"format", "checkpoints": [{"step", "name", "files"}, ...]}
    step-00001000/
        model.safetensors         raw training weights
        ema.safetensors           fp32 EMA weights (when the EMA is on)
        optimizer.safetensors     optimizer tensors (AdamW moments, step counts)
        rng.safetensors           RNG states of every process
        state.json                step, config, scheduler, data position, the rest

A checkpoint is first written into ``step-XXXXXXXX.tmp`` (each file flushed and fsynced), then
renamed into place, and only then added to the manifest (itself replaced atomically). A crash at
any point leaves either the previous manifest and checkpoints intact or the new one complete;
the manifest, not the folder listing, says which checkpoints exist. No pickles: safetensors and
JSON only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model

from setdlm.train.ema import copy_averaged_weights
from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_json, fsync_dir, sha256_file

FORMAT = "setdlm-train-checkpoint/1"
MANIFEST_NAME = "manifest.json"
STATE_NAME = "state.json"
MODEL_FILE = "model.safetensors"
EMA_FILE = "ema.safetensors"
_FINAL_NAME = re.compile(r"step-\d{8,}")


class TrainingStateError(UserError, RuntimeError):
    """A training checkpoint (the state a training resumes from) or its manifest is missing,
    malformed or does not match its hashes."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def write_checkpoint(
    checkpoints_dir: Path,
    step: int,
    writers: dict[str, Callable[[Path], None]],
    state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write one checkpoint folder and list it in the manifest; return the folder.

    ``writers`` maps a file name to a function that writes that file at the path it is given.
    ``state`` is stored as ``state.json`` (with ``format`` and ``step`` added). Afterwards only
    the newest ``keep_last`` checkpoints remain.
    """
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    staging = checkpoints_dir / f"{name}.tmp"
    final = checkpoints_dir / name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for filename, write in writers.items():
            write(staging / filename)
        (staging / STATE_NAME).write_text(
            json.dumps({**state, "format": FORMAT, "step": step}, indent=1, sort_keys=True) + "\n"
        )
        # safetensors creates owner-only files; give every file the mode umask gave state.json.
        mode = (staging / STATE_NAME).stat().st_mode & 0o777
        files = {}
        for file in sorted(staging.iterdir()):
            file.chmod(mode)
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
            files[file.name] = {"sha256": sha256_file(file), "bytes": file.stat().st_size}
        fsync_dir(staging)
        if final.exists():  # a re-run of the same step: move the old one out of the way first
            shutil.rmtree(checkpoints_dir / f"{name}.old", ignore_errors=True)
            os.replace(final, checkpoints_dir / f"{name}.old")
        os.replace(staging, final)
        fsync_dir(checkpoints_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(checkpoints_dir / f"{name}.old", ignore_errors=True)

    entries = [entry for entry in read_manifest(checkpoints_dir) if entry["step"] != step]
    entries.append({"step": step, "name": name, "files": files})
    entries = sorted(entries, key=lambda entry: entry["step"])[-keep_last:]
    atomic_write_json(checkpoints_dir / MANIFEST_NAME, {"format": FORMAT, "checkpoints": entries})
    _remove_unlisted(checkpoints_dir, {entry["name"] for entry in entries})
    return final


def _remove_unlisted(checkpoints_dir: Path, kept: set[str]) -> None:
    """Delete checkpoint folders the manifest no longer lists, and leftovers of crashed writes."""
    for child in checkpoints_dir.iterdir():
        stale_final = _FINAL_NAME.fullmatch(child.name) and child.name not in kept
        leftover = child.suffix in (".tmp", ".old") and _FINAL_NAME.fullmatch(child.stem)
        if child.is_dir() and (stale_final or leftover):
            shutil.rmtree(child, ignore_errors=True)


def read_manifest(checkpoints_dir: Path) -> list[dict[str, Any]]:
    """The manifest's checkpoint entries, oldest first; empty when there is no manifest."""
    path = checkpoints_dir / MANIFEST_NAME
    if not path.exists():
        return []
    try:
        manifest = json.loads(path.read_text())
        entries = manifest["checkpoints"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise TrainingStateError(f"{path} is not a checkpoint manifest ({error!r})") from error
    if manifest.get("format") != FORMAT:
        raise TrainingStateError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT}")
    return entries


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The newest checkpoint folder the manifest lists, or None when there is none."""
    entries = read_manifest(checkpoints_dir)
    return checkpoints_dir / entries[-1]["name"] if entries else None


def verify_checkpoint(checkpoint: Path) -> None:
    """Check every file of a checkpoint against the sizes and sha256 sums in the manifest."""
    entries = {entry["name"]: entry for entry in read_manifest(checkpoint.parent)}
    if checkpoint.name not in entries:
        raise TrainingStateError(
            f"{checkpoint} is not listed in {checkpoint.parent / MANIFEST_NAME}"
        )
    for filename, expected in entries[checkpoint.name]["files"].items():
        path = checkpoint / filename
        if not path.is_file():
            raise TrainingStateError(f"checkpoint file {path} is missing")
        if path.stat().st_size != expected["bytes"] or sha256_file(path) != expected["sha256"]:
            raise TrainingStateError(f"checkpoint file {path} does not match its manifest hash")


def read_state(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / STATE_NAME
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TrainingStateError(f"cannot read checkpoint state {path} ({error!r})") from error
    if state.get("format") != FORMAT:
        raise TrainingStateError(f"{path} has format {state.get('format')!r}, expected {FORMAT}")
    return state


def read_tensors(checkpoint: Path, filename: str) -> dict[str, torch.Tensor]:
    path = checkpoint / filename
    if not path.is_file():
        raise TrainingStateError(f"checkpoint file {path} is missing")
    return load_file(path)


def load_weights(model: torch.nn.Module, checkpoint: Path, *, use_ema: bool = True) -> str:
    """Load a checkpoint's weights into ``model`` for evaluation or export; return which ones.

    The EMA weights are used when asked for and present; otherwise the raw training weights.
    """
    checkpoint = Path(checkpoint)
    if use_ema and (checkpoint / EMA_FILE).is_file():
        copy_averaged_weights(read_tensors(checkpoint, EMA_FILE), model)
        return "ema"
    if not (checkpoint / MODEL_FILE).is_file():
        raise TrainingStateError(f"checkpoint file {checkpoint / MODEL_FILE} is missing")
    load_model(model, checkpoint / MODEL_FILE, strict=True)
    return "raw"
