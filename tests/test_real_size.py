"""The published GSM8K checkpoints' architecture at its real size (Qwen3-1.7B: 28 layers, a
151,936-token vocabulary, bf16), random weights: every family's whole architecture as the
official loader builds it (on the meta device: shapes, no memory), and every family decoding
through the engine at the real width, heads and vocabulary in bf16, with 1 of the 28 layers
and a model length of 64 instead of 1,024 (at full size the four take over 20 minutes on a
2-core AVX2 CPU; `setdlm bench real-size` runs them)."""

from __future__ import annotations

import pytest
import torch

from setdlm.data.tokenizers import load_tokenizer
from setdlm.families import FAMILY_NAMES
from setdlm.recipes.real_size import QWEN3_1_7B, TokenIds, build_real_size, real_size_smoke


def _parameters(arch: dict) -> int:
    """Qwen3's parameter count from its config (tied embedding, no attention bias)."""
    hidden, heads, kv, head = (
        arch["hidden_size"],
        arch["num_attention_heads"],
        arch["num_key_value_heads"],
        arch["head_dim"],
    )
    attention = hidden * heads * head * 2 + hidden * kv * head * 2 + 2 * head
    layer = attention + 3 * hidden * arch["intermediate_size"] + 2 * hidden
    return arch["vocab_size"] * hidden + arch["num_hidden_layers"] * layer + hidden


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_family_builds_the_published_architecture(family, data_dir):
    ids = TokenIds.of(load_tokenizer(data_dir / "tokenizers" / "qwen3"))
    model = build_real_size(family, ids, device="meta")
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters == _parameters(QWEN3_1_7B), parameters  # 1.72 B: the real architecture
    assert {str(p.dtype) for p in model.parameters()} == {"torch.bfloat16"}


@pytest.mark.slow
def test_the_random_weights_are_drawn_once_as_transformers_draws_them(data_dir):
    """Built with torch's init switched off, then transformers' init: nothing may be left as
    the uninitialized memory that switch leaves (every matrix N(0, 0.02), every norm at 1)."""
    ids = TokenIds.of(load_tokenizer(data_dir / "tokenizers" / "qwen3"))
    model = build_real_size("setdlm", ids, layers=1, length=64)
    for name, parameter in model.named_parameters():
        values = parameter.detach()[:512].float()  # an init fills a whole tensor or none of it
        assert torch.isfinite(values).all(), name
        if values.dim() == 1:
            assert torch.equal(values, torch.ones_like(values)), name
        else:
            assert abs(values.mean().item()) < 1e-3 and 0.019 < values.std().item() < 0.021, name
    head = model.backbone.model.lm_head.weight
    assert head.data_ptr() == model.backbone.model.model.embed_tokens.weight.data_ptr()  # tied


# Four families built at the published width (a 151,936 x 2,048 embedding drawn for each) and
# decoded in bf16 (about 12 s on one AMD EPYC core): the end-to-end tier, with the other runs of
# whole commands (issue 47).
@pytest.mark.slow
@pytest.mark.e2e
def test_every_family_decodes_at_the_published_width_in_bf16(data_dir):
    tokenizer = load_tokenizer(data_dir / "tokenizers" / "qwen3")
    lines = []
    rows = real_size_smoke(tokenizer, new_tokens=4, log=lines.append, layers=1, length=64)
    assert [row.family for row in rows] == list(FAMILY_NAMES)
    one_layer = _parameters({**QWEN3_1_7B, "num_hidden_layers": 1})
    for row in rows:
        assert row.parameters == one_layer, row
        assert row.dtypes == ("torch.bfloat16",), row
        assert 1 <= row.tokens <= 4 and row.nfe >= row.tokens, row
        assert row.pool_tokens >= row.tokens, row  # the pool decoded its three prompts
    assert len(lines) == 1 + len(rows) and "GiB" in lines[-1]
