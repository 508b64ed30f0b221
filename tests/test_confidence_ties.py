"""The official confidence rule where confidences saturate: exp(x - logsumexp x) in the
logits' dtype, ties kept toward the later position, τ tested on its own."""

from __future__ import annotations

import torch

from setdlm.core.decoding import engine
from setdlm.core.decoding.sampling import probabilities, select_by_confidence
from setdlm.parity import run_parity


def test_log_sum_exp_confidence_saturates_to_exactly_one_where_softmax_does_not():
    logits = torch.tensor([[[14.6, 0.0, -3.0]]])
    ours = probabilities(logits.clone(), mask_token_id=2)
    assert ours[0, 0, 0].item() == 1.0
    assert torch.softmax(logits, dim=-1)[0, 0, 0].item() < 1.0
    assert ours[0, 0, 2].item() == 0.0  # the mask token is never a prediction
    bf16 = probabilities(logits.to(torch.bfloat16), mask_token_id=None)
    assert bf16.dtype == torch.bfloat16  # computed in the logits' own dtype


def test_an_exact_tie_keeps_the_later_position():
    confidence = torch.tensor([1.0, 0.25, 1.0, 1.0, 0.5])
    assert select_by_confidence(confidence, None, 1, 1e6) == [3]
    assert select_by_confidence(confidence, None, 2, 1e6) == [2, 3]
    decoded = torch.tensor([False, False, False, True, False])  # the last 1.0 is decoded
    assert select_by_confidence(confidence, decoded, 1, 1e6) == [2]
    # τ is tested on its own, after the ranking: everything at or above it commits
    assert select_by_confidence(confidence, None, 1, 0.5) == [0, 2, 3, 4]
    # a quota beyond what is left commits the whole row, never a decoded entry
    assert select_by_confidence(confidence, decoded, 9, 1e6) == [0, 1, 2, 4]


def test_later_position_rule_on_random_tied_rows_up_to_sixteen():
    """Rows as long as the fixtures' (at most 16 values on CPU) follow the plain rule: rank by
    confidence, then by position, and keep the k from the top."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        length = int(torch.randint(1, 17, (1,), generator=generator))
        values = torch.randint(0, 3, (length,), generator=generator).float() / 2
        decoded = torch.rand(length, generator=generator) < 0.3
        k = int(torch.randint(1, length + 1, (1,), generator=generator))
        open_entries = [i for i in range(length) if not decoded[i]]
        by_rule = sorted(open_entries, key=lambda i: (float(values[i]), i))[-k:] if k else []
        assert select_by_confidence(values, decoded, k, 1e6) == sorted(by_rule)


def test_threshold_is_compared_in_the_confidence_dtype():
    # 0.9 rounds to bf16's 0.8984375, so a bf16 confidence of 0.8984375 passes τ = 0.9
    confidence = torch.tensor([0.8984375, 0.5], dtype=torch.bfloat16)
    assert select_by_confidence(confidence, None, 1, 0.9) == [0]
    assert select_by_confidence(confidence.float(), None, 1, 0.9) == [0]  # k = 1 anyway
    assert select_by_confidence(confidence.float(), None, 1, 0.89999) == [0]
    assert select_by_confidence(torch.tensor([0.8984375, 0.8984375]), None, 1, 0.9) == [1]


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

    def earlier_wins(confidence, decoded, k, threshold):
        flipped = original(
            confidence.flip(0), None if decoded is None else decoded.flip(0), k, threshold
        )
        return sorted(len(confidence) - 1 - i for i in flipped)

    with monkeypatch.context() as patch:
        patch.setattr(engine, "select_by_confidence", earlier_wins)
        assert _failing_generations(saturated_parity_dir)
