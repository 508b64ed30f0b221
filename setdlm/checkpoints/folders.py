"""Checkpoints in the official layout (config.json + model.safetensors) and our own.

Nothing shipped with a checkpoint is ever imported or executed: the official ``config.json``
is mapped onto our typed ``ModelConfig`` and the tensor names onto our modules (they match by
construction: every family holds ``self.backbone`` named as in the official code).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from setdlm.core.family import Family, ModelConfig
from setdlm.core.schedules import LinearSchedule, StaggeredSchedule
from setdlm.families import FAMILIES, build_model
from setdlm.families import family as family_info
from setdlm.util.errors import UserError
from setdlm.util.files import (
    atomic_write_json,
    fsync_dir,
    leftover_temporaries,
    sha256_file,
    temporary_beside,
)

MODEL_FORMAT = "setdlm-model/1"
# The official config.json names the family by its class, which is the family's title.
OFFICIAL_ARCHITECTURES = {info.title: name for name, info in FAMILIES.items()}
# Buffers the official code rebuilds at load time instead of saving (or saves needlessly).
DERIVED_TENSORS = ("static_attention_mask",)


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be loaded; the message lists every problem found."""


def config_from_official(config: dict, folder: Path) -> ModelConfig:
    """Map an official denoiser ``config.json`` onto our ModelConfig."""
    source = str(Path(folder) / "config.json")
    architectures = config.get("architectures") or []
    family = next(
        (OFFICIAL_ARCHITECTURES[a] for a in architectures if a in OFFICIAL_ARCHITECTURES), None
    )
    if family is None:
        raise CheckpointError(f"{source}: architectures {architectures} name no known family")
    backbone = config["backbone_config"]
    target = backbone.get("_target_", "")
    if target.endswith(("DIT", "DITLegacy")):
        from setdlm.core.backbones.dit import DiTConfig

        kind, typed = "dit", DiTConfig.from_official(backbone)
    elif target.endswith("AutoModelFromPreTrained"):
        from setdlm.core.backbones.qwen3 import Qwen3BackboneConfig

        typed = Qwen3BackboneConfig.from_official(backbone, folder)
        # The checkpoint holds every weight: build the architecture only, never download the
        # pretrained base model the official run started from.
        kind, typed = "qwen3", dataclasses.replace(typed, reinit=True)
    else:
        raise CheckpointError(f"{source}: unsupported backbone _target_ {target!r}")
    tokens = config.get("tokenization_config") or {}
    info = family_info(family)
    return ModelConfig(
        family=family,
        length=int(config["length"]),
        vocab_size=int(tokens.get("vocab_size", config.get("vocab_size"))),
        mask_token_id=int(config["mask_token_id"]),
        pad_token_id=int(config["pad_token_id"]),
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=config.get("eos_token_id"),
        backbone_kind=kind,
        backbone=dataclasses.asdict(typed),
        block_size=int(config["block_size"]) if "block_size" in info.settings else None,
        schedule=_schedule_from_official(config.get("noise_config"), source)
        or _default_linear(info.schedule),
        keep_clean_bos=bool(config.get("keep_clean_bos") or False),
        train_on_context=bool(config.get("train_on_context") or False),
    )


def _default_linear(kind: str | None) -> LinearSchedule | None:
    """The schedule of an MDLM/BD3LM config saved without one: the official loader attaches
    a LinearNoise to the legacy (mdlm/bd3lms) checkpoints instead of saving it (one block over
    the model length for MDLM, which is the plain schedule)."""
    return LinearSchedule() if kind == "linear" else None


def _schedule_from_official(noise: dict | None, source: str):
    if noise is None:
        return None
    target = noise.get("_target_", "")
    if target.endswith("LinearNoise"):
        return LinearSchedule(block_size=noise.get("block_size"), length=noise.get("length"))
    if target.endswith("StaggeredNoise"):
        return StaggeredSchedule.from_sizes(
            N=int(noise["block_size"]),
            d=int(noise["desired_block_size"]),
            M=noise.get("max_block_size"),
            k=noise.get("k"),
            b=noise.get("b"),
        )
    raise CheckpointError(f"{source}: unsupported noise_config _target_ {target!r}")


