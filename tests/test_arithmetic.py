"""The synthetic arithmetic task: seeded, disjoint train/test, correct worked solutions, scored
by the GSM8K extraction unchanged."""

from __future__ import annotations

import re

import pytest

from setdlm.eval import arithmetic, gsm8k

STEP = re.compile(r"^(\d+) ([+\-*]) (\d+) = (\d+)$")


def test_the_same_seed_gives_the_same_problems_and_another_seed_others():
    first, again = arithmetic.generate("train", 50, seed=0), arithmetic.generate("train", 50, 0)
    assert first == again
    assert arithmetic.generate("train", 20, seed=0) == first[:20]  # a prefix, whatever the count
    other = arithmetic.generate("train", 50, seed=1)
    assert len({p.question for p in first} & {p.question for p in other}) < 5


def test_train_and_test_are_disjoint_and_free_of_repeats():
    train, test = arithmetic.generate("train", 3000, 0), arithmetic.generate("test", 300, 0)
    arithmetic.check_disjoint(train, test)
    assert len({p.question for p in train}) == 3000 and len({p.question for p in test}) == 300
    with pytest.raises(ValueError, match="in both train and test"):
        arithmetic.check_disjoint(train, train[:1])


def test_every_worked_solution_is_correct_and_reads_as_gsm8k():
    for problem in arithmetic.generate("test", 300, seed=3):
        *steps, final = problem.answer.split("\n")
        assert 2 <= len(steps) <= 3 and final.startswith("#### ")
        value = None
        for line in steps:
            left, symbol, amount, result = STEP.match(line).groups()
            assert value is None or int(left) == value  # each step starts where the last ended
            assert int(amount) < 100
            expected = {"+": int(left) + int(amount), "-": int(left) - int(amount)}.get(
                symbol, int(left) * int(amount)
            )
            assert int(result) == expected and 0 < expected < 200
            value = expected
        assert gsm8k.reference_answer(problem.answer).strip() == str(value)
        assert problem.question.endswith("have now?")


def test_the_gsm8k_extraction_scores_it_unchanged():
    problem = arithmetic.generate("test", 1, seed=0)[0]
    right = gsm8k.score_output(problem.answer, problem.answer)
    assert right["strict_match"] == 1.0 and right["flexible_extract"] == 1.0
    wrong = problem.answer.rsplit("#### ", 1)[0] + "#### 100000"
    assert gsm8k.score_output(wrong, problem.answer)["strict_match"] == 0.0


def test_infilling_masks_one_middle_step():
    problem = arithmetic.generate("test", 1, seed=0)[0]
    before, step, after = arithmetic.split_for_infilling(problem)
    assert before + step + after == problem.question + "\n" + problem.answer
    assert (
        STEP.match(step)
        and "####" not in step
        and after.rstrip().split("\n")[-1].startswith("####")
    )
    with pytest.raises(ValueError, match="is not one of its"):
        arithmetic.split_for_infilling(problem, step=5)
    assert arithmetic.identity("test", 300, 0)["generator"] == arithmetic.GENERATOR_VERSION
