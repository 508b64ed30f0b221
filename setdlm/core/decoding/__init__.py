"""One decoding engine for every family; the families supply only their order and cache policy."""

from setdlm.core.decoding.config import DecodeConfig, PolicyOptions
from setdlm.core.decoding.engine import (
    GenerationOutput,
    OrderPolicy,
    RowInputs,
    RowState,
    StopCheck,
    generate,
)
from setdlm.core.decoding.pool import generate_continuous

__all__ = [
    "DecodeConfig",
    "GenerationOutput",
    "OrderPolicy",
    "PolicyOptions",
    "RowInputs",
    "RowState",
    "StopCheck",
    "generate",
    "generate_continuous",
]
