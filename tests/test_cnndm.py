"""CNN/DailyMail: the prompt's exact token layout, the stop rule, and runs on every family."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from setdlm.baselines.mdlm import SemiAutoregressiveOptions
from setdlm.checkpoints.folders import load_model
from setdlm.checkpoints.zoo import PUBLISHED
from setdlm.core.decoding import DecodeConfig
from setdlm.core.decoding.stopping import StopRule
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.paper_decoding import paper_decode_config
from setdlm.eval.runner import run_evaluation
from setdlm.families import FAMILY_NAMES as FAMILIES  # noqa: E402
from setdlm.model import SlidingWindowOptions
from setdlm.tasks.cnndm import (
    OFFICIAL_STOP_PATTERN,
    CnnDmSettings,
    CnnDmTask,
    build_prompt,
    load_test_articles,
    read_articles_jsonl,
    settings_for_model_length,
)

ENDOFTEXT = 151643  # Qwen3's <|endoftext|>: BOS = EOS = PAD of the paper's CNN/DM models


@pytest.fixture(scope="module")
def qwen3(data_dir):
    return load_tokenizer(data_dir / "tokenizers" / "qwen3")


@pytest.fixture(scope="module")
def articles():
    return load_test_articles()


def _tiny(random_tiny, family):
    folder = random_tiny / family / "model"
    return load_model(folder), load_tokenizer(folder)


def test_the_offline_test_sample_loads_with_ids_and_references(articles):
    assert len(articles) == 100 and len({a.id for a in articles}) == 100
    assert all(a.id.startswith(("cnn-test-", "dm-test-")) for a in articles)
    assert all(a.article and a.highlights for a in articles)


def test_prompt_layout_with_the_qwen3_tokenizer(qwen3, articles):
    article = next(a.article for a in articles if len(qwen3.encode(a.article)) > 512)
    ids = build_prompt(
        article,
        qwen3,
        bos_token_id=ENDOFTEXT,
        eos_token_id=ENDOFTEXT,
        max_article_tokens=512,
        target_prompt="Summary:",
    )
    article_ids = qwen3.encode(article, add_special_tokens=False)
    assert ids[0] == ENDOFTEXT
    assert ids[1:513] == article_ids[:512]
    assert ids[513] == ENDOFTEXT
    assert ids[514:] == qwen3.encode("Summary:") == [19237, 25]  # "Summary", ":"
    assert len(ids) == 516
    text = qwen3.decode(ids)
    assert text.startswith("<|endoftext|>") and text.endswith("<|endoftext|>Summary:")


def test_a_short_article_is_kept_whole(qwen3):
    ids = build_prompt(
        "Short news .",
        qwen3,
        bos_token_id=ENDOFTEXT,
        eos_token_id=ENDOFTEXT,
        max_article_tokens=512,
        target_prompt="Summary:",
    )
    assert ids == [ENDOFTEXT, *qwen3.encode("Short news ."), ENDOFTEXT, 19237, 25]


def test_every_prompt_holds_two_matches_of_the_official_stop_pattern(qwen3, articles):
    # The official rule needs 3 matches of r'<|endoftext|>' in prompt + generation: with two in
    # every prompt it fires at the first generated EOS (SPEC 8.2 item 3).
    for article in articles:
        ids = build_prompt(
            article.article,
            qwen3,
            bos_token_id=ENDOFTEXT,
            eos_token_id=ENDOFTEXT,
            max_article_tokens=512,
            target_prompt="Summary:",
        )
        matches = re.findall(OFFICIAL_STOP_PATTERN, qwen3.decode(ids))
        assert matches == ["endoftext", "endoftext"], article.id


def test_the_stop_rules_with_the_qwen3_tokenizer(qwen3):
    words = qwen3.encode(" The minister resigned.")
    for stop in ("first_eos", "official_pattern"):
        task = CnnDmTask(CnnDmSettings(eos_token="<|endoftext|>", stop=stop))
        rule = StopRule(task.decode_config(DecodeConfig(), qwen3), qwen3)
        generated = [*words, ENDOFTEXT, *words, ENDOFTEXT]
        assert rule.stop_point(generated, 0) == len(words) + 1  # the first generated EOS
        assert rule.stop_point(words, 0) is None
    # The official alternation also matches "endoftext" as plain text (its one difference)
    plain = qwen3.encode(" the endoftext marker")
    official = CnnDmTask(CnnDmSettings(eos_token="<|endoftext|>", stop="official_pattern"))
    rule = StopRule(official.decode_config(DecodeConfig(), qwen3), qwen3)
    assert rule.stop_point(plain, 0) is not None
    first_eos = CnnDmTask(CnnDmSettings(eos_token="<|endoftext|>"))
    assert (
        StopRule(first_eos.decode_config(DecodeConfig(), qwen3), qwen3).stop_point(plain, 0) is None
    )


def test_the_decoding_rules_are_the_papers(qwen3):
    task = CnnDmTask(CnnDmSettings(eos_token="<|endoftext|>"))
    knobs = SemiAutoregressiveOptions(block_size=32)
    config = task.decode_config(DecodeConfig(policy=knobs, stop_strings=("x",)), qwen3)
    assert config.max_new_tokens == 180
    assert config.repetition_penalty == 1.2 and config.repetition_context == "generated"
    assert config.length_penalty == (80, 1.1)
    assert config.eos_token_ids == (ENDOFTEXT,) and config.stop_strings == ()
    assert config.policy == knobs  # the family's knobs are the caller's
    assert settings_for_model_length(768, qwen3) == CnnDmSettings()


def test_the_papers_family_settings():
    assert paper_decode_config("cnndm", PUBLISHED["cnndm:ar"]) == DecodeConfig()
    assert paper_decode_config("cnndm", PUBLISHED["cnndm:mdlm"]).policy.block_size == 32
    assert paper_decode_config("cnndm", PUBLISHED["cnndm:bd3lm-s8"]).policy.block_size == 8
    for smax, d in ((8, 4), (16, 8), (32, 16)):
        config = paper_decode_config("cnndm", PUBLISHED[f"cnndm:setdlm-smax{smax}"])
        assert config.policy == SlidingWindowOptions(window=d)


def test_a_prompt_that_does_not_fit_the_model_is_refused(random_tiny):
    model, tokenizer = _tiny(random_tiny, "setdlm")
    with pytest.raises(ValueError, match=r"does not fit the model's length 64.*max_article"):
        CnnDmTask(CnnDmSettings(limit=2)).examples(tokenizer, model)


def test_a_tokenizer_whose_eos_is_not_the_models_is_refused(random_tiny, qwen3):
    model, _ = _tiny(random_tiny, "ar")
    with pytest.raises(ValueError, match="trained with EOS id 1"):
        CnnDmTask(CnnDmSettings(limit=1)).examples(qwen3, model)
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        CnnDmTask(CnnDmSettings(eos_token="<|endoftext|>")).eos_id(
            load_tokenizer(random_tiny / "ar" / "model")
        )


def test_malformed_data_names_the_file_and_line(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text('{"doc_id": "a", "article": "x", "highlights": "y"}\n{"doc_id": "b"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl:2: key 'article'"):
        read_articles_jsonl(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_stops_at_the_first_generated_eos(trained_tiny, tmp_path, family):
    model, tokenizer = _tiny(trained_tiny, family)
    fitted = settings_for_model_length(model.config.length, tokenizer, CnnDmSettings(limit=3))
    eager = dataclasses.replace(fitted, length_penalty=(2, 10.0))  # pushes EOS early
    run_evaluation(
        CnnDmTask(eager), model, tokenizer, paper_decode_config("cnndm", model), tmp_path
    )
    eos = tokenizer.eos_token_id
    for line in (tmp_path / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        ids = record["output_ids"]
        assert record["stopped"] and ids[-1] == eos and ids.count(eos) == 1
        assert record["generated_tokens"] == len(ids) < eager.max_new_tokens
        assert "<|eos|>" not in record["output_text"]


@pytest.mark.parametrize("family", FAMILIES)
def test_end_to_end_on_a_tiny_trained_model(trained_tiny, tmp_path, family):
    model, tokenizer = _tiny(trained_tiny, family)
    settings = settings_for_model_length(64, tokenizer, CnnDmSettings(limit=3))
    assert settings.max_article_tokens + settings.max_new_tokens < 64
    metrics = run_evaluation(
        CnnDmTask(settings), model, tokenizer, paper_decode_config("cnndm", model), tmp_path
    )
    records = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert (tmp_path / "metrics.json").exists() and len(records) == metrics["examples"] == 3
    for record in records:
        assert record["prompt"].startswith("<|bos|>")
        assert record["prompt"].endswith("<|eos|>Summary:")
        assert 0 < record["generated_tokens"] <= settings.max_new_tokens
        assert record["nfe"] >= 1
    quality = metrics["quality"]
    for name in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert 0.0 <= quality[name]["value"] <= 1.0
        assert quality[name]["settings"]["use_stemmer"] is False
    assert quality["rouge1"]["value"] > 0  # the tiny models emit common words ("the")
    assert quality["empty_outputs"]["value"] == sum(r["scores"]["empty_output"] for r in records)
    speed = metrics["speed"]
    assert speed["timed_examples"] == 2 and speed["tokens_per_second_mean"] > 0
    assert metrics["config"]["decode"]["length_penalty"] == list(settings.length_penalty)
