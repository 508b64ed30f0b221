"""The official confidence rule where confidences saturate: exp(x - logsumexp x) in the
logits' dtype, ties kept toward the later position, τ tested on its own."""

from __future__ import annotations

import math

import pytest
import torch
from tie_rule import earlier_wins

from setdlm.checkpoints.parity import run_parity
from setdlm.core.decoding import engine, sampling
from setdlm.core.decoding.sampling import (
    choose_tokens,
    greedy_tokens,
    probabilities,
    select_by_confidence,
)


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

    with monkeypatch.context() as patch:  # greedy steps take the table at this vocabulary
        patch.setattr(sampling, "probabilities", softmax_probabilities)
        assert _failing_generations(saturated_parity_dir)

    with monkeypatch.context() as patch:
        patch.setattr(engine, "select_by_confidence", earlier_wins(engine.select_by_confidence))
        assert _failing_generations(saturated_parity_dir)


def _bits(t: torch.Tensor) -> list[int]:
    return t.float().contiguous().view(torch.int32).flatten().tolist()


def _table_choice(logits, mask_token_id):
    return choose_tokens(probabilities(logits, mask_token_id), False, None, [])


def _with_rivals(logits: torch.Tensor, ulps: int) -> torch.Tensor:
    """A copy of every row's top logit ``ulps`` floats below it, 3 entries later: equal
    probabilities (the earlier entry wins) or, through exp's rounding, a reversed order."""
    top, where = logits.max(dim=-1)
    rival = top.clone()
    for _ in range(ulps):
        rival = torch.nextafter(rival, torch.tensor(-math.inf))
    rows = logits.view(-1, logits.shape[-1])
    pairs = zip(where.flatten().tolist(), rival.flatten().tolist(), strict=True)
    for r, (i, value) in enumerate(pairs):
        rows[r, (i + 3) % rows.shape[1]] = value
    return logits


@pytest.mark.parametrize("vocab", [7, 120, 2048, 50257])
def test_greedy_top_only_path_is_bit_for_bit_the_probability_table(vocab, monkeypatch):
    """Tokens and confidence bits as the table gives them, on ordinary, saturated (1e3-1e5)
    and near-tied logits, banned (-inf) entries, NaN and the mask token; near ties take the
    table, everything else the top-only path."""
    monkeypatch.setattr(sampling, "TOP_ONLY_MIN_LOGITS", 0)
    generator = torch.Generator().manual_seed(vocab)
    took_table = []
    monkeypatch.setattr(
        sampling, "choose_tokens", lambda *a, **k: took_table.append(1) or choose_tokens(*a, **k)
    )
    for case in range(60):
        logits = torch.randn(1 + case % 3, 1 + case % 7, vocab, generator=generator)
        logits *= (1.0, 5.0, 1e3, 1e5)[case % 4]
        rivals = case % 5 == 0
        if rivals:
            _with_rivals(logits, case % 4)  # 0 ulps: an exact tie of the top
        if case % 6 == 1:
            logits[..., 1] = -math.inf
        if case % 9 == 2:
            logits[0, 0, 0] = math.nan
        mask = vocab - 1 if case % 2 else None
        before = len(took_table)
        tokens, confidence = greedy_tokens(logits.clone(), mask)
        expected_tokens, expected_confidence = _table_choice(logits.clone(), mask)
        assert tokens.tolist() == expected_tokens.tolist(), case
        assert _bits(confidence) == _bits(expected_confidence), case
        if not rivals and case % 9 != 2:  # no rival, no NaN: the table was not needed
            assert len(took_table) == before, case
        elif rivals and case % 4 == 0:  # an exact tie of the top: the table decides
            assert len(took_table) == before + 1, case


def test_greedy_takes_the_table_where_it_is_cheaper_or_ties_are_common():
    generator = torch.Generator().manual_seed(0)
    small = torch.randn(1, 4, 128, generator=generator)
    for logits in (small, small.to(torch.bfloat16)):
        tokens, confidence = greedy_tokens(logits.clone(), None)
        expected_tokens, expected_confidence = _table_choice(logits.clone(), None)
        assert tokens.tolist() == expected_tokens.tolist()
        assert confidence.dtype == logits.dtype
        assert _bits(confidence) == _bits(expected_confidence)


@pytest.mark.parametrize("fixtures", ["parity_dir", "saturated_parity_dir"])
def test_both_fixture_sets_pass_through_the_top_only_path(fixtures, request, monkeypatch):
    """The fixtures' vocabularies are small enough for the table; forced through the top-only
    path, every greedy generation still matches the official one."""
    monkeypatch.setattr(sampling, "TOP_ONLY_MIN_LOGITS", 0)
    calls = []
    top_only = sampling.greedy_tokens

    def counted(logits, mask_token_id):
        calls.append(1)
        return top_only(logits, mask_token_id)

    tables = []
    monkeypatch.setattr(engine, "greedy_tokens", counted)
    monkeypatch.setattr(
        sampling, "choose_tokens", lambda *a, **k: tables.append(1) or choose_tokens(*a, **k)
    )
    assert _failing_generations(request.getfixturevalue(fixtures)) == []
    assert len(tables) < len(calls) / 2, (len(tables), len(calls))  # mostly top-only steps
