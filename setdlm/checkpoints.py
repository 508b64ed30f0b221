"""Checkpoints in the official layout (config.json + model.safetensors) and our own.

Nothing shipped with a checkpoint is ever imported or executed: the official ``config.json``
is mapped onto our typed ``ModelConfig`` and the tensor names onto our modules (they match by
construction: every family holds ``self.backbone`` named as in the official code).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from setdlm.core.family import Family, ModelConfig
from setdlm.core.schedules import LinearSchedule, StaggeredSchedule

OFFICIAL_ARCHITECTURES = {"AR": "ar", "MDLM": "mdlm", "BD3LM": "bd3lm", "SetDLM": "setdlm"}
# Buffers the official code rebuilds at load time instead of saving (or saves needlessly).
DERIVED_TENSORS = ("static_attention_mask",)


class CheckpointError(ValueError):
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
    if target.endswith("DIT"):
        from setdlm.core.backbones.dit import DiTConfig

        kind, typed = "dit", DiTConfig.from_official(backbone)
    elif target.endswith("AutoModelFromPreTrained"):
        from setdlm.core.backbones.qwen3 import Qwen3BackboneConfig

        kind, typed = "qwen3", Qwen3BackboneConfig.from_official(backbone, folder)
    else:
        raise CheckpointError(f"{source}: unsupported backbone _target_ {target!r}")
    tokens = config.get("tokenization_config") or {}
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
        block_size=int(config["block_size"]) if family == "bd3lm" else None,
        schedule=_schedule_from_official(config.get("noise_config"), source),
        keep_clean_bos=bool(config.get("keep_clean_bos") or False),
        train_on_context=bool(config.get("train_on_context") or False),
    )


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
    from setdlm.registry import build_model

    folder = Path(folder)
    config = config_from_official(json.loads((folder / "config.json").read_text()), folder)
    if overrides:
        config = dataclasses.replace(config, **overrides)
    model = build_model(config)
    load_state(model, read_weights(folder), str(folder))
    return model.eval()


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").exists():
        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").exists():
        return torch.load(folder / "pytorch_model.bin", weights_only=True, map_location="cpu")
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin")


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
