"""ROCStories infilling: construction from the real CSV, and runs on every family."""

from __future__ import annotations

import json

import pytest

from setdlm.checkpoints.folders import load_model
from setdlm.checkpoints.zoo import PUBLISHED
from setdlm.core.decoding import DecodeConfig
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.generated_text import flag_counts, text_before_eos
from setdlm.eval.paper_decoding import paper_decode_config
from setdlm.eval.runner import Example, RunSettings, run_evaluation
from setdlm.families import FAMILY_NAMES as FAMILIES  # noqa: E402
from setdlm.tasks.infill import (
    InfillSettings,
    InfillTask,
    build_infill_input,
    read_stories,
    split_story,
)

VARIANTS = ("infill-1", "infill-3")
GPT2_EOS = 50256  # <|endoftext|>: BOS = EOS of the OWT models
OWT_MASK = 50257  # <|fim_middle|>, added after GPT-2's vocabulary


@pytest.fixture(scope="module")
def stories(data_dir):
    return read_stories(data_dir / "rocstories" / "cloze_test_val__spring2016.csv")


@pytest.fixture(scope="module")
def gpt2(data_dir):
    return load_tokenizer(data_dir / "tokenizers" / "gpt2")


def _tiny(random_tiny, family):
    folder = random_tiny / family / "model"
    return load_model(folder), load_tokenizer(folder)


def _records(folder):
    return [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]


def test_stories_end_with_the_right_ending(stories):
    assert len(stories) == 1871 and len({s.id for s in stories}) == 1871
    assert all(len(s.sentences) == 5 for s in stories)
    first = stories[0]  # AnswerRightEnding = 1
    assert first.sentences[0] == "Rick grew up in a troubled household."
    assert first.sentences[4] == "He is happy now."
    third = stories[2]  # AnswerRightEnding = 2: the second quiz sentence, not the first
    assert third.id == "e8f628d5-9f97-40ed-8611-fc0e774673c4"
    assert third.sentences[4] == "Sarah decided that she preferred her home over Europe."


def test_a_malformed_csv_names_the_file_and_line(tmp_path):
    header = (
        "InputStoryid,InputSentence1,InputSentence2,InputSentence3,InputSentence4,"
        "RandomFifthSentenceQuiz1,RandomFifthSentenceQuiz2,AnswerRightEnding\n"
    )
    path = tmp_path / "cloze.csv"
    path.write_text(header + "a,s1,s2,s3,s4,e1,e2,1\nb,s1,s2,s3,s4,e1,e2,3\n")
    with pytest.raises(ValueError, match=r"cloze.csv:3: AnswerRightEnding must be 1 or 2"):
        read_stories(path)
    path.write_text("InputStoryid,InputSentence1\na,b\n")
    with pytest.raises(ValueError, match=r"cloze.csv: missing columns"):
        read_stories(path)


def test_the_sentences_go_where_each_variant_says(stories):
    s = stories[0].sentences
    one = split_story(stories[0], "infill-1")
    assert one.prefix == f"{s[0]} {s[1]}"
    assert one.middle == s[2]
    assert one.suffix == f" {s[3]} {s[4]}"
    three = split_story(stories[0], "infill-3")
    assert three.prefix == s[0]
    assert three.middle == f"{s[1]} {s[2]} {s[3]}"
    assert three.suffix == f" {s[4]}"
    for variant in VARIANTS:  # nothing lost or added
        parts = split_story(stories[0], variant)
        assert f"{parts.prefix} {parts.middle}{parts.suffix}" == " ".join(s)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_story_masks_exactly_the_gold_middles_tokens(stories, gpt2, variant):
    lengths = []
    for story in stories:
        segments = split_story(story, variant)
        built = build_infill_input(
            segments, gpt2, bos_token_id=GPT2_EOS, eos_token_id=GPT2_EOS, mask_token_id=OWT_MASK
        )
        ids, start, m = built
        prefix, middle, suffix = (gpt2.encode(text) for text in segments)
        assert ids == [GPT2_EOS, *prefix, *[OWT_MASK] * len(middle), *suffix, GPT2_EOS]
        assert start == 1 + len(prefix) and m == len(middle) == ids.count(OWT_MASK)
        assert gpt2.decode(ids[1:start]) == segments.prefix
        assert gpt2.decode(ids[start + m : -1]) == segments.suffix
        lengths.append(m)
    assert min(lengths) >= 2
    average = sum(lengths) / len(lengths)
    # one sentence is about 10 GPT-2 tokens, three about 30
    assert (8 < average < 14) if variant == "infill-1" else (28 < average < 40)


def test_the_papers_family_settings_and_repetition_options(gpt2):
    assert paper_decode_config("infill", PUBLISHED["owt:mdlm"]).policy.block_size == 1024
    assert paper_decode_config("infill", PUBLISHED["owt:bd3lm-s16"]).policy.block_size == 16
    assert paper_decode_config("infill", PUBLISHED["owt:setdlm-smax32"]).policy.window == 32
    assert paper_decode_config("infill", PUBLISHED["owt:ar"]) == DecodeConfig()
    base = DecodeConfig(eos_token_ids=(1,), stop_strings=("x",), length_penalty=(3, 1.1))
    for variant, repetition, penalty in (
        ("infill-1", "paper", 1.2),
        ("infill-3", "paper", 1.2),
        ("infill-1", "script_default", 1.1),
        ("infill-3", "script_default", 1.5),
    ):
        task = InfillTask(InfillSettings(variant=variant, repetition=repetition))
        config = task.decode_config(base, gpt2)
        assert config.repetition_penalty == penalty and config.repetition_context == "visible"
        assert config.eos_token_ids == () and config.stop_strings == ()
        assert config.length_penalty is None
        assert task.settings()["repetition_penalty"] == penalty


