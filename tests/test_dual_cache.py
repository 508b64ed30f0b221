"""The dual-cache decoding policy (baselines/dual_cache.py): what it approximates, measured.

Each forward's target logits under the dual cache are compared with the exact forward of the
same decoding state (the canvas as it is at that step): MDLM's bidirectional forward over the
whole canvas, BD3LM's two-stream forward (each block sees the clean blocks before it). A
block's (sub-block's) first forward recomputes the cache, so its logits are exact; the later
steps read keys and values computed before the block's commits, and drift.
"""

from __future__ import annotations

import pytest
import torch
from model_factory import BACKBONES, MASK, decode_config, prompts, tiny_model

from setdlm import families
from setdlm.core import masks
from setdlm.core.decoding import generate

# Random tiny models: τ = 0.3 commits several tokens in some steps, so that blocks both take
# several steps (where the cache goes stale) and finish at different times in a batch.
SETTINGS = {"max_new_tokens": 16, "confidence_threshold": 0.3}
EXACT_ATOL = 1e-4  # float32 rounding of the same forward computed over other inputs


class DriftProbe:
    """Stands in for the family in ``generate`` (one row): records, for every forward that
    predicts, the canvas and targets the policy planned and the logits the backbone gave."""

    def __init__(self, model):
        self.model = model
        self.steps = []  # (canvas, target slots, refreshed the cache, logits (D, V))

    def __getattr__(self, name):
        return getattr(self.model, name)

    def decode_policy(self, config, **runtime):
        policy = self.model.decode_policy(config, **runtime)
        planned = policy.plan

        def plan(row):
            inputs = planned(row)
            if inputs is not None:
                slots = [slot for _, slot in inputs.targets]
                self.steps.append([list(row.tokens), slots, inputs.keep_cached is not None])
            return inputs

        policy.plan = plan
        return policy

    def decode_forward(self, input_ids, position_ids, attention_mask, cache, outputs_at=None):
        logits = self.model.decode_forward(
            input_ids, position_ids, attention_mask, cache, outputs_at=outputs_at
        )
        if outputs_at is not None and outputs_at.shape[1]:  # not the prompt-cache forward
            self.steps[len([s for s in self.steps if len(s) == 4])].append(logits[0].clone())
        return logits


