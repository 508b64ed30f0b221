"""Tiny, randomly initialized models of every family and backbone, for CPU tests.

Weights are redrawn with a fixed seed (see ``setdlm.core.random_weights``).
"""

from __future__ import annotations

import torch

from setdlm.core.decoding import DecodeConfig
from setdlm.core.family import ModelConfig, default_schedule
from setdlm.core.random_weights import redraw_weights
from setdlm.families import FAMILIES as FAMILY_INFOS
from setdlm.families import FAMILY_NAMES as FAMILIES
from setdlm.families import build_model, with_knobs
from setdlm.families import family as family_info

VOCAB, MASK, PAD, BOS, EOS = 64, 63, 0, 1, 2
__all__ = ["BACKBONES", "FAMILIES", "decode_config", "prompts", "tiny_config", "tiny_model"]

BACKBONES = ("dit", "qwen3")


def backbone_settings(kind: str, family: str, length: int) -> dict:
    if kind == "dit":
        return {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "n_heads": 2,
            "num_layers": 2,
            "cond_dim": 16,
            "dropout": 0.0,
            "adaln": family_info(family).dit["adaln"],
            "length": length,
            "causal_attention": family_info(family).dit["causal_attention"],
        }
    return {
        "architecture": {
            "model_type": "qwen3",
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 2 * length,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": BOS,
            "eos_token_id": EOS,
            "pad_token_id": PAD,
        },
        "use_causal_mask": family_info(family).dit["causal_attention"],
    }


def tiny_config(family: str, backbone: str = "dit", length: int = 32, **changes) -> ModelConfig:
    values = dict(
        family=family,
        length=length,
        vocab_size=VOCAB,
        mask_token_id=MASK,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        backbone_kind=backbone,
        backbone=backbone_settings(backbone, family, length),
        block_size=4 if "block_size" in family_info(family).settings else None,
        schedule=default_schedule(family, length, block_size=4),
    )
    values.update(changes)
    return ModelConfig(**values)


def tiny_model(family: str, backbone: str = "dit", seed: int = 0, **changes):
    torch.manual_seed(seed)
    return redraw_weights(build_model(tiny_config(family, backbone, **changes)), seed).eval()


def decode_config(family: str, **values) -> DecodeConfig:
    """``DecodeConfig(**values)`` where the knobs of the family's decoding policy (window,
    block_size, ...) may be given among the values too (a None knob: the policy's default)."""
    knobs = {name: values.pop(name) for name in list(values) if name in KNOBS}
    policy = values.pop("policy", None)
    return with_knobs(DecodeConfig(**values), family, policy, **knobs)


KNOBS = {knob for info in FAMILY_INFOS.values() for knob in info.knobs}


def prompts(count: int, seed: int = 0, lengths=(3, 6, 5, 8)) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        body = torch.randint(3, MASK, (lengths[i % len(lengths)] - 1,), generator=generator)
        rows.append([BOS, *body.tolist()])
    return rows
