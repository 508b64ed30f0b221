"""The Qwen3 backbone (GSM8K and CNN/DM models): transformers' own Qwen3 modules, our forward.

The module holds ``self.model = transformers.Qwen3ForCausalLM``, so its parameter names are the
official ones minus ``backbone.`` (``model.model.layers.0.self_attn.q_proj.weight``,
``model.lm_head.weight`` tied to ``model.model.embed_tokens.weight``) and official or Hugging
Face checkpoints load unchanged. It follows the contract of ``setdlm.core.backbones.base``.

Why a forward of our own instead of calling ``Qwen3ForCausalLM.forward``: our contract hands over
a bool (B, Q, K) mask and a per-sequence ragged ``KVCache``, whereas transformers 5 rebuilds masks
on every call (``create_causal_mask``) and its ``Cache`` keeps one length for the whole batch.
Adapting our cache to ``CacheLayerMixin`` would still pay for that mask plumbing, output capturing
and kwargs handling on every decoding step, where on CPU per-op overhead dominates. So each layer
calls the HF submodules in the order of ``Qwen3DecoderLayer`` (input_layernorm, q/k/v projections,
q_norm/k_norm, RoPE, attention, o_proj, post_attention_layernorm, mlp), committed keys/values come
and new ones share one buffer through ``cache.extend``. The RoPE cos/sin come from HF's rotary
module, tabled once per position instead of recomputed per call.

Attention math, ``attn_implementation``:
- "eager": matmul, scale, + additive mask, float32 softmax, matmul over repeated kv heads, the
  arithmetic of transformers' ``eager_attention_forward``. The official custom Qwen3 attention
  takes that path whenever it gets a dense 4-D mask: every MDLM, BD3LM and SetDLM call.
- "sdpa": ``F.scaled_dot_product_attention`` with GQA, about 4x cheaper per layer on CPU. The
  official AR model passes ``attention_mask=None``, so HF ran its causal sdpa kernel;
  ``from_official`` therefore picks "sdpa" when ``use_causal_mask`` is set and "eager" otherwise.
On the tiny fixtures (logits up to ~19) the two differ by up to 2e-5.

Parity with the official fixtures: with the official choice above the arithmetic is the same op
for op, and on an AVX2 CPU a row's logits are bitwise equal to the recorded ones whenever its
softmax row sums cannot depend on the SIMD width; the other rows differ by up to ~1.1e-5. The
recording CPU summed softmax rows in 16 float lanes (AVX-512), an AVX2 CPU sums in 8, in another
order (``tests/test_backbone_qwen3.py``, ``order_independent_rows``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import repeat_kv, rotate_half

from setdlm.core.backbones.base import additive_attention_mask, rows_at
from setdlm.core.kv_cache import KVCache

ATTN_IMPLEMENTATIONS = ("eager", "sdpa")

# Keys of the official ``AutoModelFromPreTrained`` backbone_config that configure the wrapper;
# every other key is a Qwen3Config override (the training scripts pass hidden_size, vocab_size...).
_WRAPPER_KEYS = frozenset(
    {
        "_target_",
        "automodel_cls",
        "pretrained_model_name_or_path",
        "trust_remote_code",
        "num_layers",
        "keep_top_layers",
        "reinit_model",
        "use_causal_mask",
        "revision",
        "attn_implementation",
        "is_esolm_backbone",
    }
)


@dataclass(frozen=True)
class Qwen3BackboneConfig:
    """Everything needed to build the backbone, without remote code.

    architecture: a Qwen3 ``config.json`` dict (treated as read-only).
    num_layers: keep this many decoder layers (None = all). With ``reinit`` the model is built
        with that many layers; with pretrained weights the first (or, with ``keep_top_layers``,
        the last) ``num_layers`` layers are kept, as the official wrapper does.
    reinit: random initialisation from ``architecture`` instead of pretrained weights.
    pretrained: Hub id or local folder of the pretrained model (also where ``architecture`` came
        from); ``revision``: its Hub revision.
    attn_implementation: "eager" or "sdpa" (see the module docstring).
    use_causal_mask: the official flag, kept for the families: the official wrapper then drops
        any mask and runs plain causal attention, so an AR family passes a causal mask that
        ignores padding. The backbone never reads it.
    """

    architecture: dict[str, Any] = field(repr=False)
    num_layers: int | None = None
    keep_top_layers: bool = False
    reinit: bool = True
    pretrained: str | None = None
    revision: str | None = None
    attn_implementation: str = "eager"
    use_causal_mask: bool = False

    def __post_init__(self):
        if self.architecture.get("model_type", "qwen3") != "qwen3":
            raise ValueError(f"not a Qwen3 config: model_type={self.architecture['model_type']!r}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, "
                f"got {self.attn_implementation!r}"
            )
        total = self.architecture["num_hidden_layers"]
        if self.num_layers is not None and not 0 < self.num_layers <= total:
            raise ValueError(f"num_layers={self.num_layers} outside 1..{total}")
        if not self.reinit and self.pretrained is None:
            raise ValueError("pretrained weights requested (reinit=False) without `pretrained`")

    @classmethod
    def from_official(
        cls, backbone_config: dict[str, Any], base_dir: str | Path
    ) -> Qwen3BackboneConfig:
        """Read an official ``backbone_config`` (``_target_: ...AutoModelFromPreTrained``).

        ``pretrained_model_name_or_path`` is a folder relative to ``base_dir`` when one exists
        there (the fixtures' ``qwen3_backbone``), otherwise a Hub id whose ``config.json`` is
        downloaded. ``trust_remote_code`` and ``automodel_cls`` are ignored: Qwen3 is built in.
        """
        target = backbone_config.get("_target_", "")
        if target.rsplit(".", 1)[-1] != "AutoModelFromPreTrained":
            raise ValueError(f"not an AutoModelFromPreTrained backbone config: {target!r}")
        if backbone_config.get("is_esolm_backbone", False):
            raise ValueError("EsoLM Qwen3 backbones are not supported")
        name = backbone_config["pretrained_model_name_or_path"]
        revision = backbone_config.get("revision")
        local = Path(base_dir) / name
        if local.is_dir():
            pretrained = str(local.resolve())
            architecture = json.loads((local / "config.json").read_text())
        else:
            pretrained = name
            architecture = _hub_config(name, revision)
        architecture.update({k: v for k, v in backbone_config.items() if k not in _WRAPPER_KEYS})
        num_layers = backbone_config.get("num_layers", -1)
        causal = bool(backbone_config.get("use_causal_mask", False))
        official_attn = backbone_config.get("attn_implementation", "sdpa")
        return cls(
            architecture=architecture,
            num_layers=None if num_layers in (None, -1) else int(num_layers),
            keep_top_layers=bool(backbone_config.get("keep_top_layers", False)),
            reinit=bool(backbone_config.get("reinit_model", False)),
            pretrained=pretrained,
            revision=revision,
            attn_implementation="sdpa" if causal and official_attn != "eager" else "eager",
            use_causal_mask=causal,
        )

    def hf_config(self, num_hidden_layers: int | None = None) -> Qwen3Config:
        """The transformers config, optionally with fewer layers (reinit builds them directly)."""
        architecture = dict(self.architecture)
        if num_hidden_layers is not None:
            architecture["num_hidden_layers"] = num_hidden_layers
            if architecture.get("layer_types") is not None:
                architecture["layer_types"] = architecture["layer_types"][:num_hidden_layers]
        return Qwen3Config(**architecture, attn_implementation=self.attn_implementation)


def _hub_config(repo_id: str, revision: str | None) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download

    return json.loads(Path(hf_hub_download(repo_id, "config.json", revision=revision)).read_text())


def build_qwen3(config: Qwen3BackboneConfig) -> Qwen3ForCausalLM:
    """A ``Qwen3ForCausalLM`` with the configured layers, random or pretrained (float32)."""
    total = config.architecture["num_hidden_layers"]
    keep = total if config.num_layers is None else config.num_layers
    if config.reinit:
        return Qwen3ForCausalLM(config.hf_config(num_hidden_layers=keep))
    model = Qwen3ForCausalLM.from_pretrained(
        config.pretrained, revision=config.revision, config=config.hf_config(), dtype=torch.float32
    )
    kept = slice(total - keep, total) if config.keep_top_layers else slice(0, keep)
    model.model.layers = model.model.layers[kept]
    model.config.num_hidden_layers = keep
    if model.config.layer_types is not None:
        model.config.layer_types = model.config.layer_types[kept]
    for index, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = index  # HF's own cache indexes layers by position
    return model


def eager_attention(q, k, v, mask, scaling: float, groups: int, dropout: float) -> torch.Tensor:
    """q (B, H, Q, D), k/v (B, Hkv, K, D), mask (B, 1, Q, K) additive -> (B, H, Q, D)."""
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, K, D)
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling  # (B, H, Q, K)
    if mask is not None:
        scores = scores + mask
    # float32 softmax as in HF (for bf16/fp16 models), but never below the model's precision
    probs = F.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32))
    probs = probs.to(q.dtype)
    if dropout:
        probs = F.dropout(probs, p=dropout, training=True)
    return torch.matmul(probs, v)


def sdpa_attention(q, k, v, mask, scaling: float, groups: int, dropout: float) -> torch.Tensor:
    """Same inputs and output as ``eager_attention``, through the fused kernel."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=groups > 1
    )


