"""Every decoding knob, in one frozen record that identifies a speed-quality point.

``DecodeConfig`` holds what every decoding policy obeys (budget, τ, sampling, logits
processors, stop rules); ``policy`` holds the decoding policy itself with its own knobs (a
``PolicyOptions`` subclass that the policy's class declares as ``Options``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal


@dataclass(frozen=True)
class PolicyOptions:
    """The knobs of one decoding policy (setdlm/families.py names the policies). Each
    ``OrderPolicy`` declares its subclass as ``Options``; only that policy reads it."""

    name: ClassVar[str]
    # Results computed before policies had names recorded every policy's knobs in one flat
    # layout (FLAT_KNOBS). The four policies of that time keep it in their identity, so those
    # results keep their config hashes; a newer policy records {"policy", "options"}.
    flat_identity: ClassVar[bool] = False

    def replace(self, **changes) -> PolicyOptions:
        return dataclasses.replace(self, **changes)


def check_size(name: str, value: int | None) -> None:
    """A size knob (a block, a window) is an integer >= 1, or None: the policy's default."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")


# The flat layout's knobs at their "not set" values (see PolicyOptions.flat_identity).
FLAT_KNOBS = {
    "block_size": None,
    "window": None,
    "infill_cache": "full",
    "fht_cache_order": False,
    "fused_block_cache": True,
}


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode, whatever the policy.

    confidence_threshold is τ: each step commits the ``k`` most confident predictions (k = 1
    unless ``num_steps`` asks for fewer steps than tokens) plus every prediction whose
    probability is at least τ. τ = 1e6 disables the threshold (one token per step).
    """

    max_new_tokens: int = 128
    confidence_threshold: float = 1e6
    # Steps per block (MDLM, BD3LM) or per generation (SetDLM); None = one token per step.
    num_steps: int | None = None
    # The decoding policy and its knobs; None: the family's default policy, default knobs.
    policy: PolicyOptions | None = None
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
        check_size("num_steps", self.num_steps)
        if self.policy is not None and not isinstance(self.policy, PolicyOptions):
            raise TypeError(f"policy must be a policy's Options, got {type(self.policy).__name__}")
        if self.stop_cadence not in ("exact", "official"):
            raise ValueError(
                f"stop_cadence must be 'exact' or 'official', got {self.stop_cadence!r}"
            )
        if self.length_penalty is not None and not self.eos_token_ids:
            raise ValueError("length_penalty needs eos_token_ids (the token it favours)")

    def replace(self, **changes) -> DecodeConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The identity of the decoding (hashed into every result's config hash)."""
        values = dataclasses.asdict(self)
        options = values.pop("policy") or {}
        if self.policy is None or self.policy.flat_identity:
            return values | FLAT_KNOBS | options
        return values | {"policy": self.policy.name, "options": options}
