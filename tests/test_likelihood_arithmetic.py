"""Held-out likelihood of the synthetic arithmetic test problems (likelihood-arithmetic), and
the per-sequence scores and bootstrap interval every likelihood run now records."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from setdlm.eval.intervals import bootstrap_95, ratio_bootstrap_95
from setdlm.families import FAMILY_NAMES
from setdlm.families import family as family_info
from setdlm.tasks import arithmetic
from setdlm.tasks.likelihood import ARITHMETIC_LIMIT, arithmetic_rows, run_likelihood
from setdlm.util.validation import SettingError

# The folder name of each tiny model in the results layout (TinySettings: S = d = 4, M = 8).
MODEL_NAMES = {"ar": "ar", "mdlm": "mdlm", "bd3lm": "bd3lm-s4", "setdlm": "setdlm-smax8"}
# The keys of a held-out set's identity before arithmetic existed: its results keep their hash.
HELDOUT_IDENTITY = {
    "task",
    "data",
    "limit",
    "num_samples",
    "seed",
    "batch_size",
    "model_config",
    "model_source",
    "weights_sha256",
}


@pytest.fixture(scope="module")
def arithmetic_tiny(tmp_path_factory):
    """Random-weight tiny models of every family with a BPE tokenizer of the arithmetic
    problems (length 64: every test problem fits with BOS and EOS)."""
    from setdlm.data.tokenizers import SpecialTokens, train_bpe_tokenizer
    from setdlm.recipes.tiny import TinySettings, build_tiny_model

    settings = TinySettings(corpus="arithmetic", problems=500, generator="arithmetic-3")
    texts = [p.text for p in arithmetic.generate("train", 500, 0, "arithmetic-3")]
    tokenizer = train_bpe_tokenizer(texts, 512, SpecialTokens(), tmp_path_factory.mktemp("tok"))
    models = {family: build_tiny_model(family, tokenizer, settings) for family in FAMILY_NAMES}
    return models, tokenizer


def _records(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_arithmetic_likelihood_scores_the_test_problems_one_per_row(
    arithmetic_tiny, tmp_path, family
):
    models, tokenizer = arithmetic_tiny
    model = models[family]
    out = tmp_path / "likelihood-arithmetic" / MODEL_NAMES[family] / "default"
    metrics = run_likelihood(
        model,
        tokenizer,
        "arithmetic",
        out,
        batch_size=5,  # the last batch is short
        limit=12,
        generator="arithmetic-3",
        problem_seed=1,
    )
    config = metrics["config"]
    assert config["data"] == "arithmetic" and config["limit"] == 12
    assert config["problems"] == arithmetic.identity("test", 12, 1, "arithmetic-3")
    assert set(config) == HELDOUT_IDENTITY | {"problems"}
    quality = metrics["quality"]
    assert metrics["examples"] == 12 and quality["sequences"]["value"] == 12
    records = _records(out)
    assert [r["id"] for r in records] == [f"arithmetic-{i}" for i in range(12)]
    # every family counts every position after BOS of the same rows, the EOS fill included
    length = model.config.length
    assert {r["tokens"] for r in records} == {length - 1}
    for record in records:
        assert record["scores"]["nll"] == pytest.approx(record["nll"] / record["tokens"])
    # the value is total NLL over total tokens; the interval resamples sequences the same way
    nll = quality["nll"]
    total = sum(r["nll"] for r in records) / sum(r["tokens"] for r in records)
    assert nll["value"] == pytest.approx(total, rel=1e-12)
    low, high = nll["bootstrap_95"]
    slack = 1e-9 * abs(nll["value"])  # equal rows give a zero-width interval, up to rounding
    assert low - slack <= nll["value"] <= high + slack
    assert nll["bootstrap_95"] == ratio_bootstrap_95(
        [r["nll"] for r in records], [r["tokens"] for r in records]
    )
    assert quality["perplexity"]["bootstrap_95"] == pytest.approx([math.exp(low), math.exp(high)])
    assert quality["bits_per_token"]["bootstrap_95"] == pytest.approx(
        [low / math.log(2), high / math.log(2)]
    )
    assert nll["definition"].startswith(family_info(family).likelihood)
    # resume from a log written before per-sequence scores existed: the same numbers
    (out / "metrics.json").unlink()
    old = [{k: v for k, v in r.items() if k != "scores"} for r in records[:7]]
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    resumed = run_likelihood(
        model,
        tokenizer,
        "arithmetic",
        out,
        batch_size=5,
        limit=12,
        generator="arithmetic-3",
        problem_seed=1,
    )
    assert resumed["quality"] == quality and resumed["config_hash"] == metrics["config_hash"]
    assert ["scores" in r for r in _records(out)] == [False] * 7 + [True] * 5


def test_the_rows_are_the_problems_as_the_models_are_trained(arithmetic_tiny):
    from setdlm.data.text import PaddedRowsDataset

    _, tokenizer = arithmetic_tiny
    problems = arithmetic.generate("test", 4, 2, "arithmetic-3")
    rows = arithmetic_rows(tokenizer, 64, 4, 2, "arithmetic-3")
    expected = PaddedRowsDataset([p.text for p in problems], tokenizer, 64)
    assert rows.input_ids.equal(expected.input_ids)
    first = rows[0]["input_ids"].tolist()
    body = tokenizer.encode(
        f"{problems[0].question}\n{problems[0].answer}", add_special_tokens=False
    )
    assert first[: 1 + len(body)] == [tokenizer.bos_token_id, *body]
    assert set(first[1 + len(body) :]) == {tokenizer.eos_token_id}
    with pytest.raises(SettingError, match="arithmetic test problem test-0 .* length 20"):
        arithmetic_rows(tokenizer, 20, 4, 2, "arithmetic-3")


def test_no_limit_means_300_problems_of_the_default_generator(arithmetic_tiny, tmp_path):
    models, tokenizer = arithmetic_tiny
    metrics = run_likelihood(models["ar"], tokenizer, "arithmetic", tmp_path, batch_size=100)
    assert metrics["examples"] == ARITHMETIC_LIMIT == 300
    assert metrics["config"]["limit"] == 300
    assert metrics["config"]["problems"] == arithmetic.identity(
        "test", 300, 0, arithmetic.GENERATOR_VERSION
    )
    # the same problems named explicitly: the same configuration, so the finished result
    same = run_likelihood(
        models["ar"],
        tokenizer,
        "arithmetic",
        tmp_path,
        batch_size=100,
        limit=300,
        generator=arithmetic.GENERATOR_VERSION,
        problem_seed=0,
    )
    assert same == metrics


def test_a_heldout_sets_identity_is_unchanged_and_ignores_the_arithmetic_settings(
    random_tiny, tmp_path
):
    """wikitext2/owt/lm1b runs keep the identity keys they had (and so their config hashes);
    they gain per-sequence scores and the NLL interval all the same."""
    from setdlm.checkpoints.folders import load_model
    from setdlm.data.tokenizers import load_tokenizer

    folder = random_tiny / "mdlm" / "model"
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    plain = run_likelihood(model, tokenizer, "wikitext2", tmp_path / "a", limit=3, batch_size=2)
    assert set(plain["config"]) == HELDOUT_IDENTITY
    other = run_likelihood(
        model,
        tokenizer,
        "wikitext2",
        tmp_path / "b",
        limit=3,
        batch_size=2,
        generator="arithmetic-3",
        problem_seed=7,
    )
    assert other["config_hash"] == plain["config_hash"]
    assert other["quality"] == plain["quality"]
    records = _records(tmp_path / "a")
    assert all(r["scores"]["nll"] == pytest.approx(r["nll"] / r["tokens"]) for r in records)
    low, high = plain["quality"]["nll"]["bootstrap_95"]
    assert low <= plain["quality"]["nll"]["value"] <= high


def test_ratio_bootstrap_resamples_as_bootstrap_95_does():
    """One resampling for every interval: the ratio over the same picks as bootstrap_95's
    means, and equal denominators make it the mean's interval."""
    rng = np.random.default_rng(5)
    values = rng.normal(3.0, 1.0, size=40).tolist()
    assert ratio_bootstrap_95(values, [1] * 40) == pytest.approx(bootstrap_95({"x": values})["x"])
    # the picks are default_rng(0)'s, 1000 resamples
    picks = np.random.default_rng(0).integers(0, 40, size=(1000, 40))
    tokens = rng.integers(5, 50, size=40)
    nll = np.asarray(values) * tokens
    ratios = nll[picks].sum(axis=1) / tokens[picks].sum(axis=1)
    assert ratio_bootstrap_95(nll.tolist(), tokens.tolist()) == pytest.approx(
        np.percentile(ratios, [2.5, 97.5]).tolist()
    )
    with pytest.raises(ValueError):
        ratio_bootstrap_95([1.0], [1.0, 2.0])


