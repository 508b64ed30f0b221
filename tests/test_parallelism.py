"""The official parallelism factor and tokens per forward, fixed on hand-made decodes: rows whose
every step is written out, so both numbers can be counted by hand (issue 49)."""

from __future__ import annotations

import pytest
from model_factory import decode_config, prompts, tiny_model

from setdlm.core.decoding.engine import RowState, RowTiming, collect
from setdlm.core.decoding.parallelism import end_ids, parallelism_factor, tokens_per_forward
from setdlm.eval.timing import decoding_fields, summarize_speed

MASK, EOS, PAD = 3, 1, 2
A, B, C, D = 10, 11, 12, 13  # text tokens


def _decoded(committed_per_step: list[list[int]], prefill: bool, stop_at: int | None) -> RowState:
    """A row of prompt [5, 6] and six generated slots, decoded by hand: each step commits the
    listed tokens into the next free slots, left to right; ``prefill``: one more forward that
    only caches the prompt; ``stop_at``: the generated length kept after a stop."""
    tokens = [5, 6] + [MASK] * 6
    row = RowState(0, tokens, list(range(8)), list(range(2, 8)), 2, False, None)
    slot = 2
    for step in committed_per_step:
        for token in step:
            row.tokens[slot] = token
            row.confidence[slot] = 0.9
            slot += 1
        row.committed += len(step)
        row.steps += 1
        row.forwards += 1
    row.forwards += prefill
    row.stop_at = stop_at
    return row


def _output(row: RowState):
    timing = RowTiming(latency=[0.5], share=[0.5])
    return collect([row], MASK, timing, row.forwards, 0.1, 0.5, end_ids((EOS,), EOS, PAD))


def test_a_setdlm_like_decode_commits_its_eos_with_text_and_fills_past_it():
    """Prefill, then [A B C], then [D EOS PAD]: the stop keeps A B C D EOS. The factor counts
    every commit over the 2 steps (6 / 2 = 3, EOS and the slot past it included); tokens per
    forward counts the 4 text tokens over the 3 forwards."""
    row = _decoded([[A, B, C], [D, EOS, PAD]], prefill=True, stop_at=5)
    output = _output(row)
    assert output.new_token_ids == [[A, B, C, D, EOS]]
    assert output.num_generated == [5] and output.num_content == [4]
    assert output.parallelism == [3.0]
    fields = decoding_fields(output, 0, 1, call_seconds=0.5)
    assert fields["content_tokens"] == 4 and fields["nfe"] == 3
    assert tokens_per_forward(fields["content_tokens"], fields["nfe"]) == pytest.approx(4 / 3)


def test_an_ar_like_decode_has_factor_one_and_fewer_tokens_per_forward():
    """One token per forward, the first from the prompt's forward (no separate prefill): the
    factor is 1 whatever is committed; the EOS is a forward that bought no text."""
    row = _decoded([[A], [B], [C], [EOS]], prefill=False, stop_at=4)
    output = _output(row)
    assert output.parallelism == [1.0] and output.num_content == [3]
    assert tokens_per_forward(output.num_content[0], output.row_forwards[0]) == 0.75


def _fields(row: RowState) -> dict:
    return decoding_fields(_output(row), 0, 1, call_seconds=0.5)


def test_the_summary_gives_both_means_over_the_counted_examples():
    setdlm = _fields(_decoded([[A, B, C], [D, EOS, PAD]], True, 5))
    ar = _fields(_decoded([[A], [B], [C], [EOS]], False, 4))
    warm = dict(ar, warmup=True, parallelism=9.0, content_tokens=0)
    speed = summarize_speed([warm, setdlm, ar])
    assert speed["parallelism_mean"] == pytest.approx((3.0 + 1.0) / 2)
    assert speed["tokens_per_forward_mean"] == pytest.approx((4 / 3 + 3 / 4) / 2)
    # records written before content_tokens: no tokens per forward rather than a wrong one
    old = {k: v for k, v in setdlm.items() if k != "content_tokens"}
    assert "tokens_per_forward_mean" not in summarize_speed([old, ar])


def test_the_official_factor_is_the_mean_of_the_tokens_each_step_committed():
    assert parallelism_factor(7, 2) == 3.5 and parallelism_factor(0, 0) == 0.0
    assert end_ids((151645,), 151643, 151643) == {151643, 151645}
    assert end_ids((), 1, None) == {1}


def test_a_real_decode_reports_the_factor_of_its_own_steps(monkeypatch):
    """The engine's factor against the commits the policy saw after every forward."""
    model = tiny_model("setdlm")
    config = decode_config("setdlm", max_new_tokens=12, confidence_threshold=0.05)
    counts = []
    policy_class = type(model.decode_policy(config))
    observe = policy_class.observe

    def counting(self, row, committed):
        counts.append(len(committed))
        return observe(self, row, committed)

    monkeypatch.setattr(policy_class, "observe", counting)
    output = model.generate(prompts(1), config)
    steps = [count for count in counts if count]  # the prompt's forward commits nothing
    assert output.parallelism == [pytest.approx(sum(steps) / len(steps))]
    assert output.row_forwards[0] == len(counts) and sum(steps) >= output.num_generated[0]
