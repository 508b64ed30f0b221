"""Family name -> class, as lazy "module:Class" strings so that ``setdlm`` never imports
``baselines`` at import time (the two packages form no cycle)."""

from __future__ import annotations

import importlib

from setdlm.core.family import Family, ModelConfig

FAMILY_CLASSES = {
    "ar": "baselines.ar:AR",
    "mdlm": "baselines.mdlm:MDLM",
    "bd3lm": "baselines.bd3lm:BD3LM",
    "setdlm": "setdlm.model:SetDLM",
}


def family_class(name: str) -> type[Family]:
    if name not in FAMILY_CLASSES:
        raise ValueError(f"unknown family {name!r}; known: {sorted(FAMILY_CLASSES)}")
    module, cls = FAMILY_CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_model(config: ModelConfig) -> Family:
    return family_class(config.family)(config)