def test_seeds_aggregate_nll_over_seeds_and_sequences(arithmetic_tiny, tmp_path):
    """With scores.nll, a point over seeds gets a two-level interval for the NLL; perplexity
    and bits per token (no per-sequence score) resample the seeds only."""
    from setdlm.eval.seeds import INTERVAL_SEEDS_ONLY, INTERVAL_TWO_LEVEL, aggregate

    models, tokenizer = arithmetic_tiny
    point = tmp_path / "default"
    for seed in (0, 1):  # MDLM's noise differs by seed: two different estimates
        run_likelihood(
            models["mdlm"], tokenizer, "arithmetic", point / f"seed-{seed}", seed=seed, limit=8
        )
    quality = aggregate(point)["quality"]
    assert quality["nll"]["interval_over"] == INTERVAL_TWO_LEVEL
    assert quality["perplexity"]["interval_over"] == INTERVAL_SEEDS_ONLY
    assert quality["bits_per_token"]["interval_over"] == INTERVAL_SEEDS_ONLY
    low, high = quality["nll"]["bootstrap_95"]
    assert low <= quality["nll"]["value"] <= high


def test_the_likelihood_table_shows_the_interval_and_what_each_row_measures(
    arithmetic_tiny, tmp_path
):
    from setdlm.report.tables import likelihood_table
    from setdlm.results.reader import load_results

    models, tokenizer = arithmetic_tiny
    run = tmp_path / "run"
    for family in ("ar", "setdlm"):
        out = run / "likelihood-arithmetic" / MODEL_NAMES[family] / "default"
        run_likelihood(models[family], tokenizer, "arithmetic", out, limit=6, problem_seed=3)
    table = likelihood_table(load_results(run))
    rows = {row["model"]: row for row in table.rows}
    assert rows["ar"]["measures"] == "exact NLL"
    assert rows["setdlm-smax8"]["measures"].startswith("NLL of one sampled staggered order")
    for row in rows.values():
        metrics = json.loads((run / row["point"] / "metrics.json").read_text())
        value, low, high = row["nll"]
        assert (value, [low, high]) == (
            metrics["quality"]["nll"]["value"],
            metrics["quality"]["nll"]["bootstrap_95"],
        )
        assert row["data"] == "arithmetic"
    notes = " ".join(table.notes)
    assert "compare only within one data set" in notes
    assert "EOS fill is counted" in notes
    assert f"6 test problems of {arithmetic.GENERATOR_VERSION}, problem seed 3" in notes
    assert "resamples its sequences" in notes


