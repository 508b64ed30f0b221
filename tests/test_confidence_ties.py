"""The official confidence rule where confidences saturate: exp(x - logsumexp x) in the
logits' dtype, ties kept toward the later position, τ tested on its own."""

from __future__ import annotations

import pytest
import torch

from setdlm.checkpoints.parity import run_parity
from setdlm.core.decoding import engine
from setdlm.core.decoding.sampling import probabilities, select_by_confidence


def test_log_sum_exp_confidence_saturates_to_exactly_one_where_softmax_does_not():
    logits = torch.tensor([[[14.6, 0.0, -3.0]]])
    ours = probabilities(logits.clone(), mask_token_id=2)
    assert ours[0, 0, 0].item() == 1.0
    assert torch.softmax(logits, dim=-1)[0, 0, 0].item() < 1.0
    assert ours[0, 0, 2].item() == 0.0  # the mask token is never a prediction
    bf16 = probabilities(logits.to(torch.bfloat16), mask_token_id=None)
    assert bf16.dtype == torch.bfloat16  # computed in the logits' own dtype


def test_an_exact_tie_keeps_the_later_position():
    confidence = [1.0, 0.25, 1.0, 1.0, 0.5]
    assert select_by_confidence(confidence, None, 1, 1e6) == [3]
    assert select_by_confidence(confidence, None, 2, 1e6) == [2, 3]
    decoded = [False, False, False, True, False]  # the last 1.0 is decoded
    assert select_by_confidence(confidence, decoded, 1, 1e6) == [2]
    # τ is tested on its own, after the ranking: everything at or above it commits
    assert select_by_confidence(confidence, None, 1, 0.5) == [0, 2, 3, 4]
    # a quota beyond what is left commits the whole row, never a decoded entry
    assert select_by_confidence(confidence, decoded, 9, 1e6) == [0, 1, 2, 4]
    # no tie at the boundary: the most confident, whatever the sort
    assert select_by_confidence([0.2, 0.9, 0.9, 0.1], None, 2, 1e6) == [1, 2]


def _official(values: list[float], decoded: list[bool], k: int) -> list[int]:
    """The official selection written out literally: +inf for decoded, torch's default
    ascending argsort of the (1, R) row, keep the last #decoded + k, then drop the decoded."""
    row = torch.tensor(values)
    row[torch.tensor(decoded)] = torch.inf
    noised = row[None].argsort(dim=-1)[0][: -(sum(decoded) + k)]
    return [i for i in range(len(values)) if i not in noised.tolist() and not decoded[i]]


@pytest.mark.parametrize("length", [4, 8, 16, 17, 32, 64])
def test_tied_rows_of_any_length_keep_what_the_official_sort_keeps(length):
    """Up to 16 values, torch's CPU sort is stable, so the later position wins; longer rows
    (MDLM's blocks of 32) order ties as that sort does, and so do we."""
    generator = torch.Generator().manual_seed(length)
    for _ in range(200):
        values = (torch.randint(0, 3, (length,), generator=generator).float() / 2).tolist()
        decoded = (torch.rand(length, generator=generator) < 0.3).tolist()
        open_count = length - sum(decoded)
        if open_count < 2:
            continue
        k = int(torch.randint(1, open_count, (1,), generator=generator))
        ours = select_by_confidence(values, decoded, k, 1e6)
        assert ours == _official(values, decoded, k)
        if length <= 16:  # the plain rule: by confidence, then later position first
            open_entries = [i for i in range(length) if not decoded[i]]
            by_rule = sorted(open_entries, key=lambda i: (values[i], i))[-k:]
            assert ours == sorted(by_rule)


def test_threshold_is_compared_in_the_confidence_dtype():
    # τ = 0.9 is 0.8984375 in bf16 and 0.89999998 in float32, as torch rounds the scalar
    bf16_value = 0.8984375
    two = [0.95, bf16_value]
    assert select_by_confidence(two, None, 1, 0.9, dtype=torch.bfloat16) == [0, 1]
    assert select_by_confidence(two, None, 1, 0.9, dtype=torch.float32) == [0]
    float32_value = torch.tensor(0.9).item()  # 0.8999999761581421 < 0.9 as a Python float
    assert select_by_confidence([0.95, float32_value], None, 1, 0.9) == [0, 1]


def _failing_generations(folder) -> list[str]:
    return [
        f"{c.case} {c.quantity}"
        for c in run_parity(folder)
        if not c.passed and "generate" in c.quantity
    ]


def test_saturated_fixtures_need_both_halves_of_the_rule(saturated_parity_dir, monkeypatch):
    """The saturated set passes, and fails if either half of the rule is undone."""
    assert _failing_generations(saturated_parity_dir) == []

    def softmax_probabilities(logits, mask_token_id):
        logits[..., mask_token_id] = -1e12
        return torch.softmax(logits.float(), dim=-1)

    with monkeypatch.context() as patch:
        patch.setattr(engine, "probabilities", softmax_probabilities)
        assert _failing_generations(saturated_parity_dir)

    original = engine.select_by_confidence

    def earlier_wins(confidence, decoded, k, threshold, **options):
        flipped = original(
            confidence[::-1], None if decoded is None else decoded[::-1], k, threshold, **options
        )
        return sorted(len(confidence) - 1 - i for i in flipped)

    with monkeypatch.context() as patch:
        patch.setattr(engine, "select_by_confidence", earlier_wins)
        assert _failing_generations(saturated_parity_dir)
