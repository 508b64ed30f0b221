"""Every decoding knob, in one frozen record that identifies a speed-quality point."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode; fields that do not apply to a family are ignored by it.

    confidence_threshold is τ: each step commits the ``k`` most confident predictions (k = 1
    unless ``num_steps`` asks for fewer steps than tokens) plus every prediction whose
    probability is at least τ. τ = 1e6 disables the threshold (one token per step).
    """

    max_new_tokens: int = 128
    confidence_threshold: float = 1e6
    # Steps per block (MDLM, BD3LM) or per generation (SetDLM); None = one token per step.
    num_steps: int | None = None
    # MDLM / BD3LM decoding block; None = the family default (BD3LM: its trained block size).
    block_size: int | None = None
    # SetDLM sliding-window width W; None = the schedule's d (the paper's setting).
    window: int | None = None
    # SetDLM infilling: cache both contexts before decoding ("full", the paper's setting, the
    # official cache_full_infill_context=true), or the left one only ("prefix", the official
    # default): visible tokens between masked spans then enter the cache once decoding has
    # passed them (the official l2r promotion), and the right context after the last span is
    # never seen.
    infill_cache: Literal["full", "prefix"] = "full"
    # SetDLM: tokens committed in one step enter the cache in a sampled first-hitting order.
    fht_cache_order: bool = False
    # BD3LM: cache a finished block inside the next block's first forward (saves one NFE).
    fused_block_cache: bool = True
    do_sample: bool = False
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    # Tokens the repetition penalty looks at: the generated ones, or everything visible
    # (prompt or infilling context too).
    repetition_context: Literal["generated", "visible"] = "generated"
    # Exponential decay length penalty on EOS: (start, factor), counted in generated tokens.
    length_penalty: tuple[int, float] | None = None
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    stop_regexes: tuple[str, ...] = ()
    # Stop after this many identical trailing tokens (0 disables).
    stop_repeated_tokens: int = 0
    # When stops are looked for. "exact": after every forward, and the row ends at its stop.
    # "official": when the official sampler runs its stopping criteria (MDLM/BD3LM after each
    # block, SetDLM after every W-th step), and the row keeps what the official keeps (its
    # canvas up to the block or window end, tokens past the stop included, counted as
    # generated): NFE and token counts comparable with the official speed numbers.
    stop_cadence: Literal["exact", "official"] = "exact"
    # Reproduce the official implementation's decoding quirks (see docs): MDLM/BD3LM decode
    # ceil(max_new_tokens / block) aligned blocks, so the number of new tokens can differ.
    official_compat: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("num_steps", "block_size", "window"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.infill_cache not in ("full", "prefix"):
            raise ValueError(f"infill_cache must be 'full' or 'prefix', got {self.infill_cache!r}")
        if self.stop_cadence not in ("exact", "official"):
            raise ValueError(
                f"stop_cadence must be 'exact' or 'official', got {self.stop_cadence!r}"
            )
        if self.length_penalty is not None and not self.eos_token_ids:
            raise ValueError("length_penalty needs eos_token_ids (the token it favours)")

    def replace(self, **changes) -> DecodeConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> DecodeConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown decoding settings {unknown}; known: {sorted(known)}")
        values = dict(values)
        for name in ("eos_token_ids", "stop_strings", "stop_regexes"):
            if name in values:
                values[name] = tuple(values[name])
        if values.get("length_penalty") is not None:
            start, factor = values["length_penalty"]
            values["length_penalty"] = (int(start), float(factor))
        return cls(**values)