ATTENTION = {"eager": eager_attention, "sdpa": sdpa_attention}


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """HF's ``Qwen3RMSNorm(x)``. On CPU in float32, ``F.rms_norm`` runs the same aten kernels
    (pow, mean, add, rsqrt, mul) from C++, so the bits are the same and a decoding step saves
    ~15% of its time; elsewhere (a fused CUDA kernel, bf16 casts) keep HF's own module."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


class Qwen3Backbone(nn.Module):
    def __init__(self, config: Qwen3BackboneConfig):
        super().__init__()
        self.config = config
        self.model = build_qwen3(config)
        hf_config = self.model.config
        if "sliding_attention" in (hf_config.layer_types or ()):
            raise NotImplementedError("sliding-window Qwen3 layers are not supported")
        if hf_config.rope_parameters["rope_type"] in ("dynamic", "longrope"):
            # their frequencies depend on the sequence length, so a per-position table is wrong
            raise NotImplementedError("length-dependent RoPE scaling is not supported")
        self._attend = ATTENTION[config.attn_implementation]
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # 2 x (P, D)

    @property
    def num_layers(self) -> int:
        return len(self.model.model.layers)

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        timesteps: torch.Tensor | None = None,
        outputs_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        del timesteps  # Qwen3 has no time conditioning
        decoder = self.model.model
        batch, queries = input_ids.shape
        hidden = decoder.embed_tokens(input_ids)  # (B, Q, H)
        cos, sin = self._rotary(position_ids, hidden)  # each (B, 1, Q, D)
        mask = None
        if attention_mask is not None:
            keys = queries + (cache.width if cache is not None else 0)
            if attention_mask.shape != (batch, queries, keys):
                raise ValueError(
                    f"attention_mask must be (B, Q, K) = {(batch, queries, keys)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            mask = additive_attention_mask(attention_mask, hidden.dtype)  # (B, 1, Q, K)
        for index, layer in enumerate(decoder.layers):
            normed = rms_norm(layer.input_layernorm, hidden)
            hidden = hidden + self._attention(index, layer.self_attn, normed, cos, sin, mask, cache)
            hidden = hidden + layer.mlp(rms_norm(layer.post_attention_layernorm, hidden))
        hidden = rows_at(hidden, outputs_at)  # (B, D, H): only the rows whose logits are used
        return self.model.lm_head(rms_norm(decoder.norm, hidden))  # (B, Q or D, V)

    def _attention(self, index, attn, x, cos, sin, mask, cache: KVCache | None) -> torch.Tensor:
        batch, queries, _ = x.shape
        heads_shape = (batch, queries, -1, attn.head_dim)
        q = rms_norm(attn.q_norm, attn.q_proj(x).view(heads_shape))  # (B, Q, H, D)
        k = rms_norm(attn.k_norm, attn.k_proj(x).view(heads_shape))  # (B, Q, Hkv, D)
        v = attn.v_proj(x).view(heads_shape)  # (B, Q, Hkv, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # heads first
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            # after RoPE, so cached slots never need their positions again
            k, v = cache.extend(index, k, v)  # (B, Hkv, width + Q, D)
        dropout = attn.attention_dropout if self.training else 0.0
        out = self._attend(q, k, v, mask, attn.scaling, attn.num_key_value_groups, dropout)
        return attn.o_proj(out.transpose(1, 2).reshape(batch, queries, -1))  # (B, Q, H)

    def _rotary(self, position_ids: torch.Tensor, like: torch.Tensor):
        """cos/sin at each position id, (B, 1, Q, D) each, from a table grown on demand.

        HF computes cos(position * inv_freq) elementwise, so a row of the table is bitwise the
        value HF would compute for that position. The table starts with the model's
        ``max_position_embeddings`` rows; only a CPU tensor's largest position is read to grow
        it further, because on an accelerator that read would wait for the device every forward.
        """
        table = self._rope_table
        needed = 0
        if position_ids.device.type == "cpu":
            needed = int(position_ids.max()) + 1
        if (
            table is None
            or table[0].shape[0] < needed
            or table[0].device != like.device
            or table[0].dtype != like.dtype
        ):
            size = max(needed, 1024, self.model.config.max_position_embeddings)
            if table is not None:
                size = max(size, 2 * table[0].shape[0])
            positions = torch.arange(size, device=like.device)[None]  # (1, P)
            # a plain tensor even under inference_mode, so a later training forward can use it
            with torch.inference_mode(False), torch.no_grad():
                cos, sin = self.model.model.rotary_emb(like, positions)  # each (1, P, D)
            self._rope_table = table = (cos[0], sin[0])
        return table[0][position_ids][:, None], table[1][position_ids][:, None]
