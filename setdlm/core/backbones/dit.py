"""The DiT backbone of the official Set Diffusion code (LM1B / OWT models), re-implemented.

A pre-LayerNorm transformer with rotary position embeddings, optional adaLN time conditioning
and an untied output layer. Parameter names match the official ``DIT`` (``src/backbone/dit.py``)
with the ``backbone.`` prefix removed, so the official checkpoints load unchanged. The float32
operations are the official ones in the official order: on one machine the logits are bit for bit
those of the official forward (tests/test_backbone_dit.py); across CPUs, kernels round differently.

It follows the contract of ``setdlm.core.backbones.base``. Differences from the official forward:
- Attention is whatever the caller's mask says. The official AR DiT (``causal_attention: true``)
  ignores its mask and runs ``is_causal``; its family passes a lower-triangular mask instead.
- The official MDLM/BD3LM/SetDLM denoisers never pass ``sigma``, so the adaLN models always
  ran with sigma = 0; ``timesteps=None`` means the same zeros here.
- RoPE angles come from the position ids of each row (the official ``RotaryAllowPermutations``),
  so permuted orders keep their true positions, with or without a KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from setdlm.core.backbones.base import additive_attention_mask, rows_at
from setdlm.core.kv_cache import KVCache

# Sinusoidal timestep features fed to the sigma MLP (official TimestepEmbedder defaults).
TIMESTEP_FEATURES = 256
TIMESTEP_MAX_PERIOD = 10_000


@dataclass(frozen=True)
class DiTConfig:
    vocab_size: int
    hidden_size: int
    n_heads: int
    num_layers: int
    cond_dim: int
    mlp_ratio: int = 4
    dropout: float = 0.1
    adaln: bool = False
    length: int = 1024  # model length L; the backbone itself does not limit the input length
    rope_base: float = 10_000.0
    # Kept from the official config for the families: an AR DiT must be given causal masks.
    # The backbone never reads it (the caller's mask decides).
    causal_attention: bool = False

    def __post_init__(self):
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} not divisible by {self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    @classmethod
    def from_official(cls, backbone_config: dict[str, Any]) -> DiTConfig:
        """Read an official ``backbone_config`` dict (``_target_: ...dit.DIT``, or
        ``...dit_legacy.DITLegacy``, the backbone of the OWT AR and MDLM checkpoints from the
        mdlm/bd3lms codebase: the same modules, parameter names and operations; it only runs
        its blocks and output layer under bf16 autocast, which we do not reproduce, so our
        logits are float32 and the official ones carry bf16 rounding).

        Ignored keys: ``attn_backend`` (sdpa, flex and flash compute the same attention),
        ``block_size`` (unused by DIT's forward), ``tie_word_embeddings`` (DIT keeps a separate
        ``output_layer.linear`` whatever it says) and ``pretrained_model_name_or_path`` (weights
        are loaded by the caller).
        """
        target = backbone_config.get("_target_", "DIT")
        if target.rsplit(".", 1)[-1] not in ("DIT", "DITLegacy"):
            raise ValueError(f"not a DIT or DITLegacy backbone config: _target_={target!r}")
        if backbone_config.get("is_esolm_backbone", False):
            raise ValueError("EsoLM DIT backbones are not supported")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in backbone_config.items() if k in known})


class EmbeddingLayer(nn.Module):
    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        # A bare parameter (not nn.Embedding) so its name is ``vocab_embed.embedding``.
        self.embedding = nn.Parameter(torch.empty(vocab_size, dim))
        nn.init.kaiming_uniform_(self.embedding, a=math.sqrt(5))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embedding)


def layer_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """LayerNorm with a weight and no bias, in float32 at least: the official LayerNorm upcasts
    bf16/fp16 to float32; float64 is kept so that tests can run the model near-exactly."""
    if x.dtype == weight.dtype and x.dtype in (torch.float32, torch.float64):
        return F.layer_norm(x, weight.shape, weight=weight)
    return F.layer_norm(x.float(), weight.shape, weight=weight.float()).to(x.dtype)


class LayerNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight)


class Rotary(nn.Module):
    """RoPE frequencies; cos/sin are computed per forward from each row's position ids."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq)  # persistent: official checkpoints hold it

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype):
        """(B, Q) positions -> cos, signed_sin, each (B, 1, Q, D) for (B, H, Q, D) tensors.

        ``rotate_half(x) * sin`` equals ``x.roll(D/2) * signed_sin`` with
        signed_sin = [-sin, sin], bit for bit (negation is exact); a roll is one op.
        """
        freqs = position_ids.to(self.inv_freq.dtype)[..., None] * self.inv_freq  # (B, Q, D/2)
        cos = freqs.cos().to(dtype)
        sin = freqs.sin().to(dtype)
        cos = torch.cat((cos, cos), dim=-1)[:, None]  # (B, 1, Q, D)
        signed_sin = torch.cat((-sin, sin), dim=-1)[:, None]  # (B, 1, Q, D)
        return cos, signed_sin


