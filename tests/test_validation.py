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
