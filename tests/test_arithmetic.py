"""The synthetic arithmetic task: seeded, disjoint train/test, correct worked solutions, scored
by the GSM8K extraction unchanged."""

from __future__ import annotations

import re

import pytest

from setdlm.tasks import arithmetic, gsm8k

STEP = re.compile(r"^(\d+) ([+\-*]) (\d+) = (\d+)$")


def test_the_same_seed_gives_the_same_problems_and_another_seed_others():
    first, again = arithmetic.generate("train", 50, seed=0), arithmetic.generate("train", 50, 0)
    assert first == again
    assert arithmetic.generate("train", 20, seed=0) == first[:20]  # a prefix, whatever the count
    other = arithmetic.generate("train", 50, seed=1)
    assert len({p.question for p in first} & {p.question for p in other}) < 5


def test_train_and_test_are_disjoint_whatever_the_counts_and_seeds():
    # the default run's sizes: 20,000 training problems, 300 test problems, other seeds
    train, test = arithmetic.generate("train", 20000, 0), arithmetic.generate("test", 300, 7)
    arithmetic.check_disjoint(train, test)
    assert len({p.question for p in train}) == 20000 and len({p.question for p in test}) == 300
    assert {arithmetic.split_of(p.question) for p in train} == {"train"}
    assert {arithmetic.split_of(p.question) for p in test} == {"test"}
    with pytest.raises(ValueError, match="in both train and test"):
        arithmetic.check_disjoint(train, train[:1])


def test_test_problems_leave_out_near_duplicates_of_the_training_problems():
    """Disjoint questions are not enough: a test problem whose worked solution a training
    problem has, or whose question is a training question told of other people, is answered
    from memory. Against a model's training problems those are left out, the others keep their
    problems and ids, and more are drawn to keep the count."""
    training = {"generator": "arithmetic-2", "split": "train", "count": 3000, "seed": 0}
    learned = arithmetic.generate("train", 3000, 0, "arithmetic-2")
    solutions = {p.answer for p in learned}
    questions = {arithmetic.without_names(p.question) for p in learned}
    plain = arithmetic.generate("test", 100, 0, "arithmetic-2")
    held_out = arithmetic.generate("test", 100, 0, "arithmetic-2", excluding=training)
    assert len(held_out) == 100 and len({p.id for p in held_out}) == 100
    assert not any(p.answer in solutions for p in held_out)
    assert not any(arithmetic.without_names(p.question) in questions for p in held_out)
    near = [
        p
        for p in plain
        if p.answer in solutions or arithmetic.without_names(p.question) in questions
    ]
    assert near and [p for p in plain if p not in near] == held_out[: 100 - len(near)]
    found = arithmetic.near_duplicates(100, 0, "arithmetic-2", training)
    assert found["dropped"] == len(near) and found["kept_of_first"] == 100 - len(near)
    assert found["dropped_solution"] == sum(p.answer in solutions for p in plain)
    assert found["drawn"] == 1 + int(held_out[-1].id.removeprefix("test-")) > 100
    # the names alone: the same story told of Ada and Ben reads as the one of Cleo and Dev
    story = "Ada has 5 eggs. Ada gives 2 eggs to Ben. How many eggs does Ada have?"
    other = story.replace("Ada", "Cleo").replace("Ben", "Dev")
    assert arithmetic.without_names(story) == arithmetic.without_names(other)
    assert "excluding" in arithmetic.identity("test", 100, 0, "arithmetic-2", training)
    assert "excluding" not in arithmetic.identity("test", 100, 0, "arithmetic-2")
    with pytest.raises(ValueError, match="lacks count"):
        arithmetic.generate("test", 5, 0, "arithmetic-2", {"generator": "arithmetic-2", "seed": 0})