def test_a_story_longer_than_the_model_is_refused_or_skipped(random_tiny):
    model, tokenizer = _tiny(random_tiny, "mdlm")
    with pytest.raises(ValueError, match=r"ROCStories story .* more than the model's length 64"):
        InfillTask(InfillSettings(limit=3)).examples(tokenizer, model)
    task = InfillTask(InfillSettings(limit=3, too_long="skip"))
    examples = task.examples(tokenizer, model)
    assert len(examples) == 3 and task.skipped
    assert all(len(e.input_ids) <= 64 for e in examples)


@pytest.mark.parametrize("variant", VARIANTS)
def test_ar_sees_the_left_context_only(random_tiny, variant):
    ar, tokenizer = _tiny(random_tiny, "ar")
    mdlm, _ = _tiny(random_tiny, "mdlm")
    settings = InfillSettings(variant=variant, limit=3, too_long="skip")
    left_only = InfillTask(settings).examples(tokenizer, ar)
    full = InfillTask(settings).examples(tokenizer, mdlm)
    mask = mdlm.config.mask_token_id
    for ar_example, example in zip(left_only, full, strict=True):
        start = example.input_ids.index(mask)
        span = example.input_ids.count(mask)
        assert ar_example.id == example.id and ar_example.reference == example.reference
        assert ar_example.input_ids == example.input_ids[:start]
        assert ar_example.max_new_tokens == span == example.meta["span_length"]
        assert example.max_new_tokens is None
        assert example.input_ids[start : start + span] == [mask] * span


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_end_to_end_on_a_tiny_trained_model(random_tiny, tmp_path, family, variant):
    model, tokenizer = _tiny(random_tiny, family)
    task = InfillTask(InfillSettings(variant=variant, limit=3, too_long="skip"))
    metrics = run_evaluation(task, model, tokenizer, paper_decode_config("infill", model), tmp_path)
    records = _records(tmp_path)
    assert (tmp_path / "metrics.json").exists() and len(records) == metrics["examples"] == 3
    examples = {e.id: e for e in task.examples(tokenizer, model)}
    for record in records:
        span = examples[record["id"]].meta["span_length"]
        # the oracle length: exactly the span's tokens, for every family
        assert record["generated_tokens"] == len(record["output_ids"]) == span
        assert model.config.mask_token_id not in record["output_ids"]
        assert record["output_text"] == text_before_eos(
            record["output_ids"], tokenizer, tokenizer.eos_token_id
        )
    quality = metrics["quality"]
    assert set(quality) >= {"rouge1", "rouge2", "rougeL", "empty_outputs", "skipped_too_long"}
    assert "rougeLsum" not in quality
    assert all(0.0 <= quality[n]["value"] <= 1.0 for n in ("rouge1", "rouge2", "rougeL"))
    assert quality["skipped_too_long"]["value"] == len(task.skipped) > 0
    assert metrics["config"]["decode"]["repetition_penalty"] == 1.2
    assert metrics["speed"]["timed_examples"] == 2 and metrics["speed"]["nfe_mean"] >= 1


def test_ar_results_do_not_depend_on_the_batch_size(random_tiny, tmp_path):
    # AR examples carry their own budget (the span length): a batch never mixes budgets.
    model, tokenizer = _tiny(random_tiny, "ar")
    task = InfillTask(InfillSettings(variant="infill-3", limit=3, too_long="skip"))
    config = paper_decode_config("infill", model)
    run_evaluation(task, model, tokenizer, config, tmp_path / "one")
    run_evaluation(task, model, tokenizer, config, tmp_path / "three", RunSettings(batch_size=3))
    one, three = _records(tmp_path / "one"), _records(tmp_path / "three")
    assert [r["output_ids"] for r in one] == [r["output_ids"] for r in three]
    assert {r["batch_size"] for r in three} == {1}
    assert len({len(r["output_ids"]) for r in one}) > 1  # the budgets really differ


def test_empty_and_invalid_utf8_outputs_are_scored_and_counted(random_tiny):
    _, tokenizer = _tiny(random_tiny, "setdlm")
    task = InfillTask(InfillSettings())
    eos = tokenizer.eos_token_id
    example_ids = tokenizer.encode(" She did not listen.")
    truncated_char = tokenizer.encode(" caf\u00e9")[:-1]  # ends inside the UTF-8 of "é"
    reference = Example(id="x", input_ids=[], prompt="", reference="She did not listen.")
    outputs = {
        "empty": [eos, *example_ids],  # EOS first: nothing before it
        "broken": truncated_char,
        "fine": example_ids,
    }
    records = []
    for name, ids in outputs.items():
        text = text_before_eos(ids, tokenizer, eos)
        records.append({"id": name, "scores": task.score(reference, text)})
    assert records[0]["scores"]["rouge1"] == 0.0 and records[0]["scores"]["empty_output"] == 1
    assert records[1]["scores"]["invalid_utf8_output"] == 1
    assert records[2]["scores"]["rouge1"] == 1.0
    counts = flag_counts(records)
    assert counts["empty_outputs"]["value"] == 1 and counts["invalid_utf8_outputs"]["value"] == 1
    quality = task.aggregate(records)
    assert quality["rouge1"]["value"] == pytest.approx(1 / 3 + records[1]["scores"]["rouge1"] / 3)
