"""Continuous batching: every row decodes exactly as it does alone, whatever the pool size and
the order in which prompts arrive, while the pool keeps its slots busy."""

from __future__ import annotations

import pytest
from model_factory import BACKBONES, FAMILIES, MASK, decode_config, prompts, tiny_model

from setdlm.core.decoding import DecodeConfig

# Very different prompt lengths (2 to 17 of the model's 32 positions), so that rows of one
# forward mix a long prefill with short decoding steps.
LENGTHS = (2, 17, 5, 11, 3, 9, 14)


def _config(family: str, **changes) -> DecodeConfig:
    values = {"max_new_tokens": 12, "confidence_threshold": 0.15, "stop_repeated_tokens": 2}
    if family == "mdlm":
        values["block_size"] = 8
    values.update(changes)
    return decode_config(family, **values)


def _same_as_alone(model, batch, config, seeds, pooled):
    for i, prompt in enumerate(batch):
        alone = model.generate([prompt], config, seeds=[seeds[i]])
        where = f"prompt {i} of {len(batch)}"
        assert pooled.output_ids[i] == alone.output_ids[0], where
        # Same tokens; a padded batch's matmuls round differently, confidences agree closely.
        assert pooled.new_token_confidences[i] == pytest.approx(
            alone.new_token_confidences[0], rel=1e-4, abs=1e-6
        ), where
        assert pooled.row_forwards[i] == alone.nfe, where
        assert pooled.row_steps[i] == alone.row_steps[0], where
        assert pooled.row_positions[i] == alone.row_positions[0], where
        assert pooled.stopped[i] == alone.stopped[0], where


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_row_of_a_pool_decodes_as_it_does_alone(family, backbone, do_sample):
    model = tiny_model(family, backbone)
    batch = prompts(len(LENGTHS), lengths=LENGTHS)
    seeds = [21 + i for i in range(len(batch))]
    config = _config(family, do_sample=do_sample, top_p=0.9)
    heard = []
    pooled = model.generate(
        batch, config, seeds=seeds, batch_size=3, on_finished=lambda i, out: heard.append(i)
    )
    _same_as_alone(model, batch, config, seeds, pooled)
    assert sorted(heard) == list(range(len(batch)))  # each row heard once, as it finished
    # Seven rows through three slots: the first three fill the pool, so one of them finishes
    # first, and the other four took freed slots; forwards are shared between rows.
    assert heard[0] in (0, 1, 2)
    assert pooled.nfe < sum(pooled.row_forwards)
    # the shares run from the call's start to the last row's finish: nearly all of the call
    assert 0.5 * pooled.wall_seconds < sum(pooled.row_share_seconds) <= pooled.wall_seconds


@pytest.mark.parametrize("family", FAMILIES)
def test_results_do_not_depend_on_pool_size_or_arrival_order(family):
    model = tiny_model(family, "qwen3")
    batch = prompts(len(LENGTHS), seed=3, lengths=LENGTHS)
    seeds = [40 + i for i in range(len(batch))]
    config = _config(family, confidence_threshold=0.3)
    reference = model.generate(batch, config, seeds=seeds, batch_size=1)
    order = [4, 0, 6, 2, 5, 1, 3]
    for size in (2, 5, 16):
        shuffled = model.generate(
            [batch[i] for i in order], config, seeds=[seeds[i] for i in order], batch_size=size
        )
        for position, i in enumerate(order):
            assert shuffled.output_ids[position] == reference.output_ids[i], (size, i)
            assert shuffled.row_forwards[position] == reference.row_forwards[i], (size, i)


def test_infilling_rows_share_a_pool_with_continuation_rows():
    model = tiny_model("setdlm", "qwen3")
    batch = prompts(5, seed=5, lengths=LENGTHS)
    batch[1] = batch[1][:6] + [MASK] * 4 + batch[1][6:]  # a masked span between two contexts
    batch[3] = batch[3][:4] + [MASK] * 3 + batch[3][4:]
    seeds = [7, 8, 9, 10, 11]
    config = _config("setdlm")
    pooled = model.generate(batch, config, seeds=seeds, batch_size=2)
    _same_as_alone(model, batch, config, seeds, pooled)
    assert MASK not in pooled.output_ids[1] and MASK not in pooled.output_ids[3]


def test_a_pool_needs_prompts_and_slots():
    model = tiny_model("ar")
    with pytest.raises(ValueError, match="at least one prompt"):
        model.generate([], _config("ar"), batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        model.generate(prompts(2), _config("ar"), batch_size=0)
    with pytest.raises(ValueError, match="needs continuous batching"):
        model.generate(prompts(2), _config("ar"), on_finished=print)


# Per prompt: where its emulated EOS stands (None: none; 20 is past the budget of 12).
STOPS = (3, None, 12, 1, 7, 20, 5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stop_length_ends_a_row_where_an_eos_would(family):
    """``stop_after`` (the batching benchmark's stand-in for a trained model's EOS) cuts each
    row's own decode at its length, in a static batch and in a pool alike."""
    model = tiny_model(family, "qwen3")
    batch = prompts(len(LENGTHS), seed=9, lengths=LENGTHS)
    config = _config(family, stop_repeated_tokens=0)  # no other stop: every row runs to 12
    full = model.generate(batch, config)
    assert full.num_generated == [12] * len(batch)
    static = model.generate(batch, config, stop_after=list(STOPS))
    pooled = model.generate(batch, config, stop_after=list(STOPS), batch_size=3)
    for i, stop in enumerate(STOPS):
        kept = 12 if stop is None else min(stop, 12)
        # the stop only ends the row: the tokens before it are those of the uncut decode
        assert static.new_token_ids[i] == full.new_token_ids[i][:kept], i
        assert static.stopped[i] == (stop is not None and stop <= 12), i
        assert static.row_forwards[i] <= full.row_forwards[i], i
        assert pooled.new_token_ids[i] == static.new_token_ids[i], i
        assert pooled.row_forwards[i] == static.row_forwards[i], i
    assert static.row_forwards[3] < full.row_forwards[3]  # one token of 12: far fewer forwards


def test_stop_lengths_are_checked_against_the_prompts():
    model = tiny_model("ar")
    with pytest.raises(ValueError, match="2 lengths for 3 prompts"):
        model.generate(prompts(3), _config("ar"), stop_after=[4, 5])
    with pytest.raises(ValueError, match=r"stop_after\[1\] must be a whole number >= 1"):
        model.generate(prompts(2), _config("ar"), stop_after=[4, 0], batch_size=2)