class TimestepEmbedder(nn.Module):
    """Noise level -> conditioning vector: sinusoidal features, then a 2-layer MLP."""

    def __init__(self, cond_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(TIMESTEP_FEATURES, cond_dim),
            nn.SiLU(),
            nn.Linear(cond_dim, cond_dim),
        )
        half = TIMESTEP_FEATURES // 2
        freqs = torch.exp(-math.log(TIMESTEP_MAX_PERIOD) * torch.arange(half).float() / half)
        self.register_buffer("freqs", freqs, persistent=False)  # (F/2,), not in checkpoints

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        fc1, _, fc2 = self.mlp
        args = t[:, None].float() * self.freqs  # (B, F/2)
        features = torch.cat((args.cos(), args.sin()), dim=-1).to(fc1.weight.dtype)  # (B, F)
        return F.linear(F.silu(F.linear(features, fc1.weight, fc1.bias)), fc2.weight, fc2.bias)


class DiTBlock(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.hidden_size
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.norm1 = LayerNorm(dim)
        self.attn_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.attn_out = nn.Linear(dim, dim, bias=False)
        self.norm2 = LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, config.mlp_ratio * dim),
            nn.GELU(approximate="tanh"),
            nn.Linear(config.mlp_ratio * dim, dim),
        )
        if config.adaln:
            # zero init: a fresh model starts as the unconditioned one
            self.adaLN_modulation = nn.Linear(config.cond_dim, 6 * dim)
            nn.init.zeros_(self.adaLN_modulation.weight)
            nn.init.zeros_(self.adaLN_modulation.bias)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.dropout, training=True) if self.training else x

    # The forward calls F.linear / layer_norm on the parameters instead of calling the
    # submodules: at decoding sizes each module call costs as much as the op itself.
    def forward(
        self,
        x: torch.Tensor,  # (B, Q, C)
        cos: torch.Tensor,  # (B, 1, Q, D)
        signed_sin: torch.Tensor,  # (B, 1, Q, D)
        mask: torch.Tensor | None,  # (B, 1, Q, K) additive
        cond: torch.Tensor | None,  # (B, cond_dim)
        layer: int,
        cache: KVCache | None,
    ) -> torch.Tensor:
        batch, q_len, _ = x.shape
        h = layer_norm(x, self.norm1.weight)
        if cond is not None:
            ada = self.adaLN_modulation
            # (B, 1, C) each: one modulation for every token of a row
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = F.linear(
                cond, ada.weight, ada.bias
            )[:, None].chunk(6, dim=2)
            h = h * (1 + scale_msa) + shift_msa

        qkv = F.linear(h, self.attn_qkv.weight).view(batch, q_len, 3, self.n_heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, Q, D)
        # RoPE on q and k in one go; v is left as is (the official cos=1/sin=0 on v is a no-op)
        qk = qkv[:2]  # (2, B, H, Q, D)
        qk = qk * cos + qk.roll(self.head_dim // 2, dims=-1) * signed_sin
        q, k = qk.unbind(0)  # (B, H, Q, D) each
        v = qkv[2]  # (B, H, Q, D)
        if cache is not None:
            k, v = cache.extend(layer, k, v)  # (B, H, width + Q, D): cached slots, then ours
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        attn = attn.transpose(1, 2).reshape(batch, q_len, -1)  # (B, Q, C)
        attn = self._drop(F.linear(attn, self.attn_out.weight))

        fc1, _, fc2 = self.mlp
        if cond is not None:
            x = x + gate_msa * attn
            h = layer_norm(x, self.norm2.weight) * (1 + scale_mlp) + shift_mlp
        else:
            x = x + attn
            h = layer_norm(x, self.norm2.weight)
        h = F.gelu(F.linear(h, fc1.weight, fc1.bias), approximate="tanh")  # (B, Q, 4C)
        h = self._drop(F.linear(h, fc2.weight, fc2.bias))
        return x + gate_mlp * h if cond is not None else x + h


class FinalLayer(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.hidden_size
        self.norm_final = LayerNorm(dim)
        # zero init as in the official code (an untrained model predicts uniform logits)
        self.linear = nn.Linear(dim, config.vocab_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        if config.adaln:
            self.adaLN_modulation = nn.Linear(config.cond_dim, 2 * dim)
            nn.init.zeros_(self.adaLN_modulation.weight)
            nn.init.zeros_(self.adaLN_modulation.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        x = layer_norm(x, self.norm_final.weight)
        if cond is not None:
            ada = self.adaLN_modulation
            shift, scale = F.linear(cond, ada.weight, ada.bias)[:, None].chunk(2, dim=2)  # (B,1,C)
            x = x * (1 + scale) + shift
        return F.linear(x, self.linear.weight, self.linear.bias)


class DiT(nn.Module):
    """logits = dit(input_ids, position_ids, attention_mask, cache=None, timesteps=None).

    input_ids, position_ids: (B, Q) long (position_ids may also be (1, Q), shared by the rows).
    attention_mask: (B, Q, K) bool, True = may attend, K = cache.width + Q; None = attend to
    every key (with a cache: every slot up to ``cache.width``, stale ones included).
    timesteps: (B,) noise level for adaLN models; None = zeros, which is what the official
    denoisers passed. Ignored when ``config.adaln`` is False.
    outputs_at: (B, D) long inputs whose logits are wanted; None = all.
    Returns (B, Q, vocab_size) logits, or (B, D, vocab_size) with outputs_at.
    """

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        self.vocab_embed = EmbeddingLayer(config.vocab_size, config.hidden_size)
        if config.adaln:
            self.sigma_map = TimestepEmbedder(config.cond_dim)
        self.rotary_emb = Rotary(config.head_dim, config.rope_base)
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.num_layers))
        self.output_layer = FinalLayer(config)

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def vocab_size(self) -> int:
        """Token ids it embeds (rows of its embedding table)."""
        return self.config.vocab_size

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        timesteps: torch.Tensor | None = None,
        outputs_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, q_len = input_ids.shape
        x = self.vocab_embed(input_ids)  # (B, Q, C)
        cos, signed_sin = self.rotary_emb(position_ids, x.dtype)  # (B|1, 1, Q, D)

        mask = None
        if attention_mask is not None:
            keys = q_len + (cache.width if cache is not None else 0)
            if attention_mask.shape[-2:] != (q_len, keys):
                raise ValueError(
                    f"attention_mask {tuple(attention_mask.shape)} does not match "
                    f"(B, Q={q_len}, K={keys})"
                )
            mask = additive_attention_mask(attention_mask, x.dtype)  # (B, 1, Q, K)

        cond = None
        if self.config.adaln:
            if timesteps is None:
                timesteps = torch.zeros(batch, device=x.device, dtype=x.dtype)
            elif timesteps.shape != (batch,):
                raise ValueError(f"timesteps must be (B,)=({batch},), got {tuple(timesteps.shape)}")
            cond = F.silu(self.sigma_map(timesteps))  # (B, cond_dim)

        for layer, block in enumerate(self.blocks):
            x = block(x, cos, signed_sin, mask, cond, layer, cache)
        return self.output_layer(rows_at(x, outputs_at), cond)  # (B, Q or D, V)
