"""The shared decoding engine with every family and both backbones."""

from __future__ import annotations

import pytest
from cache_replay import Recomputed
from model_factory import BACKBONES, FAMILIES, decode_config, prompts, tiny_model

from setdlm.core.decoding import DecodeConfig, generate

DIFFUSION = ("mdlm", "bd3lm", "setdlm")


def _config(family: str, **changes) -> DecodeConfig:
    values = {"max_new_tokens": 12, "confidence_threshold": 0.15}
    if family == "mdlm":
        values["block_size"] = 8
    values.update(changes)
    return decode_config(family, **values)


def _variants(family: str) -> list[DecodeConfig]:
    variants = [_config(family), _config(family, confidence_threshold=1e6)]
    if family == "setdlm":
        variants.append(_config(family, fht_cache_order=True))
    if family == "bd3lm":
        variants.append(_config(family, fused_block_cache=False))
    return variants


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decoding_equals_recomputing_without_cache(family, backbone):
    model = tiny_model(family, backbone)
    batch = prompts(3)
    for config in _variants(family):
        replay = Recomputed(model)
        with_cache = generate(replay, batch, config, seeds=[1, 2, 3])
        assert with_cache.nfe > 0
        assert replay.forwards == (0 if family == "mdlm" else with_cache.nfe)  # MDLM: no cache
        assert replay.max_difference <= 1e-5, (config, replay.max_difference)
        without_cache = generate(
            Recomputed(model, use_reference=True), batch, config, seeds=[1, 2, 3]
        )
        assert without_cache.output_ids == with_cache.output_ids


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_decodes_like_each_sequence_alone(family, backbone, do_sample):
    model = tiny_model(family, backbone)
    batch = prompts(4)  # different prompt lengths: a ragged batch
    config = _config(family, do_sample=do_sample, top_p=0.9)
    seeds = [11, 12, 13, 14]
    together = model.generate(batch, config, seeds=seeds)
    for b, prompt in enumerate(batch):
        alone = model.generate([prompt], config, seeds=[seeds[b]])
        assert together.output_ids[b] == alone.output_ids[0]
        assert together.row_forwards[b] == alone.nfe
        assert together.parallelism[b] == alone.parallelism[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_samples(family):
    model = tiny_model(family)
    config = _config(family, do_sample=True)
    first = model.generate(prompts(2), config, seeds=[5, 6])
    again = model.generate(prompts(2), config, seeds=[5, 6])
    other = model.generate(prompts(2), config, seeds=[7, 8])
    assert first.output_ids == again.output_ids
    assert first.output_ids != other.output_ids


@pytest.mark.parametrize("backbone", BACKBONES)
def test_setdlm_without_threshold_commits_one_token_per_forward(backbone):
    model = tiny_model("setdlm", backbone)
    output = model.generate(prompts(1), _config("setdlm", confidence_threshold=1e6))
    assert output.num_generated == [12]
    assert output.row_steps == [12]
    assert output.nfe == 12 + 1  # one prompt prefill, then one forward per token
    assert output.parallelism == [1.0]


def test_bd3lm_fused_block_cache_saves_one_forward_per_cached_block():
    model = tiny_model("bd3lm")
    prompt = [prompts(1, lengths=(8,))[0]]  # 8 = two full blocks of 4: no partial block
    fused = model.generate(prompt, _config("bd3lm", confidence_threshold=1e6))
    separate = model.generate(
        prompt, _config("bd3lm", confidence_threshold=1e6, fused_block_cache=False)
    )
    blocks = 12 // 4
    assert fused.output_ids == separate.output_ids
    assert fused.nfe == 1 + 12  # prompt prefill + one token per forward
    assert separate.nfe - fused.nfe == blocks - 1  # the last block is never cached


@pytest.mark.parametrize("family", DIFFUSION)
def test_a_lower_threshold_decodes_several_tokens_per_forward(family):
    model = tiny_model(family)
    strict = model.generate(prompts(2), _config(family, confidence_threshold=1e6))
    loose = model.generate(prompts(2), _config(family, confidence_threshold=0.05))
    assert all(p == 1.0 for p in strict.parallelism)
    assert all(p > 1.0 for p in loose.parallelism)
    assert loose.nfe < strict.nfe


@pytest.mark.parametrize("family", FAMILIES)
def test_the_token_budget_is_exact_by_default(family):
    model = tiny_model(family)
    output = model.generate(prompts(4), _config(family, max_new_tokens=13))
    assert output.num_generated == [13, 13, 13, 13]


def test_official_block_alignment_can_change_the_number_of_new_tokens():
    model = tiny_model("mdlm")
    prompt = [prompts(1, lengths=(6,))[0]]
    config = _config("mdlm", max_new_tokens=24, block_size=8, official_compat=True)
    # Blocks start at 8 * floor(6 / 8) = 0 and ceil(24 / 8) = 3 of them end at position 24.
    assert model.generate(prompt, config).num_generated == [18]


def _official_block_tokens(prompt: int, budget: int, block: int, canvas: int) -> int:
    """New tokens of the official aligned-block sampler: ceil(budget / block) blocks from
    block * floor(prompt / block), cut at the end of the canvas, minus the prompt."""
    start = block * (prompt // block)
    end = min(start + block * -(-budget // block), canvas)
    return end - prompt


@pytest.mark.parametrize("family", ["mdlm", "bd3lm"])
@pytest.mark.parametrize("prompt_length", [2, 5, 8, 10, 11])
def test_official_blocks_off_the_boundary_decode_what_the_official_decodes(family, prompt_length):
    """MDLM's canvas runs on to the model length (the official pads it with the mask token),
    so a budget ending inside a block is decoded to the block's end: more tokens and forwards
    than the budget; BD3LM's canvas ends with the budget, so it can only get fewer. At τ = 1e6
    every step commits one token, so forwards follow the tokens exactly."""
    model = tiny_model(family)
    block, budget, length = (8 if family == "mdlm" else 4), 10, model.config.length
    prompt = [prompts(1, lengths=(prompt_length,))[0]]
    config = _config(
        family,
        max_new_tokens=budget,
        block_size=block,
        confidence_threshold=1e6,
        official_compat=True,
    )
    output = model.generate(prompt, config)
    canvas = max(prompt_length + budget, length) if family == "mdlm" else prompt_length + budget
    expected = _official_block_tokens(prompt_length, budget, block, canvas)
    assert output.num_generated == [expected] == [len(output.new_token_ids[0])]
    # BD3LM: one forward caches the whole-block prompt part (when there is one); its finished
    # blocks enter the cache inside the next block's first forward
    prompt_cache = family == "bd3lm" and prompt_length >= block
    assert output.nfe == expected + prompt_cache
    if family == "mdlm" and prompt_length in (2, 10):
        assert expected == 14 > budget  # e.g. 10 + 10 tokens: blocks [8, 24)
    if family == "bd3lm" and prompt_length == 11:
        assert expected == 9 < budget  # blocks [8, 20)
    assert model.generate(prompt, config.replace(official_compat=False)).num_generated == [budget]


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_stops_exactly_at_eos(family):
    model = tiny_model(family)
    batch = prompts(2)
    free = model.generate(batch, _config(family))
    stop_token = free.new_token_ids[0][3]
    first = free.new_token_ids[0].index(stop_token)
    stopped = model.generate(batch, _config(family, eos_token_ids=(stop_token,)))
    assert stopped.new_token_ids[0] == free.new_token_ids[0][: first + 1]
    assert stopped.num_generated[0] == first + 1
    assert stopped.stopped[0]


@pytest.mark.parametrize("family", ["mdlm", "bd3lm", "setdlm"])
def test_official_stop_cadence_checks_where_the_official_does(family):
    """stop_cadence="official": a stop is acted on only at the official check (MDLM/BD3LM at
    the end of a block, SetDLM after step i with i % W == 0, i > 0), and the row keeps the
    official canvas up to that block or window end, tokens past the stop included."""
    model = tiny_model(family)
    prompt = [prompts(1, lengths=(6,))[0]]
    config = _config(family, max_new_tokens=24, confidence_threshold=1e6)
    free = model.generate(prompt, config)
    stop_token = free.new_token_ids[0][2]
    first = free.new_token_ids[0].index(stop_token)
    exact = model.generate(prompt, config.replace(eos_token_ids=(stop_token,)))
    official = model.generate(
        prompt, config.replace(eos_token_ids=(stop_token,), stop_cadence="official")
    )
    kept = official.num_generated[0]
    assert exact.num_generated == [first + 1] and exact.stopped == [True]
    # the same decoding up to the official check: its tokens are the free run's, in order
    assert official.new_token_ids[0] == free.new_token_ids[0][:kept]
    assert first + 1 <= kept <= 24 and official.nfe >= exact.nfe
    if family == "setdlm":
        window = model.decode_policy(config).window
        steps = official.row_steps[0]
        assert official.stopped == [True] and (steps - 1) % window == 0 and steps > 1
        assert official.nfe == steps + 1  # the prompt-cache forward
    else:
        block = 8 if family == "mdlm" else 4
        assert (6 + kept) % block == 0  # the canvas is cut at a block end


@pytest.mark.parametrize("family", ["mdlm", "bd3lm", "setdlm"])
@pytest.mark.parametrize("fused", [True, False])
def test_fewer_steps_than_tokens_follow_the_linear_schedule(family, fused):
    """num_steps = half the tokens: each sampler step commits 2 at τ = 1e6, counted from the
    first decoding forward (the prompt-cache forward is not a step)."""
    model = tiny_model(family)
    prompt = [prompts(1, lengths=(8,))[0]]
    block = {"mdlm": 8, "bd3lm": 4, "setdlm": None}[family]
    steps = 12 if family == "setdlm" else block // 2  # per generation / per block
    config = _config(
        family,
        max_new_tokens=24,
        confidence_threshold=1e6,
        num_steps=steps,
        block_size=block,
        fused_block_cache=fused if family == "bd3lm" else None,
    )
    output = model.generate(prompt, config)
    assert output.num_generated == [24] and output.parallelism == [2.0]
    assert output.row_steps == [12]
    prefill = family != "mdlm"  # SetDLM caches the prompt; BD3LM its whole blocks [0, 8)
    cache_only = 0 if fused or family != "bd3lm" else 24 // 4 - 1  # finished blocks but the last
    assert output.nfe == 12 + prefill + cache_only