def test_the_defaults_solve_budget_is_the_longest_held_out_solution():
    """tiny.yaml's arithmetic-solve budget against its 300 test problems as the evaluation
    draws them for the committed models (near-duplicates of their training problems left out),
    under their tokenizer: the longest solution with its EOS, no more, no less."""
    from pathlib import Path

    import yaml
    from transformers import AutoTokenizer

    from setdlm.tasks.arithmetic_task import training_problems

    repo = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((repo / "workflows/config/tiny.yaml").read_text())
    solve = config["tasks"]["arithmetic-solve"]
    model = repo / "results/reference/models/setdlm-smax8-arith/seed-0"
    tokenizer = AutoTokenizer.from_pretrained(model)
    problems = arithmetic.generate(
        "test", solve["limit"], 0, solve["generator"], training_problems(str(model))
    )
    needed = [
        len(tokenizer.encode(p.text, add_special_tokens=False))
        - len(tokenizer.encode(p.question + "\n", add_special_tokens=False))
        + 1
        for p in problems
    ]
    assert max(needed) == solve["max_new_tokens"]


def test_every_worked_solution_is_correct_and_reads_as_gsm8k():
    for problem in arithmetic.generate("test", 300, seed=3):
        *steps, final = problem.answer.split("\n")
        assert 2 <= len(steps) <= 3 and final.startswith("#### ")
        value = None
        for line in steps:
            left, symbol, amount, result = STEP.match(line).groups()
            assert value is None or int(left) == value  # each step starts where the last ended
            assert int(amount) <= 9 and (symbol != "*" or amount == "2")  # one-digit amounts
            expected = {"+": int(left) + int(amount), "-": int(left) - int(amount)}.get(
                symbol, int(left) * int(amount)
            )
            assert int(result) == expected and 1 <= expected <= arithmetic.MAX_VALUE
            value = expected
        assert gsm8k.reference_answer(problem.answer).strip() == str(value)
        assert problem.question.endswith("have?")


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


def test_the_task_decodes_solutions_and_scores_infilled_steps(trained_arith_free_model):
    """Examples of both variants on a random-weight model: the prompt is BOS + question + newline
    (solve), the infilling input masks exactly the step's tokens, and the scores read the step."""
    from setdlm.tasks.arithmetic_task import ArithmeticSettings, ArithmeticTask

    model, tokenizer = trained_arith_free_model
    solve = ArithmeticTask(ArithmeticSettings(limit=5))
    infill = ArithmeticTask(ArithmeticSettings(variant="infill", limit=5))
    problem = arithmetic.generate("test", 1, 0)[0]
    example = solve.examples(tokenizer, model)[0]
    assert example.input_ids[0] == model.config.bos_token_id
    assert tokenizer.decode(example.input_ids[1:]) == problem.question + "\n"
    masked = infill.examples(tokenizer, model)[0]
    before, step, after = arithmetic.split_for_infilling(problem)
    masks = masked.input_ids.count(model.config.mask_token_id)
    assert masks == len(tokenizer.encode(step, add_special_tokens=False)) > 0
    assert masked.reference == step
    result = step.rsplit("= ", 1)[1]
    right = {"step_correct": 1.0, "step_exact": 1.0, "result_exact": 1.0}
    assert infill.score(masked, step) == right
    wrong_operand = step.replace(step.split()[0], "99", 1)
    wrong = {"step_correct": 0.0, "step_exact": 0.0, "result_exact": 1.0}
    assert infill.score(masked, wrong_operand) == wrong
    assert infill.score(masked, step[: -len(result)] + "0")["result_exact"] == (result == "0")
    aggregated = solve.aggregate(
        [{"scores": {"strict_match": v, "flexible_extract": v}} for v in (1.0, 0.0, 1.0, 1.0)]
    )
    low, high = aggregated["strict_match"]["bootstrap_95"]
    assert aggregated["strict_match"]["value"] == 0.75 and 0 <= low < 0.75 < high <= 1
    # held out from a training set: other problems, and the definition says how many were left
    training = {"generator": "arithmetic-2", "split": "train", "count": 3000, "seed": 0}
    held = ArithmeticTask(ArithmeticSettings(limit=100, excluding=training))
    assert held.settings()["problems"]["excluding"] == training
    ids = [e.id for e in held.examples(tokenizer, model)]
    assert ids == [p.id for p in arithmetic.generate("test", 100, 0, excluding=training)]
    definition = held.aggregate([{"scores": {"strict_match": 1.0, "flexible_extract": 1.0}}])
    assert (
        "(of the first 100 drawn, 14 were left out: 14 with a training problem's worked "
        in (definition["strict_match"]["definition"])
    )


