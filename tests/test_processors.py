"""Vectorized logits processors and stopping rules against their definitions."""

from __future__ import annotations

import torch
from transformers.generation import ExponentialDecayLengthPenalty, RepetitionPenaltyLogitsProcessor

from setdlm.core.decoding import DecodeConfig, processors
from setdlm.core.decoding.sampling import (
    nucleus_filter,
    select_by_confidence,
    tokens_per_step,
)
from setdlm.core.decoding.stopping import StopRule
from setdlm.data.tokenizers import load_tokenizer


def test_repetition_penalty_equals_transformers_row_by_row():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 10, generator=generator)
    seen_tokens = [[1, 4, 4, 7], [0, 9]]
    seen = processors.token_presence(seen_tokens, 10, "cpu")
    ours = processors.repetition_penalty(logits, seen, 1.3)
    reference = RepetitionPenaltyLogitsProcessor(1.3)
    for b, tokens in enumerate(seen_tokens):
        for d in range(3):
            expected = reference(torch.tensor([tokens]), logits[b, d][None].clone())[0]
            assert torch.allclose(ours[b, d], expected)


def test_repetition_penalty_of_the_seen_columns_only_has_the_bits_of_every_column():
    """The penalty computes only the columns some row has seen; the decoded tokens depend on
    its bits, so they must equal the formula applied to the whole vocabulary (GPT-2's size, rows
    with different seen sets, logits of both signs, zeros and -inf; float32 and bfloat16)."""
    generator = torch.Generator().manual_seed(2)
    vocab = 50257
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(3, 5, vocab, generator=generator) * 4).to(dtype)
        logits[0, 0, :7] = 0.0
        logits[1, 2, 100:110] = float("-inf")
        rows = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (300, 0, 40)]
        rows[0] += list(range(7)) + list(range(100, 110))
        seen = processors.token_presence(rows, vocab, "cpu")
        penalized = torch.where(logits < 0, logits * 1.2, logits / 1.2)
        whole = torch.where(seen[:, None, :], penalized, logits)
        ours = processors.repetition_penalty(logits, seen, 1.2)
        assert ours.dtype == dtype and ours.shape == logits.shape
        assert torch.equal(
            ours.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
            whole.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
        )
        assert not torch.equal(ours, logits)  # it did penalize


def test_length_penalty_equals_transformers_for_each_prefix_length():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 10, generator=generator)
    before = torch.tensor([[0, 3, 5, 8]])
    ours = processors.exponential_length_penalty(logits, before, 3, 1.1, (2,))
    prompt_length = 5
    reference = ExponentialDecayLengthPenalty((3, 1.1), 2, prompt_length)
    for d, count in enumerate(before[0].tolist()):
        ids = torch.zeros(1, prompt_length + count, dtype=torch.long)
        expected = reference(ids, logits[0, d][None].clone())[0]
        assert torch.allclose(ours[0, d], expected)


def test_nucleus_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.allclose(nucleus_filter(probs, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.equal(nucleus_filter(probs, 1.0), probs)


def test_confidence_rule_takes_top_k_plus_everything_above_threshold():
    confidence = [0.2, 0.9, 0.5, 0.7]
    assert select_by_confidence(confidence, None, 1, 1e6) == [1]
    assert select_by_confidence(confidence, None, 2, 1e6) == [1, 3]
    assert select_by_confidence(confidence, None, 1, 0.5) == [1, 2, 3]


def test_linear_schedule_of_commits():
    assert tokens_per_step(24, None) == [1] * 24
    assert tokens_per_step(24, 32) == [1] * 24
    assert tokens_per_step(8, 4) == [2, 2, 2, 2]
    assert sum(tokens_per_step(10, 3)) == 10


def test_stop_rules_find_the_earliest_stop(data_dir):
    tokenizer = load_tokenizer(data_dir / "tokenizers" / "gpt2")
    ids = tokenizer.encode("The answer is \\boxed{42}. More text")
    config = DecodeConfig(stop_regexes=(r"\\boxed\{.*?\}",))
    rule = StopRule(config, tokenizer)
    end = rule.stop_point(ids, 0)
    assert "\\boxed{42}" in tokenizer.decode(ids[:end])
    assert "\\boxed{42}" not in tokenizer.decode(ids[: end - 1])
    eos = StopRule(DecodeConfig(eos_token_ids=(ids[3],)))
    assert eos.stop_point(ids, 0) == 4
    assert eos.stop_point(ids[:3], 0) is None
    repeats = StopRule(DecodeConfig(stop_repeated_tokens=3))
    assert repeats.stop_point([5, 6, 6, 6, 7], 0) == 4
