"""The OWT AR and MDLM checkpoints of the mdlm/bd3lms codebase (PyTorch Lightning ``.ckpt``),
read without running any of the code their pickle names, and turned into a model folder.

Key mapping (the official loader's ``_load_legacy_denoiser``, SPEC 7.3): the Lightning
``state_dict`` names are ``backbone.<name>`` (``backbone._orig_mod.<name>`` when the model
was compiled), and ``<name>`` is already our DiT's: the legacy ``DITLegacy`` has the modules,
parameter names, shapes and operations of the official DIT, which ours reproduces. So:

- ``_orig_mod.`` is dropped, ``backbone.`` kept (our families hold ``self.backbone``);
- ``sampling_eps_min`` / ``sampling_eps_max`` (bd3lms scalars, not weights) are dropped;
- no tensor is reshaped, split or transposed (``attn_qkv`` keeps the [3C, C] q|k|v layout);
- the official evaluation uses the EMA weights: ``ema.shadow_params`` is a list in the order of
  the backbone's parameters (the RoPE ``inv_freq`` buffer is not in it and keeps its
  ``state_dict`` value), so it replaces our backbone's parameters position by position, each
  shape checked.

The architecture is not stored, only its weights: hidden size, vocabulary, layers and whether
adaLN is present are read from the shapes; the head count is not (the official loader forces
12, the OWT "small" model), nor the model length (1024). MDLM has adaLN (conditioned on
sigma = 0, as the official denoisers call it) and AR does not; the mask token is the last
vocabulary row (GPT-2 + ``<|fim_middle|>``, id 50257) and BOS is kept clean, as the official
loader forces. One difference stays: DITLegacy runs its blocks and output layer under bf16
autocast (on CPU too), so its logits carry bf16 rounding; ours are float32.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
from pathlib import Path

import torch

from setdlm.checkpoints.folders import CheckpointError
from setdlm.checkpoints.zoo import LEGACY_FAMILIES
from setdlm.core.backbones.dit import DiTConfig
from setdlm.core.family import ModelConfig, default_schedule
from setdlm.families import build_model
from setdlm.families import family as family_info

OWT_HEADS, OWT_LENGTH, OWT_COND_DIM = 12, 1024, 128
GPT2_EOS = 50256


class _Refused:
    """What any global outside torch's tensor allowlist unpickles to: an inert object that
    takes whatever arguments the pickle gives and runs nothing (a pickled tokenizer or config
    object in ``hyper_parameters``, or anything malicious)."""

    def __init__(self, *args, **kwargs):
        del args, kwargs

    def __setstate__(self, state):
        del state

    def __call__(self, *args, **kwargs):
        return _Refused()


class _TensorsOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        from torch._weights_only_unpickler import _get_allowed_globals

        allowed = _get_allowed_globals().get(f"{module}.{name}")
        if allowed is not None:
            return allowed
        return type(f"Refused_{module}_{name}".replace(".", "_"), (_Refused,), {})


class _TensorsOnlyPickle:
    """A ``pickle_module`` for ``torch.load`` whose unpickler builds tensors and containers."""

    Unpickler = _TensorsOnlyUnpickler
    load = staticmethod(lambda file, **kwargs: _TensorsOnlyUnpickler(file, **kwargs).load())
    __name__ = "setdlm_tensors_only_pickle"


def read_lightning(path: Path) -> dict:
    """The ``.ckpt`` dict, every non-tensor object replaced by an inert stand-in."""
    try:
        checkpoint = torch.load(
            path, map_location="cpu", weights_only=False, pickle_module=_TensorsOnlyPickle
        )
    except Exception as error:
        raise CheckpointError(f"{path}: not a readable Lightning checkpoint ({error})") from error
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(f"{path}: no state_dict (expected a PyTorch Lightning .ckpt)")
    return checkpoint


def legacy_state(checkpoint: dict, path: Path) -> dict[str, torch.Tensor]:
    """``state_dict`` under our names: ``backbone.<DiT name>`` (see the module docstring)."""
    state = {}
    for key, value in checkpoint["state_dict"].items():
        if key in ("sampling_eps_min", "sampling_eps_max"):
            continue
        name = key.replace("_orig_mod.", "")
        if not name.startswith("backbone.") or not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: unexpected state_dict entry {key!r}")
        state[name] = value
    return state


def legacy_config(state: dict[str, torch.Tensor], family: str, path: Path, **sizes) -> ModelConfig:
    """The model the weights describe (shapes) plus what the official loader forces."""
    if family not in LEGACY_FAMILIES:
        raise CheckpointError(
            f"{path}: legacy checkpoints are {' or '.join(LEGACY_FAMILIES)}, not {family!r}"
        )
    recipe = family_info(family).dit  # the OWT recipe: adaLN for MDLM, causal attention for AR
    try:
        vocab, hidden = state["backbone.vocab_embed.embedding"].shape
    except KeyError:
        raise CheckpointError(f"{path}: no backbone.vocab_embed.embedding (not a DiT)") from None
    layers = len({m[1] for k in state if (m := re.match(r"backbone\.blocks\.(\d+)\.", k))})
    adaln = "backbone.blocks.0.adaLN_modulation.weight" in state
    if adaln != recipe["adaln"]:
        raise CheckpointError(
            f"{path}: a {family} legacy model has adaLN {'on' if recipe['adaln'] else 'off'}, "
            f"but these weights have it {'on' if adaln else 'off'}"
        )
    cond = state.get("backbone.sigma_map.mlp.0.weight")
    length = int(sizes.get("length") or OWT_LENGTH)
    backbone = DiTConfig(
        vocab_size=int(vocab),
        hidden_size=int(hidden),
        n_heads=int(sizes.get("n_heads") or OWT_HEADS),
        num_layers=layers,
        cond_dim=int(cond.shape[0]) if cond is not None else OWT_COND_DIM,
        adaln=adaln,
        length=length,
        causal_attention=recipe["causal_attention"],
    )
    mask = int(vocab) - 1
    eos = int(sizes.get("eos_token_id") or GPT2_EOS)
    return ModelConfig(
        family=family,
        length=length,
        vocab_size=int(vocab),
        mask_token_id=mask,
        pad_token_id=eos,
        bos_token_id=eos,
        eos_token_id=eos,
        backbone_kind="dit",
        backbone=dataclasses.asdict(backbone),
        schedule=default_schedule(family, length, block_size=None),
        keep_clean_bos=True,
    )


def load_lightning(path: str | Path, family: str, use_ema: bool = True, **sizes):
    """A family model (eval mode) from a legacy ``.ckpt``: EMA weights by default."""
    from setdlm.checkpoints.folders import load_state

    path = Path(path)
    checkpoint = read_lightning(path)
    state = legacy_state(checkpoint, path)
    model = build_model(legacy_config(state, family, path, **sizes))
    load_state(model, state, str(path))
    if use_ema:
        _apply_ema(model, checkpoint, path)
    return model.eval()


def _apply_ema(model, checkpoint: dict, path: Path) -> None:
    shadow = (checkpoint.get("ema") or {}).get("shadow_params")
    if not isinstance(shadow, list):
        raise CheckpointError(f"{path}: no ema.shadow_params (pass use_ema=False for raw weights)")
    parameters = list(model.backbone.named_parameters())
    if len(shadow) != len(parameters):
        raise CheckpointError(
            f"{path}: {len(shadow)} EMA tensors for {len(parameters)} backbone parameters"
        )
    with torch.no_grad():
        for (name, parameter), value in zip(parameters, shadow, strict=True):
            if not isinstance(value, torch.Tensor) or value.shape != parameter.shape:
                shape = getattr(value, "shape", type(value).__name__)
                raise CheckpointError(
                    f"{path}: EMA tensor for backbone.{name} is {shape}, expected "
                    f"{tuple(parameter.shape)}"
                )
            parameter.copy_(value)
