"""Infilling (masks inside the input) and cache cropping past the model length."""

from __future__ import annotations

import pytest
from cache_replay import Recomputed
from model_factory import BACKBONES, MASK, decode_config, prompts, tiny_model

from setdlm.core.decoding import DecodeConfig, generate
from setdlm.model import SlidingWindowOptions

DIFFUSION = ("mdlm", "bd3lm", "setdlm")


def _infill_inputs():
    left, right = prompts(2, lengths=(7, 5), seed=4)
    return [left + [MASK] * 6 + right[1:], left[:4] + [MASK] * 9 + right]


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("family", DIFFUSION)
def test_infilling_fills_exactly_the_masks_and_keeps_the_context(family, backbone):
    model = tiny_model(family, backbone)
    inputs = _infill_inputs()
    block = 8 if family == "mdlm" else None
    config = decode_config(family, confidence_threshold=0.15, block_size=block)
    replay = Recomputed(model)
    output = generate(replay, inputs, config)
    for source, filled, new in zip(inputs, output.output_ids, output.new_token_ids, strict=True):
        holes = [i for i, t in enumerate(source) if t == MASK]
        assert len(filled) == len(source) and len(new) == len(holes)
        assert [filled[i] for i in holes] == new and MASK not in new
        assert [t for i, t in enumerate(filled) if i not in holes] == [
            t for t in source if t != MASK
        ]
    assert replay.max_difference <= 1e-5  # both contexts cached, exactly
    alone = model.generate(inputs[:1], config)
    assert alone.output_ids[0] == output.output_ids[0]


def test_setdlm_infilling_sees_the_right_context():
    model = tiny_model("setdlm")
    left, right = prompts(2, lengths=(6, 6), seed=5)
    config = DecodeConfig()
    first = model.generate([left + [MASK] * 4 + right[1:]], config).new_token_ids[0]
    changed_right = [(t + 7) % 60 + 3 for t in right[1:]]
    second = model.generate([left + [MASK] * 4 + changed_right], config).new_token_ids[0]
    assert first != second


def test_prefix_only_infilling_never_sees_the_right_context_but_promotes_gaps():
    """infill_cache="prefix" (the official cache_full_infill_context=false, l2r promotion):
    the prompt cache holds the left context only; a visible gap between two masked spans
    enters the cache once decoding passes it; the text after the last span is never seen."""
    model = tiny_model("setdlm")
    left, gap, right = prompts(3, lengths=(6, 4, 6), seed=5)
    config = DecodeConfig(policy=SlidingWindowOptions(infill_cache="prefix"))

    def fill(right_context, gap_tokens=gap[1:]):
        source = left + [MASK] * 4 + gap_tokens + [MASK] * 3 + right_context
        replay = Recomputed(model)
        output = generate(replay, [source], config)
        assert replay.max_difference < 1e-4  # the cache (promotions included) is exact
        return output

    first = fill(right[1:])
    changed_right = [(t + 7) % 60 + 3 for t in right[1:]]
    assert fill(changed_right).new_token_ids == first.new_token_ids  # never seen
    changed_gap = [(t + 11) % 60 + 3 for t in gap[1:]]
    assert fill(right[1:], changed_gap).new_token_ids != first.new_token_ids  # promoted, seen


class _WidthProbe(Recomputed):
    def __init__(self, family):
        super().__init__(family)
        self.widths = []

    def decode_forward(self, input_ids, position_ids, attention_mask, cache, outputs_at=None):
        """Record each row's attended keys: its cached tokens plus its real inputs."""
        inputs = input_ids.shape[1]
        if attention_mask is None:
            real = [inputs] * len(input_ids)
        else:
            real = attention_mask[:, :, cache.width :].any(dim=-1).sum(dim=-1).tolist()
        self.widths += [length + q for length, q in zip(cache.lengths_on_host, real, strict=True)]
        return self.family.decode_forward(
            input_ids, position_ids, attention_mask, cache, outputs_at=outputs_at
        )


@pytest.mark.parametrize(
    "family,fht", [("ar", False), ("bd3lm", False), ("setdlm", False), ("setdlm", True)]
)
def test_the_cache_is_cropped_to_the_model_length(family, fht):
    model = tiny_model(family, length=16)
    probe = _WidthProbe(model)
    fht_knob = fht if family == "setdlm" else None
    config = decode_config(family, max_new_tokens=20, fht_cache_order=fht_knob)
    output = generate(probe, prompts(2, lengths=(9, 12)), config, seeds=[0, 1])
    assert output.num_generated == [20, 20]
    assert max(probe.widths) <= 16
