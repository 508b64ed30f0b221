"""What every model family shares: its typed config, its backbone, and the common helpers.

A family (``baselines/ar.py``, ``baselines/mdlm.py``, ``baselines/bd3lm.py``,
``setdlm/model.py``) is an ``nn.Module`` holding ``self.backbone`` (so parameter names follow
the official checkpoints: ``backbone.…``) and implementing ``loss`` (training objective and
eval NLL, with every random quantity injectable). It decodes with the policies its row of
``setdlm/families.py`` lists, through the shared decoding engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from setdlm import families
from setdlm.core.decoding import DecodeConfig, GenerationOutput, OrderPolicy, generate
from setdlm.core.decoding.pool import FinishedCallback, generate_continuous
from setdlm.core.outputs import LossOutput
from setdlm.core.schedules import LinearSchedule, StaggeredSchedule

SCHEDULES = {"linear": LinearSchedule, "staggered": StaggeredSchedule}
SUBS_MASKED_LOGIT = -1e12  # the official "neg_infinity" of the SUBS parameterization


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a family's model, stored with every checkpoint.

    backbone_kind selects the backbone ("dit" or "qwen3"); backbone holds its settings.
    schedule is explicit (never inferred from a model name): a LinearSchedule for MDLM/BD3LM,
    a StaggeredSchedule (N, d, M, k, b) for SetDLM, None for AR.
    official_compat reproduces the official loss quirks (AR label mask aligned with inputs,
    SetDLM eval mask mixing orders and dropping target tokens equal to the pad id, MDLM with
    a Qwen3 backbone and no padding running causal attention).
    """

    family: str
    length: int
    vocab_size: int  # tokenizer size; the backbone may have more output rows
    mask_token_id: int
    pad_token_id: int
    backbone_kind: str
    backbone: dict
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    block_size: int | None = None  # BD3LM training block S
    schedule: LinearSchedule | StaggeredSchedule | None = None
    keep_clean_bos: bool = False
    train_on_context: bool = False
    official_compat: bool = False

    def __post_init__(self):
        info = families.family(self.family)
        wanted = SCHEDULES.get(info.schedule)
        if wanted is None and self.schedule is not None:
            raise ValueError(
                f"{info.title} has no noise schedule, but this config has a "
                f"{type(self.schedule).__name__} (a diffusion model's config with family "
                f"{self.family}?)"
            )
        if wanted is not None and not isinstance(self.schedule, wanted):
            raise ValueError(f"{info.title} needs a {wanted.__name__}")
        if "block_size" in info.settings and (not self.block_size or self.length % self.block_size):
            raise ValueError(
                f"{info.title} needs a block_size dividing length {self.length}, got "
                f"{self.block_size}"
            )
        if isinstance(self.schedule, StaggeredSchedule) and self.length != self.schedule.N:
            raise ValueError(
                f"{info.title}'s schedule N ({self.schedule.N}) must equal length {self.length}"
            )

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        schedule = self.schedule
        if schedule is not None:
            kind = next(k for k, kind in SCHEDULES.items() if isinstance(schedule, kind))
            values["schedule"] = {"kind": kind, **dataclasses.asdict(schedule)}
        return values

    @classmethod
    def from_dict(cls, values: dict, source: str = "model config") -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown keys {unknown}; expected keys from {sorted(known)}"
            )
        values = dict(values)
        schedule = values.get("schedule")
        if isinstance(schedule, dict):
            schedule = dict(schedule)
            kind = schedule.pop("kind", None)
            if kind not in SCHEDULES:
                raise ValueError(f"{source}: schedule.kind must be one of {sorted(SCHEDULES)}")
            values["schedule"] = SCHEDULES[kind](**schedule)
        return cls(**values)

    def digest(self) -> str:
        """Stable hash of the config (identifies the model in results)."""
        text = json.dumps(self.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class Family(nn.Module):
    """Base class of the families (setdlm/families.py lists them)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        from setdlm.core.backbones import build_backbone

        self.config = config
        self.backbone = build_backbone(config.backbone_kind, config.backbone)
        # sha256 of the weights file the model was loaded from (None: built in memory); part of
        # every result's identity
        self.weights_sha256: str | None = None

    @property
    def device(self) -> torch.device:
        # Read at every decoding step, and next(self.parameters()) walks the module tree (about
        # 10 us a call on CPU): remembered until the weights move (``to``, ``cuda`` and the
        # like all go through ``_apply``).
        device = self.__dict__.get("_device")
        if device is None:
            device = self.__dict__["_device"] = next(self.parameters()).device
        return device

    def _apply(self, fn, *args, **kwargs):
        self.__dict__.pop("_device", None)
        return super()._apply(fn, *args, **kwargs)

    @property
    def num_layers(self) -> int:
        return self.backbone.num_layers

    # ------------------------------------------------------------------ what a family defines
    @abstractmethod
    def loss(
        self,
        batch: dict[str, torch.Tensor],
        *,
        generator: torch.Generator | None = None,
        randomness: dict[str, torch.Tensor] | None = None,
    ) -> LossOutput:
        """Training loss in train mode, eval NLL (or its bound) in eval mode."""

    def decode_policy(self, config: DecodeConfig, **runtime: Any) -> OrderPolicy:
        """The decoding policy ``config.policy`` names (None: the family's default) with its
        options; ``runtime`` are per-call inputs of the policy (recorded first-hitting times
        replayed by the parity check)."""
        name = None if config.policy is None else config.policy.name
        info = families.family(self.config.family).policy(name)
        return families.load(info.path)(self, config, config.policy, **runtime)

    # ------------------------------------------------------------------ shared entry points
    def decode_forward(self, input_ids, position_ids, attention_mask, cache, outputs_at=None):
        """One backbone call made by the decoding engine (time-agnostic conditioning); the
        logits of the inputs ``outputs_at`` (B, D) only, when given."""
        return self.backbone(
            input_ids, position_ids, attention_mask, cache=cache, outputs_at=outputs_at
        )

    @torch.inference_mode()  # one mode for every family: it alone changes speed by ~10%
    def generate(
        self,
        prompts: list[list[int]],
        config: DecodeConfig,
        seeds: list[int] | None = None,
        tokenizer=None,
        batch_size: int | None = None,
        on_finished: FinishedCallback | None = None,
        stop_after: list[int | None] | None = None,
        **policy_options: Any,
    ) -> GenerationOutput:
        """Decode ``prompts`` as one static batch, or, with ``batch_size``, through a
        continuous-batching pool of that many slots (``on_finished`` hears each row as it
        finishes). Both give every row the tokens it gets alone. ``stop_after``: per prompt, a
        length at which the row stops as if an EOS stood there (benchmarks replaying a
        workload's output lengths), or None."""
        if batch_size is None:
            if on_finished is not None:
                raise ValueError("on_finished needs continuous batching (batch_size=...)")
            return generate(
                self,
                prompts,
                config,
                seeds,
                tokenizer=tokenizer,
                policy_options=policy_options,
                stop_after=stop_after,
            )
        return generate_continuous(
            self,
            prompts,
            config,
            batch_size,
            seeds,
            tokenizer=tokenizer,
            on_finished=on_finished,
            policy_options=policy_options,
            stop_after=stop_after,
        )

    def batch_tensors(self, batch: dict[str, torch.Tensor]):
        """(input_ids, attention_mask, context_mask) on the model device, as bool masks."""
        input_ids = batch["input_ids"].to(self.device)
        attention = batch.get("attention_mask")
        attention = (
            torch.ones_like(input_ids, dtype=torch.bool)
            if attention is None
            else (attention.to(self.device).bool())
        )
        context = batch.get("context_mask")
        context = torch.zeros_like(attention) if context is None else context.to(self.device).bool()
        return input_ids, attention, context


def default_schedule(family: str, length: int, block_size: int):
    """The schedule of the paper's pairing: linear for MDLM/BD3LM, staggered with d = S and
    smax M = 2S for SetDLM (so SetDLM-smax2S is compared with BD3LM-S), none for AR."""
    kind = families.family(family).schedule
    if kind == "linear":
        return LinearSchedule()
    if kind == "staggered":
        return StaggeredSchedule.from_sizes(N=length, d=block_size)
    return None


def subs_log_probs(logits: torch.Tensor, noisy_ids: torch.Tensor, mask_token_id: int):
    """SUBS parameterization (MDLM): never predict the mask token, and copy unmasked inputs.

    logits: (B, L, V) for the noisy inputs ``noisy_ids`` (B, L). Returns (B, L, V) log-probs
    where an unmasked input puts all its mass (log p = 0) on itself.
    """
    logits = logits.float().clone()
    logits[..., mask_token_id] = SUBS_MASKED_LOGIT
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    unmasked = noisy_ids != mask_token_id  # (B, L)
    copied = torch.full_like(log_probs, SUBS_MASKED_LOGIT)
    copied.scatter_(-1, noisy_ids[..., None], 0.0)
    return torch.where(unmasked[..., None], copied, log_probs)


def per_sequence_mean(nlls: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of (sum of nlls / count), 0 for sequences with nothing counted."""
    totals = nlls.sum(dim=-1)
    return torch.where(counts > 0, totals / counts.clamp(min=1), torch.zeros_like(totals)).mean()