# ------------------------------------------------------------------ command line and workflow
def _eval_parser():
    from setdlm.cli import build_parser

    return build_parser(only="eval")


def test_the_command_line_takes_the_problems_settings(capsys):
    parser = _eval_parser()
    required = ["eval", "likelihood", "--model", "m", "--out", "o"]
    args = parser.parse_args(
        [*required, "--data", "arithmetic", "--generator", "arithmetic-3"]
        + ["--problem-seed", "4", "--limit", "300"]
    )
    assert (args.data, args.generator, args.problem_seed, args.limit) == (
        "arithmetic",
        "arithmetic-3",
        4,
        300,
    )
    defaults = parser.parse_args(required)
    # the schema's defaults, which are run_likelihood's (generator None: the default version)
    assert (defaults.data, defaults.generator, defaults.problem_seed) == (
        "wikitext2",
        arithmetic.GENERATOR_VERSION,
        0,
    )
    for bad in (["--generator", "arithmetic-9"], ["--problem-seed", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args([*required, "--data", "arithmetic", *bad])
    assert "arithmetic-9" in capsys.readouterr().err


MINI = {
    "name": "mini-likelihood",
    "data": {"sources": {"wikitext2": "dir"}},
    "train": {"steps": 8, "warmup_steps": 2, "hidden_size": 32, "batch_size": 8},
    "models": {
        "ar": {"family": "ar", "train": {}},
        "ar-arith": {
            "family": "ar",
            "train": {"corpus": "arithmetic", "generator": "arithmetic-3", "problems": 100},
        },
    },
    "tasks": {
        "likelihood-wikitext2": {"models": ["ar"], "limit": 8},
        "likelihood-arithmetic": {
            "models": ["ar-arith"],
            "generator": "arithmetic-3",
            "problem_seed": 2,
            "limit": 50,
        },
    },
}


def test_likelihood_arithmetic_needs_a_model_trained_on_the_problems(data_dir):
    from setdlm.workflow.config import ConfigError, task_dataset, validate

    environ = {"SETDLM_DATA_DIR": str(data_dir)}
    config = validate(copy.deepcopy(MINI), environ=environ)
    assert validate(config, environ=environ) == config  # the jobs validate the filled-in copy
    assert config["tasks"]["likelihood-wikitext2"]["generator"] == arithmetic.GENERATOR_VERSION
    assert task_dataset("likelihood-arithmetic", config["tasks"]["likelihood-arithmetic"]) is None
    wrong = copy.deepcopy(MINI)
    wrong["tasks"]["likelihood-arithmetic"]["models"] = ["ar"]
    with pytest.raises(ConfigError) as raised:
        validate(wrong, environ=environ)
    assert any(
        error.startswith("tasks.likelihood-arithmetic.models[0]")
        and "'ar' is trained on wikitext2" in error
        and "needs a model trained on the arithmetic problems" in error
        for error in raised.value.errors
    ), raised.value.errors
    # a model trained on another grammar than the task's (the default arithmetic-2)
    other = copy.deepcopy(MINI)
    del other["models"]["ar-arith"]["train"]["generator"]
    with pytest.raises(ConfigError) as raised:
        validate(other, environ=environ)
    assert raised.value.errors == [
        "tasks.likelihood-arithmetic.generator: 'arithmetic-3', but 'ar-arith' is trained on "
        "'arithmetic-2' problems (models.ar-arith.train.generator); likelihood-arithmetic must "
        "judge a model with its own generator"
    ]


def test_the_plan_passes_the_problems_settings_to_arithmetic_only(data_dir):
    from setdlm.workflow.plan import build

    environ = {"SETDLM_DATA_DIR": str(data_dir)}
    plan = build(copy.deepcopy(MINI), environ)
    arith = plan.points[("likelihood-arithmetic", "ar-arith", "default")].args
    assert list(arith[arith.index("--generator") :][:2]) == ["--generator", "arithmetic-3"]
    assert list(arith[arith.index("--problem-seed") :][:2]) == ["--problem-seed", "2"]
    assert list(arith[-2:]) == ["--data", "arithmetic"]
    heldout = plan.points[("likelihood-wikitext2", "ar", "default")]
    assert "--generator" not in heldout.args and "--problem-seed" not in heldout.args
    # the arithmetic settings are not part of a held-out set's identity (its hash as before)
    changed = copy.deepcopy(MINI)
    changed["tasks"]["likelihood-wikitext2"].update(generator="arithmetic-3", problem_seed=5)
    changed["tasks"]["likelihood-arithmetic"]["problem_seed"] = 5
    other = build(changed, environ)
    key = ("likelihood-wikitext2", "ar", "default")
    assert other.points[key].config_hash == heldout.config_hash
    arith_key = ("likelihood-arithmetic", "ar-arith", "default")
    assert other.points[arith_key].config_hash != plan.points[arith_key].config_hash
