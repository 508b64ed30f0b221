"""Training settings and the learning-rate schedule they define.

The defaults follow the official trainer (SPEC 1.4): AdamW betas (0.9, 0.98), eps 1e-8, EMA
0.9999 updated every optimizer step, gradient-norm clipping at 1.0, linear warmup, then a
constant rate or a cosine decay to ``final_lr_fraction * lr`` (Composer's ``alpha_f``).

Weight decay follows torch's AdamW, where the decay applied per step is ``lr * weight_decay``.
Composer's DecoupledAdamW, which the official runs use, applies ``weight_decay * lr / lr0``
instead, so its ``weight_decay=1e-5`` corresponds to ``weight_decay = 1e-5 / lr`` here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

SCHEDULES = ("constant", "cosine")
PRECISIONS = ("fp32", "bf16")
# Settings a resumed run may change without changing the sequence of updates it computes.
RESUMABLE_CHANGES = frozenset({"checkpoint_every", "keep_last", "log_every"})


@dataclass(frozen=True)
class TrainConfig:
    """How to train. ``batch_size`` is per process and per micro-batch: one optimizer step sees
    ``batch_size * grad_accum_steps * num_processes`` sequences."""

    max_steps: int
    batch_size: int = 8
    grad_accum_steps: int = 1
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    final_lr_fraction: float = 0.0  # cosine only: the rate decays to this fraction of ``lr``
    clip_norm: float | None = 1.0  # None disables clipping (the norm is still logged)
    ema_decay: float = 0.9999  # 0 disables the EMA
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 = autocast on GPU; CPU runs fp32
    checkpoint_every: int = 1000
    keep_last: int = 2
    log_every: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("max_steps", "batch_size", "grad_accum_steps", "checkpoint_every")
        positive += ("keep_last", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(
                f"TrainConfig needs lr > 0, eps > 0, weight_decay >= 0; got lr={self.lr}, "
                f"eps={self.eps}, weight_decay={self.weight_decay}"
            )
        if len(self.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ValueError(f"TrainConfig.betas must be two values in [0, 1), got {self.betas}")
        if not 0 <= self.warmup_steps <= self.max_steps:
            raise ValueError(
                f"TrainConfig.warmup_steps must be in [0, max_steps={self.max_steps}], "
                f"got {self.warmup_steps}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule must be one of {SCHEDULES}: {self.schedule!r}")
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(
                f"TrainConfig.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}"
            )
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"TrainConfig.clip_norm must be > 0 or None, got {self.clip_norm}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"TrainConfig.ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"TrainConfig.precision must be one of {PRECISIONS}: {self.precision!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["betas"] = list(self.betas)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig keys {unknown}; known keys are {sorted(known)}")
        values = dict(values)
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        return cls(**values)


def lr_multiplier(step: int, config: TrainConfig) -> float:
    """The fraction of ``config.lr`` used by the update that follows ``step`` completed updates.

    Warmup is linear and reaches the full rate on its last step, so the first update is not
    wasted at lr 0: update ``s`` (0-based) gets ``(s + 1) / warmup_steps``. The cosine phase
    then runs from 1 at ``warmup_steps`` to ``final_lr_fraction`` at ``max_steps``.
    """
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    decay_steps = max(1, config.max_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.final_lr_fraction + (1.0 - config.final_lr_fraction) * cosine


def resume_differences(saved: TrainConfig, current: TrainConfig) -> list[str]:
    """Settings that differ between a checkpoint's config and the current one and would change
    the updates (``max_steps`` only matters to the cosine schedule)."""
    allowed = set(RESUMABLE_CHANGES)
    if current.schedule == "constant":
        allowed.add("max_steps")
    saved_values, current_values = saved.to_dict(), current.to_dict()
    return [
        f"{name}: checkpoint {saved_values[name]!r}, now {current_values[name]!r}"
        for name in saved_values
        if name not in allowed and saved_values[name] != current_values[name]
    ]