def load_official(folder: str | Path, **overrides) -> Family:
    """Build the family described by ``folder/config.json`` and load its weights."""

    folder = Path(folder)
    try:
        config = config_from_official(json.loads((folder / "config.json").read_text()), folder)
    except (KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(
            f"{folder / 'config.json'}: neither our model config (format {MODEL_FORMAT}) nor an "
            f"official one ({type(error).__name__}: {error})"
        ) from None
    if overrides:
        config = dataclasses.replace(config, **overrides)
    model = build_model(config)
    load_state(model, read_weights(folder), str(folder))
    model.weights_sha256 = weights_sha256(folder)  # nothing recorded to check it against
    return model.eval()


def weights_file(folder: Path) -> Path:
    """The folder's weights file: model.safetensors, else pytorch_model.bin."""
    folder = Path(folder)
    path = folder / "model.safetensors"
    return path if path.exists() else folder / "pytorch_model.bin"


_HASHED: dict[tuple, str] = {}


def weights_sha256(folder: Path) -> str:
    """sha256 of the folder's weights file, streamed once per process (for the same file: path,
    inode, size, modification and change times); a result's identity holds it, so new weights
    give a new result, never a reused one."""
    path = weights_file(folder)
    if not path.exists():
        raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    return _HASHED[key]


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, from safetensors or a pickle that may hold tensors only."""
    folder = Path(folder)
    path = folder / "model.safetensors"
    if path.exists():
        try:
            return load_file(path)
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from error
    path = folder / "pytorch_model.bin"
    if path.exists():
        try:
            # weights_only: the unpickler builds tensors and plain containers, nothing else, so
            # a pickle that names a function or class is refused before anything runs.
            return torch.load(path, weights_only=True, map_location="cpu")
        except Exception as error:
            raise CheckpointError(
                f"{path}: refused or unreadable pickle (only tensors are allowed; {error})"
            ) from error
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin")


def weights_metadata(folder: Path) -> dict:
    """What ``save_model`` recorded in ``model.safetensors`` (format, family); {} when there
    is nothing or the file is missing (reading the weights reports a broken file)."""
    from safetensors import safe_open

    path = folder / "model.safetensors"
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except Exception:  # safetensors raises its own error types; read_weights names them
        return {}
    # "setdlm-model/1;family=ar": the format, then key=value fields
    fields = metadata.get("format", "").split(";")
    return {"format": fields[0]} | dict(f.split("=", 1) for f in fields[1:] if "=" in f)


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load every tensor or fail with one error listing all mismatches (no partial model)."""
    state = {k: v for k, v in state.items() if k not in DERIVED_TENSORS}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = sorted(
        f"{name}: checkpoint {tuple(state[name].shape)} vs model {tuple(expected[name].shape)}"
        for name in set(state) & set(expected)
        if state[name].shape != expected[name].shape
    )
    problems = []
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    if misshaped:
        problems.append(f"wrong shapes {misshaped}")
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
    model.load_state_dict(state, strict=True)


# ------------------------------------------------------------------------------ our own models
def save_model(model: Family, folder: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` atomically (a folder renamed into place).

    Tied tensors (Qwen3's embedding and output layer) are stored under every name, as in the
    official checkpoints, so the folder loads the same way whoever wrote it.
    """
    folder = Path(folder)
    # What a save killed midway leaves beside the folder (weights included): gone now. One
    # saver per folder at a time is the caller's rule (the workflow's one job per model).
    for stale in [
        *leftover_temporaries(folder),
        *folder.parent.glob(f".{folder.name}.old-*"),
    ]:
        shutil.rmtree(stale, ignore_errors=True)
    staging = temporary_beside(folder)
    staging.mkdir(parents=True)
    state = {
        name: tensor.detach().cpu().clone().contiguous()
        for name, tensor in model.state_dict().items()
    }
    # The family travels with the weights too: a config.json edited or swapped to another
    # family is refused on load instead of decoding one family's weights as another's. One
    # metadata key only: safetensors writes several in a random order (a Rust HashMap), and
    # the same weights must make the same bytes.
    metadata = {"format": f"{MODEL_FORMAT};family={model.config.family}"}
    save_file(state, staging / "model.safetensors", metadata=metadata)
    weights_sha256 = sha256_file(staging / "model.safetensors")
    atomic_write_json(
        staging / "config.json",
        {"format": MODEL_FORMAT, "model": model.config.to_dict(), "weights_sha256": weights_sha256},
    )
    fsync_dir(staging)
    previous = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        folder.rename(previous)
    staging.rename(folder)
    fsync_dir(folder.parent)
    shutil.rmtree(previous, ignore_errors=True)
    return folder


def load_model(folder: str | Path) -> Family:
    """A model saved by ``save_model`` or an official checkpoint folder, in eval mode."""

    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"{folder}: no config.json (expected a model folder)")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{config_path}: not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
    if config.get("format") != MODEL_FORMAT:
        return load_official(folder)
    try:
        model_config = ModelConfig.from_dict(config["model"], source=str(config_path))
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{config_path}: not a valid model config ({error})") from None
    weights_family = weights_metadata(folder).get("family")  # None: saved before it was recorded
    if weights_family not in (None, model_config.family):
        raise CheckpointError(
            f"{config_path}: family {model_config.family!r}, but {folder / 'model.safetensors'} "
            f"holds the weights of a {weights_family} model"
        )
    recorded = config.get("weights_sha256")  # None: saved before hashes were recorded
    actual = weights_sha256(folder)
    if recorded is not None and actual != recorded:
        raise CheckpointError(
            f"{weights_file(folder)}: sha256 {actual[:16]}... does not match the "
            f"{recorded[:16]}... recorded in {config_path} (a corrupted, truncated or replaced "
            "weights file); retrain or restore the folder"
        )
    model = build_model(model_config)
    load_state(model, read_weights(folder), str(folder))
    model.weights_sha256 = actual
    return model.eval()
