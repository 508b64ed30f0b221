"""One mechanism for the command line and the workflow configuration: each option obeys the
schema node of its configuration key, so both refuse the same values in the same words, and
the rules between settings are the same functions."""

from __future__ import annotations

import argparse
import copy

import pytest
from configs import tiny_with_paper_tasks

from setdlm.util import validation
from setdlm.workflow.config import ConfigError, validate

TINY = tiny_with_paper_tasks()

# (option type, configuration key, where the value goes in tiny.yaml, bad values)
SHARED = [
    (
        validation.THRESHOLD,
        "tasks.gsm8k.thresholds[0]",
        ("tasks", "gsm8k", "thresholds", 0),
        [0.0, -1.0, 1.5, 2e6],
    ),
    (validation.BATCH_SIZE, "tasks.gsm8k.batch_size", ("tasks", "gsm8k", "batch_size"), [0, -3]),
    (validation.LIMIT, "tasks.gsm8k.limit", ("tasks", "gsm8k", "limit"), [0, -1]),
    (validation.WARMUP, "tasks.gsm8k.warmup", ("tasks", "gsm8k", "warmup"), [-1]),
    (
        validation.NEW_TOKENS,
        "tasks.gsm8k.max_new_tokens",
        ("tasks", "gsm8k", "max_new_tokens"),
        [0],
    ),
    (validation.THREADS, "resources.default.cpus", ("resources", "default", "cpus"), [0]),
]


def _with(path: tuple, value) -> dict:
    config = copy.deepcopy(TINY)
    node = config
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[path[-1]] = value
    return config


@pytest.mark.parametrize("parse, key, path, values", SHARED, ids=[s[1] for s in SHARED])
def test_the_option_and_the_configuration_key_refuse_the_same_values_alike(
    parse, key, path, values
):
    for value in values:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(str(value))
        expected = str(refused.value).split(" is not ", 1)[1]  # the rule, in words
        with pytest.raises(ConfigError) as config_error:
            validate(_with(path, value), check_data=False)
        assert any(
            error.startswith(f"{key}: ") and expected in error
            for error in config_error.value.errors
        ), (expected, config_error.value.errors)


def test_the_option_accepts_what_the_configuration_accepts():
    for parse, _, path, _ in SHARED:
        good = {0: 0.77, "limit": 5}.get(path[-1], 1)  # a limit leaves room for the warm-up
        assert parse(str(good)) == good
        validate(_with(path, good), check_data=False)
    assert validation.THRESHOLD("1e6") == 1e6 and validation.THRESHOLD("1") == 1


def test_the_rules_between_settings_say_the_same_for_both():
    # The configuration names its keys, the command line its options: the rule is one function.
    config = _with(("tasks", "gsm8k", "limit"), 3)
    config["tasks"]["gsm8k"]["warmup"] = 3
    with pytest.raises(ConfigError) as error:
        validate(config, check_data=False)
    assert validation.warmup_errors(3, 3, "tasks.gsm8k.warmup", "tasks.gsm8k.limit")[0] in (
        error.value.errors
    )
    assert validation.knob_errors("ar", {"window": 4}, "--{flag}", "m") == [
        "--window: only SetDLM decodes with a window (m is ar)"
    ]
    assert validation.block_errors(5, 64, "--block-size") == [
        "--block-size: 5 does not divide the model length 64"
    ]
    assert validation.budget_errors(63, 64, "--max-new-tokens") == []
    assert "at most 63" in validation.budget_errors(64, 64, "--max-new-tokens")[0]


# ------------------------------------------------- one definition per task setting
def _eval_parser():
    from setdlm.cli import build_parser

    return build_parser(only="eval")


@pytest.mark.parametrize(
    "command", ["gsm8k", "cnndm", "infill", "unconditional", "likelihood", "arithmetic"]
)
def test_every_task_setting_is_an_option_with_the_schemas_rule_and_default(command, capsys):
    """Each setting of a task's schema node is an option of `setdlm eval` with its default; a
    value the workflow's schema refuses, the command line refuses too."""
    from setdlm.tasks import COMMAND_NODES

    parser = _eval_parser()
    required = ["eval", command, "--model", "m", "--out", "o"]
    args = parser.parse_args(required)
    settings = validation.task_settings(COMMAND_NODES[command])
    assert settings
    for setting in settings:
        default = setting.rule.get("default")
        if setting.kind == "composite":
            default = tuple(validation.node(setting._part(p))["default"] for p in setting.parts)
        assert getattr(args, setting.key) == default, setting.key
        minimum = setting.rule.get("minimum")
        if setting.kind == "number" and minimum is not None:
            too_small = minimum - 1
            assert not validation.valid(too_small, setting.rule)
            with pytest.raises(SystemExit):
                parser.parse_args([*required, setting.flag, str(too_small)])
            assert f"is not {validation.expectation(setting.rule)}" in capsys.readouterr().err


def test_the_task_dataclasses_default_to_the_schema():
    """The Python API's defaults are the workflow's and the command line's."""
    from setdlm.eval.gen_ppl import DEFAULT_EVALUATOR
    from setdlm.eval.mauve_score import DEFAULT_FEATURIZER
    from setdlm.tasks.arithmetic_task import ArithmeticSettings
    from setdlm.tasks.cnndm import CnnDmSettings
    from setdlm.tasks.infill import InfillSettings
    from setdlm.tasks.sample_rules import Rejection
    from setdlm.tasks.unconditional import GenerationSettings, ScoringSettings

    def default(task, key):
        return validation.node(f"$defs/{task}/properties/{key}").get("default")

    solve = ArithmeticSettings()
    assert (solve.limit, solve.problem_seed, solve.max_new_tokens) == (
        default("arithmetic-solve", "limit"),
        default("arithmetic-solve", "problem_seed"),
        default("arithmetic-solve", "max_new_tokens"),
    )
    assert CnnDmSettings().stop == default("cnndm", "stop")
    assert InfillSettings().repetition == default("infill", "repetition")
    assert GenerationSettings().num_samples == default("unconditional", "samples")
    rejection = Rejection()
    assert (rejection.entropy_below, rejection.length_at_most, rejection.max_attempts) == tuple(
        default("unconditional/properties/reject", key) for key in ("entropy", "length", "attempts")
    )
    scoring = ScoringSettings()
    for field, key in (
        ("references", "references"),
        ("num_references", "num_references"),
        ("text_protocol", "text_protocol"),
        ("bootstrap_subsets", "bootstrap_subsets"),
    ):
        assert getattr(scoring, field) == default("unconditional", key), field
    assert default("unconditional", "featurizer") == DEFAULT_FEATURIZER
    assert default("unconditional", "evaluator") == DEFAULT_EVALUATOR