def test_a_solve_budget_some_solution_does_not_fit_is_an_error(trained_arith_free_model):
    """The budget must hold every reference solution with its EOS: a shorter one would cap
    accuracy at the share of solutions it fits, whatever the model (issue 24's plateau)."""
    from setdlm.tasks.arithmetic_task import ArithmeticSettings, ArithmeticTask
    from setdlm.util.validation import SettingError

    model, tokenizer = trained_arith_free_model
    problems = arithmetic.generate("test", 40, 0, "arithmetic-3")
    needed = [
        len(tokenizer.encode(p.text, add_special_tokens=False))
        - len(tokenizer.encode(p.question + "\n", add_special_tokens=False))
        + 1
        for p in problems
    ]
    longest = max(needed)
    fits = ArithmeticSettings(limit=40, generator="arithmetic-3", max_new_tokens=longest)
    examples = ArithmeticTask(fits).examples(tokenizer, model)
    assert [e.meta["solution_tokens"] for e in examples] == needed
    short = ArithmeticSettings(limit=40, generator="arithmetic-3", max_new_tokens=longest - 1)
    cut = sum(n > longest - 1 for n in needed)
    message = rf"max_new_tokens = {longest - 1} is too short for {cut} of 40 .* at least {longest}"
    with pytest.raises(SettingError, match=message):
        ArithmeticTask(short).examples(tokenizer, model)
    # a learning curve's probe takes its budget from train.curve.max_new_tokens, checked alike
    from setdlm.recipes.learning_curve import ArithmeticProbe

    probe = ArithmeticProbe.for_model(model, tokenizer, 100, 40, "arithmetic-3", longest)
    assert probe.task.config.max_new_tokens == longest and len(probe.examples) == 40
    with pytest.raises(SettingError, match="too short"):
        ArithmeticProbe.for_model(model, tokenizer, 100, 40, "arithmetic-3", longest - 1)
    # the infilling variant has no such budget: its span is the masked step's own length
    infill = ArithmeticSettings(variant="infill", limit=40, max_new_tokens=1)
    assert len(ArithmeticTask(infill).examples(tokenizer, model)) == 40


@pytest.fixture(scope="module")
def trained_arith_free_model(tmp_path_factory):
    """A random-weight SetDLM with the arithmetic tokenizer (no training needed here)."""
    from setdlm.data.tokenizers import SpecialTokens, train_bpe_tokenizer
    from setdlm.recipes.tiny import TinySettings, build_tiny_model

    settings = TinySettings(corpus="arithmetic", problems=500)
    texts = [f"{p.question}\n{p.answer}" for p in arithmetic.generate("train", 500, 0)]
    tokenizer = train_bpe_tokenizer(texts, 512, SpecialTokens(), tmp_path_factory.mktemp("tok"))
    return build_tiny_model("setdlm", tokenizer, settings), tokenizer


def test_padded_rows_start_at_bos_end_in_eos_and_refuse_a_long_document(
    trained_arith_free_model,
):
    from setdlm.data.text import PaddedRowsDataset

    _, tokenizer = trained_arith_free_model
    rows = PaddedRowsDataset(
        ["Ada has 5 apples.", "Ben has 7 pens. Ben gets 2 more pens."], tokenizer, 32
    )
    first = rows[0]["input_ids"].tolist()
    assert len(first) == 32 and first[0] == tokenizer.bos_token_id
    body = tokenizer.encode("Ada has 5 apples.", add_special_tokens=False)
    assert first[1 : 1 + len(body)] == body
    assert set(first[1 + len(body) :]) == {tokenizer.eos_token_id}  # EOS, then EOS fill
    with pytest.raises(ValueError, match="document 0 takes .* more than the row length 4"):
        PaddedRowsDataset(["Ada has 5 apples."], tokenizer, 4)


