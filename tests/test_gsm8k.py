"""GSM8K with the paper's protocol: extraction, prompts, stopping, data, and the Task end to end."""

from __future__ import annotations

import json

import pytest

from setdlm.checkpoints.folders import load_model
from setdlm.core.decoding import DecodeConfig
from setdlm.core.decoding.stopping import StopRule
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.paper_decoding import paper_decode_config
from setdlm.eval.records import SampleLog
from setdlm.eval.runner import run_evaluation
from setdlm.families import FAMILY_NAMES as FAMILIES
from setdlm.tasks import gsm8k

GOLD_18 = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18"


def gold(number: str) -> str:
    return f"Some working.\n#### {number}"


# (generation, gold number, paper_exact, strict_match, flexible_extract, has_boxed)
EXTRACTION_TABLE = [
    # a real answer in the trained format
    ("She makes 9 * 2 = $18 every day.\nSo the answer is $\\boxed{18}$.", "18", 1, 1, 1, 1),
    # commas: lm-eval ignores them, the paper's exact string does not
    ("The total is $\\boxed{1,000}$.", "1000", 0, 1, 1, 1),
    # a dollar sign inside the box: the strict regex needs a digit after "#### "
    ("\\boxed{$18}", "18", 0, 0, 1, 1),
    ("\\boxed{\\$18}", "18", 0, 0, 1, 1),
    # negatives and decimals
    ("\\boxed{-5}", "-5", 1, 1, 1, 1),
    ("\\boxed{2.5}", "2.5", 1, 1, 1, 1),
    ("\\boxed{2.50}", "2.5", 0, 0, 0, 1),
    ("\\boxed{7.}", "7", 0, 1, 1, 1),  # lm-eval drops a trailing "."
    # several boxes: the first one counts, for the paper and for the rewritten text
    ("First \\boxed{3}, then \\boxed{18}.", "18", 0, 0, 0, 1),
    ("First \\boxed{18}, then \\boxed{3}.", "18", 1, 1, 1, 1),
    # no number at all, and a box without one
    ("I do not know.", "18", 0, 0, 0, 0),
    ("\\boxed{eighteen}", "18", 0, 0, 0, 1),
    # no box: only lm-eval's extraction can find the answer
    ("The answer is #### 18", "18", 0, 1, 1, 0),
    ("so she makes 18 dollars", "18", 0, 0, 1, 0),
    # spaces inside the box defeat the exact string and the strict regex
    ("\\boxed{ 18 }", "18", 0, 0, 1, 1),
    # the official extraction: up to the next "}" (nested braces cut), or to the end
    ("\\boxed{\\frac{1}{2}}", "0.5", 0, 0, 0, 1),
    ("\\boxed{18", "18", 1, 1, 1, 1),
    # empty output and garbage
    ("", "18", 0, 0, 0, 0),
    ("\x00\x01 }{ #### boxed", "18", 0, 0, 0, 0),
    (b"\xff\xfe \\boxed{18}".decode("utf-8", errors="replace"), "18", 1, 1, 1, 1),
]


@pytest.mark.parametrize(
    ("text", "number", "paper", "strict", "flexible", "boxed"), EXTRACTION_TABLE
)
def test_extraction_table(text, number, paper, strict, flexible, boxed):
    scores = gsm8k.score_output(text, gold(number))
    assert scores["paper_exact"] == paper
    assert scores["strict_match"] == strict
    assert scores["flexible_extract"] == flexible
    assert scores["has_boxed"] == boxed
    assert scores["empty_output"] == float(not text.strip())
    assert scores["invalid_utf8_output"] == float("\ufffd" in text)


def test_the_official_rewrite_and_reference():
    assert gsm8k.rewrite_boxed("So $\\boxed{18}$.") == "So #### 18"
    assert gsm8k.rewrite_boxed("no box") == "no box"
    assert gsm8k.boxed_answer("a \\boxed{1} b \\boxed{2}") == "1"
    assert gsm8k.reference_answer(GOLD_18) == "18"
    with pytest.raises(ValueError, match="example 7: the answer has no '#### <number>'"):
        gsm8k.reference_answer("just 18", "example 7")


