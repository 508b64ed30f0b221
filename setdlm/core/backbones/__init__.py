"""Backbones: a DiT and a Qwen3 (through transformers), behind one contract (see base.py)."""

from __future__ import annotations

import dataclasses

BACKBONE_KINDS = ("dit", "qwen3")


def backbone_config(kind: str, settings: dict):
    """The typed config of a backbone kind; unknown settings are an error."""
    if kind == "dit":
        from setdlm.core.backbones.dit import DiTConfig as config_class
    elif kind == "qwen3":
        from setdlm.core.backbones.qwen3 import Qwen3BackboneConfig as config_class
    else:
        raise ValueError(f"backbone kind must be one of {BACKBONE_KINDS}, got {kind!r}")
    known = {field.name for field in dataclasses.fields(config_class)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown {kind} backbone settings {unknown}; known: {sorted(known)}")
    return config_class(**settings)


def build_backbone(kind: str, settings: dict):
    config = backbone_config(kind, settings)
    if kind == "dit":
        from setdlm.core.backbones.dit import DiT

        return DiT(config)
    from setdlm.core.backbones.qwen3 import Qwen3Backbone

    return Qwen3Backbone(config)