def test_arithmetic_3_writes_commutative_steps_in_either_order_and_stays_correct():
    """The default's grammar since issue 24: arithmetic-2's numbers, with "+" and "*" steps
    written either way round (both orders occur); every line and answer is still right, the
    line's other operand is the previous count, and arithmetic-2's problems are unchanged."""
    problems = arithmetic.generate("test", 300, seed=3, version="arithmetic-3")
    assert {p.question for p in problems}.isdisjoint(
        p.question for p in arithmetic.generate("train", 20000, 0, "arithmetic-3")
    )
    swapped = kept = 0
    for problem in problems:
        for index, (value, left, _, right, result) in enumerate(_checked_steps(problem)):
            assert 1 <= result <= 49
            if index > 0:
                swapped += value == right and value != left
                kept += value == left and value != right
    assert swapped > 50 and kept > 50
    assert arithmetic.identity("test", 300, 0, "arithmetic-3")["generator"] == "arithmetic-3"
    with pytest.raises(ValueError, match="unknown arithmetic generator 'arithmetic-9'"):
        arithmetic.generate("test", 1, 0, "arithmetic-9")


def test_arithmetic_4_keeps_every_step_within_its_bounds_and_reaches_them():
    """The harder version of issue 24: counts to 99, amounts to 19, doubling and tripling,
    either order. Every line is right and within those bounds, and the bounds are reached
    (two-digit amounts, "* 3", counts past arithmetic-3's 49)."""
    rules = arithmetic.grammar("arithmetic-4")
    problems = arithmetic.generate("test", 300, seed=0, version="arithmetic-4")
    arithmetic.check_disjoint(arithmetic.generate("train", 20000, 0, "arithmetic-4"), problems)
    amounts, factors, counts = set(), set(), set()
    for problem in problems:
        steps = _checked_steps(problem)
        assert rules.start[0] <= steps[0][0] <= rules.start[1]
        for value, left, symbol, right, result in steps:
            amount = right if left == value else left
            assert 1 <= result <= rules.max_value
            if symbol == "*":
                factors.add(amount)
            else:
                amounts.add(amount)
                assert 1 <= amount <= rules.max_amount
            counts.add(result)
    assert factors == {2, 3} and max(amounts) == 19 and max(counts) > 90


def _checked_steps(problem) -> list[tuple[int, int, str, int, int]]:
    """A problem's solution steps as (count before, left, symbol, right, result), each checked:
    the result is right, the count before the step is one of its operands (the left one of a
    subtraction), and the final answer is the last result."""
    value = int(re.search(r"has (\d+) ", problem.question).group(1))
    steps = []
    *lines, _ = problem.answer.split("\n")
    for line in lines:
        left, symbol, right, result = STEP.match(line).groups()
        left, right, result = int(left), int(right), int(result)
        assert {"+": left + right, "-": left - right, "*": left * right}[symbol] == result
        assert value in (left, right) and (symbol != "-" or left == value)
        steps.append((value, left, symbol, right, result))
        value = result
    assert gsm8k.reference_answer(problem.answer).strip() == str(value)
    return steps


def test_an_infilled_step_is_correct_in_every_order_its_generator_writes():
    from setdlm.eval.runner import Example
    from setdlm.tasks.arithmetic_task import ArithmeticSettings, ArithmeticTask

    def score(version: str, decoded: str, reference: str) -> dict:
        task = ArithmeticTask(ArithmeticSettings(variant="infill", generator=version))
        return task.score(Example("test-0", [], "", reference, {}), decoded)

    # arithmetic-3 writes "18 * 2 = 36" and "2 * 18 = 36" alike (a coin per step): both right,
    # only one exact; arithmetic-2 writes the count first, always
    assert score("arithmetic-3", "2 * 18 = 36", "18 * 2 = 36") == {
        "step_correct": 1.0, "step_exact": 0.0, "result_exact": 1.0
    }  # fmt: skip
    assert score("arithmetic-3", " 5 + 21 = 26 ", "21 + 5 = 26")["step_correct"] == 1.0
    assert score("arithmetic-2", "2 * 18 = 36", "18 * 2 = 36")["step_correct"] == 0.0
    # subtraction has one order; a swapped result or a wrong sum is wrong in every version
    assert score("arithmetic-3", "4 - 21 = 17", "21 - 4 = 17")["step_correct"] == 0.0
    assert score("arithmetic-3", "2 * 18 = 38", "18 * 2 = 36")["step_correct"] == 0.0
    assert score("arithmetic-3", "2 * 18 36 36", "18 * 2 = 36") == {
        "step_correct": 0.0, "step_exact": 0.0, "result_exact": 0.0
    }  # fmt: skip
    with pytest.raises(ValueError, match="not a solution step"):
        arithmetic.correct_forms_of("#### 36", "arithmetic-3")