def test_lm_eval_settings_come_from_lm_evals_own_task_file():
    chains = gsm8k.lm_eval_filter_chains()
    assert list(chains) == ["strict-match", "flexible-extract"]
    assert chains["strict-match"][0] == ("regex", {"regex_pattern": "#### (\\-?[0-9\\.\\,]+)"})
    settings = gsm8k.lm_eval_exact_match_settings()
    assert settings["ignore_case"] is True and "(?s).*#### " in settings["regexes_to_ignore"]


# -------------------------------------------------------------------------------- prompts
QUESTION = "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts?"


def test_prompt_with_the_qwen3_chat_template(data_dir):
    tokenizer = load_tokenizer(data_dir / "tokenizers" / "qwen3")
    prompt = gsm8k.build_prompt(QUESTION, tokenizer)
    assert prompt.template == "chat"
    assert prompt.text == (
        "<|im_start|>user\nPlease reason step by step, and put your final answer within "
        f"$\\boxed{{}}$. {QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = gsm8k.encode_prompt(prompt.text, tokenizer)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # Qwen3 has no BOS
    assert tokenizer.decode(ids) == prompt.text


def test_prompt_fallback_without_a_chat_template(random_tiny):
    tokenizer = load_tokenizer(random_tiny / "ar" / "model")
    assert not tokenizer.chat_template
    prompt = gsm8k.build_prompt(QUESTION, tokenizer)
    assert prompt.template == "plain"
    assert prompt.text == f"{gsm8k.INSTRUCTION} {QUESTION}\nAnswer:"
    ids = gsm8k.encode_prompt(prompt.text, tokenizer)
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
    assert tokenizer.decode(ids[1:]) == prompt.text


# ------------------------------------------------------------------------------- stopping
def test_stopping_at_the_first_generated_box(random_tiny):
    tokenizer = load_tokenizer(random_tiny / "ar" / "model")
    settings = gsm8k.stop_settings(gsm8k.PROTOCOLS["pareto"], tokenizer)
    rule = StopRule(DecodeConfig(**settings), tokenizer)
    generated = tokenizer("so $\\boxed{18}$ and then \\boxed{3}", add_special_tokens=False)
    generated = generated["input_ids"]
    stop = rule.stop_point(generated, 0)
    assert tokenizer.decode(generated[:stop]).endswith("\\boxed{18}")
    assert "}" not in tokenizer.decode(generated[: stop - 1])
    # 8 identical tokens, and the EOS
    assert rule.stop_point([7] * 9, 0) == 8
    assert rule.stop_point([7, 8, tokenizer.eos_token_id, 9], 0) == 3
    assert settings["stop_strings"] == ()
    accuracy = gsm8k.stop_settings(gsm8k.PROTOCOLS["accuracy"], tokenizer, stop_on_eos=False)
    assert accuracy["stop_strings"] == ("<|im_end|>",) and accuracy["eos_token_ids"] == ()


def test_budgets_of_the_two_protocols():
    assert gsm8k.budget(gsm8k.PROTOCOLS["pareto"], 200, 1024) == 1024
    assert gsm8k.budget(gsm8k.PROTOCOLS["accuracy"], 200, 1024) == 824
    with pytest.raises(ValueError, match="gsm8k test-3: a prompt of 70 tokens leaves no room"):
        gsm8k.budget(gsm8k.PROTOCOLS["accuracy"], 70, 64, "gsm8k test-3")
    with pytest.raises(ValueError, match="unknown GSM8K protocol"):
        gsm8k.get_protocol("fast")


def test_answer_text_is_cut_at_the_official_strings(random_tiny):
    tokenizer = load_tokenizer(random_tiny / "ar" / "model")
    ids = tokenizer("x = 3\nQuestion: next", add_special_tokens=False)["input_ids"]
    assert gsm8k.answer_text(ids, tokenizer) == "x = 3\n"
    with_eos = tokenizer("7 </s", add_special_tokens=False)["input_ids"]
    with_eos += [tokenizer.eos_token_id] + tokenizer("8", add_special_tokens=False)["input_ids"]
    assert gsm8k.answer_text(with_eos, tokenizer) == "7 </s"
    assert gsm8k.cut_text("a<|im_end|>b</s>c", gsm8k.CUT_STRINGS) == "a"


# ----------------------------------------------------------------------------------- data
def test_offline_test_split(data_dir):
    problems = gsm8k.load_gsm8k(source="local")
    assert len(problems) == gsm8k.TEST_SIZE == 1319
    assert problems[0].id == "test-0" and problems[0].question.startswith("Janet’s ducks")
    assert gsm8k.reference_answer(problems[0].answer) == "18"
    assert [p.id for p in gsm8k.load_gsm8k(limit=3)] == ["test-0", "test-1", "test-2"]


def test_malformed_data_names_the_file_and_line(tmp_path, monkeypatch):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    rows = [json.dumps({"question": "q", "answer": "a\n#### 1"}), "{not json"]
    (folder / "test.jsonl").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("SETDLM_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"test\.jsonl:2: not valid JSON"):
        gsm8k.load_gsm8k()
    (folder / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "no marker"}))
    with pytest.raises(ValueError, match=r"test\.jsonl:1: the answer has no"):
        gsm8k.load_gsm8k()


