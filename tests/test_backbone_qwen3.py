"""Qwen3 backbone: official logits parity, checkpoint names, pretrained loading, KV cache."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from setdlm.core.backbones.qwen3 import Qwen3Backbone, Qwen3BackboneConfig
from setdlm.core.kv_cache import KVCache

FIXTURES = ["ar-qwen3", "mdlm-qwen3", "bd3lm-s4-qwen3", "setdlm-smax8-qwen3"]
# Rows that order_independent_rows proves exact on any CPU; the counts guard the proof's reach.
MIN_EXACT_ROWS = {"ar-qwen3": 32, "mdlm-qwen3": 0, "bd3lm-s4-qwen3": 64, "setdlm-smax8-qwen3": 64}
ATOL_FLOAT64 = 1e-9  # cache tests; a wrong position or mask moves logits by O(1)


def official_config(parity_dir, name: str) -> Qwen3BackboneConfig:
    folder = parity_dir / name
    backbone_config = json.loads((folder / "config.json").read_text())["backbone_config"]
    return Qwen3BackboneConfig.from_official(backbone_config, folder)


def load_official(parity_dir, name: str, **overrides) -> tuple[Qwen3Backbone, dict]:
    """The fixture's backbone with its official weights, and its recorded backbone call."""
    backbone = Qwen3Backbone(replace(official_config(parity_dir, name), **overrides)).eval()
    weights = load_file(parity_dir / name / "model.safetensors")
    # the SetDLM checkpoint also holds the denoiser's static_attention_mask buffer
    backbone.load_state_dict(
        {k.removeprefix("backbone."): v for k, v in weights.items() if k.startswith("backbone.")}
    )
    return backbone, load_file(parity_dir / name / "reference_tensors.safetensors")