def exact_logits(model, canvas: list[int], slots: list[int]) -> torch.Tensor:
    """(D, V) logits of the target ``slots`` from a forward of the whole decoding state."""
    length = len(canvas)
    ids = torch.tensor(canvas)[None]
    with torch.no_grad():
        size = model.config.block_size
        if size is None:  # MDLM: bidirectional over the canvas
            positions = torch.arange(length)[None]
            logits = model.backbone(ids, positions, None)[0]
            return logits[slots]
        # BD3LM: the clean stream, then the noisy one, padded to whole blocks (the padding
        # is seen by nothing: the canvas ends with the budget)
        padded = -(-length // size) * size
        ids = torch.cat([ids, torch.full((1, padded - length), MASK)], dim=1)
        inputs = torch.cat([ids, ids], dim=1)
        positions = torch.arange(padded).repeat(2)[None]
        visible = masks.two_stream_mask(padded, size) & (positions[0] < length)[None, :]
        logits = model.backbone(inputs, positions, visible[None])[0]
        return logits[[padded + slot for slot in slots]]


def measure(model, config, prompt) -> tuple[list[float], list[float], list[int]]:
    """Max |logit drift| of the refreshing forwards and of the later ones, and the tokens."""
    probe = DriftProbe(model)
    output = generate(probe, [prompt], config)
    refreshed, later = [], []
    for canvas, slots, refresh, logits in probe.steps:
        drift = (logits - exact_logits(model, canvas, slots)).abs().max().item()
        (refreshed if refresh else later).append(drift)
    return refreshed, later, output.new_token_ids[0]


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("family", ["mdlm", "bd3lm"])
def test_the_dual_cache_is_exact_where_it_refreshes_and_drifts_after(
    family, backbone, record_property
):
    model = tiny_model(family, backbone)
    block = 8 if family == "mdlm" else None  # BD3LM: blocks of S = 4, sub-blocks of 2
    config = decode_config(family, policy="dual-cache", block_size=block, **SETTINGS)
    exact_config = decode_config(family, block_size=block, **SETTINGS)
    drifts = []
    for prompt in prompts(4, seed=3):
        refreshed, later, _ = measure(model, config, prompt)
        assert refreshed and max(refreshed) <= EXACT_ATOL  # the first forward of each block
        drifts += later
        # the exact policy's own forwards are the reference's: no drift at all
        exact_refreshed, exact_later, _ = measure(model, exact_config, prompt)
        assert max(exact_refreshed + exact_later, default=0.0) <= EXACT_ATOL
    assert drifts and max(drifts) > 10 * EXACT_ATOL  # the approximation is real
    scale = torch.cat([p.flatten() for p in model.backbone.parameters()]).abs().max().item()
    record_property("max_logit_drift", max(drifts))
    record_property("mean_logit_drift", sum(drifts) / len(drifts))
    print(
        f"{family}/{backbone}: logit drift of the cached steps, max {max(drifts):.4f}, mean "
        f"{sum(drifts) / len(drifts):.4f} over {len(drifts)} forwards (weights up to {scale:.2f})"
    )


@pytest.mark.parametrize("backbone", BACKBONES)
def test_nothing_is_approximated_when_the_block_is_the_whole_unit(backbone):
    """MDLM with one block over the whole canvas caches nothing; BD3LM with one sub-block per
    block caches finished blocks only, exactly: every forward's logits are the exact ones."""
    whole_canvas = {"max_new_tokens": 24, "confidence_threshold": 0.3}  # 8 + 24 = length 32
    for family, knobs in (("mdlm", {}), ("bd3lm", {"sub_block_size": 4})):
        model = tiny_model(family, backbone)
        config = decode_config(family, policy="dual-cache", **knobs, **whole_canvas)
        for prompt in prompts(3, seed=1, lengths=(8,)):
            refreshed, later, _ = measure(model, config, prompt)
            assert later and max(refreshed + later) <= EXACT_ATOL


@pytest.mark.parametrize("family", ["mdlm", "bd3lm"])
def test_a_step_feeds_the_block_not_the_canvas(family):
    """What the approximation buys: positions fed per token (MDLM: the block instead of the
    model-length canvas; BD3LM: the sub-block instead of the block and the pending one)."""
    model = tiny_model(family)
    block = 8 if family == "mdlm" else None
    batch = prompts(3, seed=2)
    config = decode_config(family, block_size=block, **SETTINGS)
    exact = model.generate(batch, config)
    dual = model.generate(
        batch, decode_config(family, policy="dual-cache", block_size=block, **SETTINGS)
    )
    assert sum(dual.row_positions) < sum(exact.row_positions)
    assert dual.num_generated == exact.num_generated == [16, 16, 16]


@pytest.mark.parametrize("family", ["mdlm", "bd3lm"])
def test_a_pool_gives_every_row_its_tokens_alone(family):
    """Continuous batching with the dual cache: each row's cache is refreshed on its own."""
    model = tiny_model(family, "qwen3")
    block = 8 if family == "mdlm" else None
    config = decode_config(family, policy="dual-cache", block_size=block, **SETTINGS)
    batch = prompts(5, seed=4, lengths=(2, 9, 4, 13, 6))
    alone = [model.generate([p], config).new_token_ids[0] for p in batch]
    pooled = model.generate(batch, config, batch_size=2)
    assert pooled.new_token_ids == alone


@pytest.mark.parametrize("family", ["mdlm", "bd3lm"])
def test_infilling_fills_the_masks_and_keeps_the_context(family):
    model = tiny_model(family)
    left, right = prompts(2, seed=6, lengths=(7, 6))
    source = left + [MASK] * 5 + right[1:]
    config = decode_config(family, policy="dual-cache", confidence_threshold=0.3)
    output = model.generate([source], config)
    assert len(output.new_token_ids[0]) == 5 and MASK not in output.output_ids[0]
    assert output.output_ids[0][: len(left)] == left
    assert output.output_ids[0][len(left) + 5 :] == right[1:]


def test_the_table_flags_the_cache_as_approximate_and_names_its_knobs():
    for name in ("mdlm", "bd3lm"):
        policy = families.family(name).policy("dual-cache")
        assert not policy.exact_cache
        assert "block_size" in policy.knobs
    assert "sub_block_size" in families.family("bd3lm").policy("dual-cache").knobs
    with pytest.raises(families.UnknownNameError, match="dual-cache decodes MDLM and BD3LM"):
        families.family("setdlm").policy("dual-cache")