# ---------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("family", FAMILIES)
def test_the_task_end_to_end(random_tiny, tmp_path, family):
    folder = random_tiny / family / "model"
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    task = gsm8k.GSM8KTask(protocol="pareto", limit=3, max_new_tokens=16)
    decode = paper_decode_config("gsm8k", model)
    metrics = run_evaluation(task, model, tokenizer, decode, tmp_path / "run")
    records = list(SampleLog(tmp_path / "run" / "samples.jsonl").load().values())
    assert [r["id"] for r in records] == ["test-0", "test-1", "test-2"]
    for record in records:
        assert record["prompt"].endswith("\nAnswer:")
        assert 0 < record["generated_tokens"] == len(record["output_ids"]) <= 16
        assert record["nfe"] > 0 and record["parallelism"] >= 1.0
        assert record["output_text"] == gsm8k.answer_text(record["output_ids"], tokenizer)
        assert record["scores"] == gsm8k.score_output(record["output_text"], record["reference"])
        if record["stopped"]:  # a stop rule fired on the last generated token
            ids = record["output_ids"]
            text = tokenizer.decode(ids, skip_special_tokens=False)
            assert (
                len(set(ids[-8:])) == 1
                and len(ids) >= 8
                or ids[-1] == tokenizer.eos_token_id
                or "\\boxed{" in text
            )
    quality = metrics["quality"]
    assert set(quality) == set(gsm8k.METRIC_DEFINITIONS)
    for entry in quality.values():
        assert 0.0 <= entry["value"] <= 1.0 and entry["definition"]
        assert entry["prompt_template"] == "plain" and entry["protocol"] == "pareto"
    assert metrics["config"]["decode"]["stop_regexes"] == [gsm8k.BOXED_STOP_REGEX]
    assert metrics["config"]["decode"]["stop_repeated_tokens"] == 8
    assert metrics["speed"]["nfe_total"] > 0 and metrics["speed"]["timed_examples"] == 2


def test_the_accuracy_protocol_needs_room_in_the_model(random_tiny, tmp_path):
    folder = random_tiny / "setdlm" / "model"
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    task = gsm8k.GSM8KTask(protocol="accuracy", limit=1)
    with pytest.raises(ValueError, match="gsm8k test-0: a prompt of .* tokens leaves no room"):
        run_evaluation(task, model, tokenizer, DecodeConfig(), tmp_path / "run")