def recorded_call(tensors: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, positions (B, Q) and the bool mask (B, Q, Q) of the recorded official call.

    Without recorded positions the official call passed none and HF used arange(Q) (its
    cache_position); without a recorded mask it passed attention_mask=None and HF used plain
    causal attention (no padding mask).
    """
    ids = tensors["eval_backbone_input_ids"]  # (B, Q)
    batch, length = ids.shape
    positions = tensors.get("eval_backbone_position_ids", torch.arange(length)[None])
    allowed = tensors.get("eval_backbone_attention_allowed")  # (B, 1, Q, Q) uint8
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool).tril().expand(batch, -1, -1)
    else:
        allowed = allowed[:, 0].bool()
    return ids, positions.expand(batch, -1), allowed


def order_independent_rows(allowed: torch.Tensor, num_layers: int) -> torch.Tensor:
    """(B, Q) bool: rows whose logits cannot depend on the SIMD width of softmax's row sums.

    The fixtures were recorded on an AVX-512 CPU, which sums a softmax row in 16 float lanes;
    an AVX2 CPU sums it in 8, in another order, which moves other rows by ~1e-5. With K >= 16
    keys both orders give the same float sum when every residue class of key indices mod 8
    holds at most two attended keys (masked keys add exact zeros; two terms add alike in any
    order). A fully masked row attends to every key. A row is then exact when this holds for
    it and, in the layers below, for every row it attends to.
    """
    batch, queries, keys = allowed.shape
    assert keys >= 16 and queries == keys
    attended = torch.where(allowed.any(-1, keepdim=True), allowed, True)  # (B, Q, K)
    per_class = F.pad(attended, (0, -keys % 8)).unflatten(-1, (-1, 8)).sum(-2)  # (B, Q, 8)
    row_ok = (per_class <= 2).all(-1)  # (B, Q)
    exact = row_ok
    for _ in range(num_layers - 1):
        exact = row_ok & exact & ~(attended & ~exact[:, None, :]).any(-1)
    return exact


def causal(queries: int, width: int = 0, batch: int = 1) -> torch.Tensor:
    """(B, Q, width + Q) bool: every cached slot, then causal over the Q new inputs."""
    new = torch.ones(queries, queries, dtype=torch.bool).tril()
    allowed = torch.cat((torch.ones(queries, width, dtype=torch.bool), new), dim=1)
    return allowed.expand(batch, -1, -1)


# ------------------------------------------------------------------------- official parity
def test_from_official_reads_the_fixture_layout(parity_dir):
    config = official_config(parity_dir, "setdlm-smax8-qwen3")
    folder = (parity_dir / "setdlm-smax8-qwen3" / "qwen3_backbone").resolve()
    assert config.pretrained == str(folder)
    assert config.architecture["vocab_size"] == 160
    assert (config.num_layers, config.reinit, config.keep_top_layers) == (2, True, False)
    assert (config.attn_implementation, config.use_causal_mask) == ("eager", False)
    ar = official_config(parity_dir, "ar-qwen3")
    assert (ar.attn_implementation, ar.use_causal_mask) == ("sdpa", True)
    with pytest.raises(ValueError, match="AutoModelFromPreTrained"):
        Qwen3BackboneConfig.from_official({"_target_": "backbone_dit.DIT"}, parity_dir)


def test_parameter_names_match_the_official_checkpoint(parity_dir):
    keys = json.loads((parity_dir / "setdlm-smax8-qwen3" / "keys.json").read_text())["tensors"]
    official = {k.removeprefix("backbone.") for k in keys if k.startswith("backbone.")}
    backbone = Qwen3Backbone(official_config(parity_dir, "setdlm-smax8-qwen3"))
    assert set(backbone.state_dict()) == official
    assert backbone.model.lm_head.weight is backbone.model.model.embed_tokens.weight


@pytest.mark.parametrize("attn", ["official", "eager", "sdpa"])
@pytest.mark.parametrize("name", FIXTURES)
def test_logits_match_the_official_backbone(parity_dir, name, attn):
    overrides = {} if attn == "official" else {"attn_implementation": attn}
    backbone, tensors = load_official(parity_dir, name, **overrides)
    ids, positions, allowed = recorded_call(tensors)
    with torch.no_grad():
        logits = backbone(ids, positions, allowed)  # (B, Q, V)
    expected = tensors["eval_backbone_logits"]
    error = (logits - expected).abs().amax(-1)  # (B, Q)
    # measured on AVX2: <= 1.1e-5 with the official attention, <= 1.8e-5 with the other one
    assert error.max() <= 5e-5
    if attn != "official":
        return
    exact = order_independent_rows(allowed, backbone.num_layers)
    assert exact.sum() >= MIN_EXACT_ROWS[name]
    assert torch.equal(logits[exact], expected[exact]), "same arithmetic as official, bit for bit"
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        assert error.max() <= 1e-6, "the recording CPU's reduction order: every row within 1e-6"


def test_mask_shape_is_checked(parity_dir):
    backbone, _ = load_official(parity_dir, "ar-qwen3")
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="attention_mask"):
        backbone(ids, torch.arange(4)[None], causal(4, width=2))


def test_pretrained_folder_loads_and_truncates_layers(parity_dir, tmp_path):
    architecture = {**official_config(parity_dir, "ar-qwen3").architecture, "num_hidden_layers": 3}
    source = Qwen3Backbone(Qwen3BackboneConfig(architecture=architecture)).model
    source.save_pretrained(tmp_path)
    for top, kept in ((False, [0, 1]), (True, [1, 2])):
        config = Qwen3BackboneConfig(
            architecture=architecture,
            num_layers=2,
            keep_top_layers=top,
            reinit=False,
            pretrained=str(tmp_path),
        )
        loaded = Qwen3Backbone(config).model
        assert len(loaded.model.layers) == loaded.config.num_hidden_layers == 2
        for layer, index in zip(loaded.model.layers, kept, strict=True):
            want = source.model.layers[index].self_attn.q_proj.weight
            assert torch.equal(layer.self_attn.q_proj.weight, want)
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


# ----------------------------------------------------------------------------- KV cache
@pytest.fixture(scope="module", params=["eager", "sdpa"])
def tiny(request, parity_dir) -> Qwen3Backbone:
    """The AR fixture's model in float64: the cache tests then see logic errors, not the
    float32 rounding that a different softmax row length brings (~1e-5 on these logits)."""
    backbone, _ = load_official(parity_dir, "ar-qwen3", attn_implementation=request.param)
    return backbone.double()


def sequences(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 150, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def decode_in_chunks(backbone, ids, positions, bounds) -> torch.Tensor:
    """Causal logits of one row fed chunk by chunk through the cache, each chunk committed."""
    cache = KVCache(backbone.num_layers, batch_size=1)
    logits = []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        span = slice(start, stop)
        allowed = causal(stop - start, width=cache.width)
        logits.append(backbone(ids[:, span], positions[:, span], allowed, cache=cache))
        cache.commit(torch.ones(1, stop - start, dtype=torch.bool), positions[:, span])
    return torch.cat(logits, dim=1)  # (1, L, V)


def test_cache_prefill_then_steps_equals_one_causal_forward(tiny):
    ids = sequences(1, 30)
    positions = torch.arange(30)[None]
    with torch.no_grad():
        full = tiny(ids, positions, causal(30))  # (1, 30, V)
    # a 10-token prefill, five single tokens, then chunks of 3, 4 and 8
    steps = decode_in_chunks(tiny, ids, positions, [0, 10, 11, 12, 13, 14, 15, 18, 22, 30])
    torch.testing.assert_close(steps, full, rtol=0, atol=ATOL_FLOAT64)


def test_cache_with_permuted_positions_equals_one_forward(tiny):
    # SetDLM commits tokens in a sampled order; RoPE must use their true positions
    order = torch.randperm(24, generator=torch.Generator().manual_seed(3))[None]  # (1, 24)
    ids = sequences(1, 24, seed=1)[:, order[0]]  # tokens listed in decoding order
    with torch.no_grad():
        full = tiny(ids, order, causal(24))  # causal over the decoding order
    steps = decode_in_chunks(tiny, ids, order, [0, 6, 7, 8, 11, 15, 24])
    torch.testing.assert_close(steps, full, rtol=0, atol=ATOL_FLOAT64)


@torch.no_grad()
def test_permuting_inputs_and_positions_permutes_the_logits(tiny):
    ids = sequences(1, 20, seed=2)
    positions = torch.arange(20)[None]
    order = torch.randperm(20, generator=torch.Generator().manual_seed(4))
    logits = tiny(ids, positions, None)  # None: every query attends to every key
    permuted = tiny(ids[:, order], positions[:, order], None)
    torch.testing.assert_close(permuted, logits[:, order], rtol=0, atol=ATOL_FLOAT64)


@torch.no_grad()
def test_ragged_cache_rows_equal_each_row_alone(tiny):
    ids = sequences(2, 20, seed=5)
    positions = torch.arange(20)[None].expand(2, -1)
    cache = KVCache(tiny.num_layers, batch_size=2)
    tiny(ids[:, :12], positions[:, :12], causal(12, batch=2), cache=cache)
    keep = torch.arange(12)[None] < torch.tensor([[7], [12]])  # row 0 keeps 7, row 1 all 12
    cache.commit(keep, positions[:, :12])
    starts = [7, 12]
    for step in (3, 2):  # two forwards over the ragged cache, each fully committed
        rows = torch.arange(2)[:, None]
        span = torch.tensor(starts)[:, None] + torch.arange(step)  # (2, step) next positions
        allowed = causal(step, width=cache.width, batch=2).clone()
        allowed[:, :, : cache.width] &= cache.key_valid()[:, None, :]  # hide stale slots
        logits = tiny(ids[rows, span], positions[rows, span], allowed, cache=cache)
        cache.commit(torch.ones(2, step, dtype=torch.bool), positions[rows, span])
        for row, start in enumerate(starts):
            stop = start + step
            alone = tiny(ids[row : row + 1, :stop], positions[:1, :stop], causal(stop))
            torch.testing.assert_close(logits[row], alone[0, start:], rtol=0, atol=ATOL_FLOAT64)
        starts = [start + step for start in starts]
