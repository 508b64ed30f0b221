"""The lm-eval model ``setdlm`` through real lm-eval: task files, generation, likelihoods, CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import lm_eval
import pytest
import torch
import yaml
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model, model_registry
from lm_eval.tasks import TaskManager

import setdlm.eval.harness as harness
from setdlm.checkpoints.folders import load_model
from setdlm.core.decoding import DecodeConfig
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.records import SampleLog
from setdlm.eval.runner import run_evaluation
from setdlm.families import FAMILY_NAMES as FAMILIES  # noqa: E402
from setdlm.tasks import gsm8k

NEW_TOKENS = 12  # the tiny runs' budget (the protocols' 1024 is for the real checkpoints)


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory, data_dir):
    """Our GSM8K task files plus lm-eval's lambada and wikitext tasks made offline."""
    folder = tmp_path_factory.mktemp("tasks")
    names = harness.write_gsm8k_tasks(folder, source="local")
    assert names == ["gsm8k_local", "gsm8k_setdlm_pareto", "gsm8k_setdlm_accuracy"]
    lines = [
        line.strip()
        for line in (data_dir / "wikitext2" / "wiki.test.raw").read_text().splitlines()
        if 60 < len(line.strip()) < 160 and not line.startswith(" =")
    ][:8]
    (folder / "lambada.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    pages = [" ".join(lines[:4]), " ".join(lines[4:]) * 3]  # the second needs several windows
    (folder / "wiki.jsonl").write_text("".join(json.dumps({"page": p}) + "\n" for p in pages))
    harness.write_task(
        folder,
        "lambada_local",
        gsm8k.lm_eval_task_file("lambada/lambada_openai.yaml"),
        **harness.local_dataset_fields({"test": folder / "lambada.jsonl"}),
    )
    harness.write_task(
        folder,
        "wikitext_local",
        gsm8k.lm_eval_task_file("wikitext/wikitext.yaml"),
        **harness.local_dataset_fields({"test": folder / "wiki.jsonl"}),
        training_split=None,
        validation_split=None,
    )
    return folder


@pytest.fixture(scope="module")
def task_manager(task_folder):
    return TaskManager(include_defaults=False, include_path=str(task_folder))


def _model_args(trained_tiny, family, **extra) -> str:
    args = {"pretrained": trained_tiny / family / "model", **extra}
    return ",".join(f"{key}={value}" for key, value in args.items())


def _one_filter(samples: list[dict]) -> list[dict]:
    """lm-eval logs each document once per filter: keep the strict-match copies."""
    return [sample for sample in samples if sample["filter"] == "strict-match"]


def _lm(trained_tiny, family, **kwargs):
    return get_model("setdlm")(pretrained=str(trained_tiny / family / "model"), **kwargs)


# ------------------------------------------------------------------------------ registration
def test_registering_keeps_lm_evals_own_models():
    assert get_model("setdlm") is harness.SetDLMHarnessLM
    for name in ("hf", "dummy", "vllm"):
        assert name in model_registry


def test_the_lm_eval_models_entry_point_names_the_registered_model():
    import importlib.metadata

    points = {e.name: e for e in importlib.metadata.entry_points(group="lm_eval.models")}
    assert points["setdlm"].load() is get_model(harness.MODEL_NAME) is harness.SetDLMHarnessLM


def test_task_files_extend_lm_evals_gsm8k_with_local_data(task_folder, data_dir):
    local = yaml.safe_load((task_folder / "gsm8k_local.yaml").read_text())
    assert local["include"] == str(gsm8k.lm_eval_task_file("gsm8k/gsm8k.yaml"))
    files = local["dataset_kwargs"]["data_files"]
    assert files["test"] == str((data_dir / "gsm8k" / "test.jsonl").resolve())
    paper = yaml.safe_load((task_folder / "gsm8k_setdlm_accuracy.yaml").read_text())
    assert paper["num_fewshot"] == 0 and paper["doc_to_text"].startswith(gsm8k.INSTRUCTION)
    generation = paper["generation_kwargs"]
    assert generation["setdlm_stop_regexes"] == [gsm8k.BOXED_STOP_REGEX]
    assert generation["setdlm_stop_strings"] == ["<|im_end|>"] and generation["setdlm_fill_context"]
    with pytest.raises(FileNotFoundError, match="split 'test'"):
        harness.local_dataset_fields({"test": task_folder / "missing.jsonl"})


# ---------------------------------------------------------------------------- generate_until
@pytest.mark.parametrize("family", FAMILIES)
def test_the_paper_gsm8k_task_through_simple_evaluate(trained_tiny, task_manager, tmp_path, family):
    results = lm_eval.simple_evaluate(
        model="setdlm",
        model_args=_model_args(trained_tiny, family, log_dir=tmp_path / "log"),
        tasks=["gsm8k_setdlm_pareto"],
        limit=2,
        task_manager=task_manager,
        apply_chat_template=True,
        gen_kwargs={"max_gen_toks": NEW_TOKENS},
    )
    scores = results["results"]["gsm8k_setdlm_pareto"]
    for key in (
        "exact_match,strict-match",
        "exact_match,flexible-extract",
        "gsm8k_paper_exact,paper-boxed",
    ):
        assert 0.0 <= scores[key] <= 1.0
    samples = _one_filter(results["samples"]["gsm8k_setdlm_pareto"])
    assert len(samples) == 2
    # lm-eval built the same prompt as our Task (the plain fallback of this tokenizer)
    tokenizer = load_tokenizer(trained_tiny / family / "model")
    question = samples[0]["doc"]["question"]
    context = samples[0]["arguments"][0][0]
    assert context == gsm8k.build_prompt(question, tokenizer).text
    # speed of the same run: one record per request, and its summary
    records = list(SampleLog(tmp_path / "log" / "generations.jsonl").load().values())
    assert [r["id"] for r in records] == ["gsm8k_setdlm_pareto/0/0", "gsm8k_setdlm_pareto/1/0"]
    for record, sample in zip(records, samples, strict=True):
        assert record["output_text"] == sample["resps"][0][0]
        assert 0 < record["generated_tokens"] <= NEW_TOKENS and record["nfe"] > 0
    speed = json.loads((tmp_path / "log" / "speed.json").read_text())
    assert speed["family"] == family and speed["timed_examples"] == 1
    assert speed["tokens_per_second_mean"] > 0 and speed["nfe_total"] == records[1]["nfe"]


def test_lm_eval_and_the_runner_task_give_the_same_outputs(trained_tiny, task_manager, tmp_path):
    folder = trained_tiny / "setdlm" / "model"
    results = lm_eval.simple_evaluate(
        model="setdlm",
        model_args=f"pretrained={folder}",
        tasks=["gsm8k_setdlm_pareto"],
        limit=3,
        task_manager=task_manager,
        apply_chat_template=True,
        gen_kwargs={"max_gen_toks": NEW_TOKENS},
    )
    samples = _one_filter(results["samples"]["gsm8k_setdlm_pareto"])
    harness_outputs = [s["resps"][0][0] for s in samples]
    task = gsm8k.GSM8KTask(limit=3, max_new_tokens=NEW_TOKENS)
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    run_evaluation(task, model, tokenizer, DecodeConfig(), tmp_path / "run")
    records = SampleLog(tmp_path / "run" / "samples.jsonl").load()
    assert harness_outputs == [records[f"test-{i}"]["output_text"] for i in range(3)]
    paper = results["results"]["gsm8k_setdlm_pareto"]["gsm8k_paper_exact,paper-boxed"]
    assert paper == sum(r["scores"]["paper_exact"] for r in records.values()) / 3


def test_lm_evals_own_gsm8k_task_file(trained_tiny, task_manager):
    results = lm_eval.simple_evaluate(
        model="setdlm",
        model_args=_model_args(trained_tiny, "bd3lm", max_new_tokens=NEW_TOKENS),
        tasks=["gsm8k_local"],
        num_fewshot=0,
        limit=2,
        task_manager=task_manager,
    )
    samples = _one_filter(results["samples"]["gsm8k_local"])
    assert samples[0]["arguments"][0][0].startswith("Question: Janet")
    assert all(isinstance(s["resps"][0][0], str) for s in samples)
    assert "Question:" not in samples[0]["resps"][0][0]  # `until` cuts the text
    assert 0.0 <= results["results"]["gsm8k_local"]["exact_match,strict-match"] <= 1.0


def test_the_chat_template_lm_eval_applies_is_the_tasks(trained_tiny, data_dir):
    qwen3 = data_dir / "tokenizers" / "qwen3"
    lm = _lm(trained_tiny, "setdlm", tokenizer=str(qwen3))
    question = "How many bolts in total does it take?"
    turn = [{"role": "user", "content": gsm8k.user_turn(question)}]
    expected = gsm8k.build_prompt(question, load_tokenizer(qwen3))
    assert expected.template == "chat" and lm.apply_chat_template(turn) == expected.text
    assert "enable_thinking" in lm.chat_template(True)


def test_until_strings_stop_and_cut_or_only_cut(trained_tiny):
    lm = _lm(trained_tiny, "ar", warmup=0)

    def generate(**settings):
        request = _instance("generate_until", ("The game was played in", settings))
        (text,) = lm.generate_until([request])
        return text, lm.generation_records[-1]

    free_text, free = generate(max_gen_toks=8)
    first = lm.tokenizer.decode(free["output_ids"][:1])
    assert free["generated_tokens"] > 1 and free_text.startswith(first)
    text, stopped = generate(max_gen_toks=8, until=[first])
    assert (text, stopped["output_ids"]) == ("", free["output_ids"][:1])  # stopped and cut
    text, cut_only = generate(max_gen_toks=8, until=[first], setdlm_until_stops=False)
    assert (text, cut_only["output_ids"]) == ("", free["output_ids"])  # decoding went on


def test_unknown_generation_settings_are_refused(trained_tiny):
    lm = _lm(trained_tiny, "ar")
    request = Instance(
        "generate_until", {}, ("Hello", {"until": ["\n"], "top_k": 5}), 0, ("toy", 3, 1)
    )
    with pytest.raises(ValueError, match=r"toy/3/0: generation settings \['top_k'\]"):
        lm.generate_until([request])


# --------------------------------------------------------------------------- log-likelihoods
@pytest.mark.parametrize("family", FAMILIES)
def test_loglikelihood_tasks_through_simple_evaluate(trained_tiny, task_manager, family):
    results = lm_eval.simple_evaluate(
        model="setdlm",
        model_args=_model_args(trained_tiny, family),
        tasks=["lambada_local", "wikitext_local"],
        task_manager=task_manager,
    )
    lambada = [s["resps"][0][0] for s in results["samples"]["lambada_local"]]
    assert len(lambada) == 8
    for log_likelihood, is_greedy in lambada:
        assert math.isfinite(log_likelihood) and log_likelihood <= 0.0
        assert isinstance(is_greedy, bool)
    # one noise draw of a bound can miss every scored token; the mean over 8 cannot be 0
    assert sum(ll for ll, _ in lambada) < 0.0
    wikitext = results["results"]["wikitext_local"]
    assert 1.0 < wikitext["byte_perplexity,none"] < 512 and wikitext["bits_per_byte,none"] > 0


def _instance(kind: str, arguments: tuple, doc_id: int = 0) -> Instance:
    return Instance(kind, {}, arguments, 0, ("toy", doc_id, 1))


def test_ar_loglikelihood_is_the_sum_of_its_token_log_probs(trained_tiny):
    lm = _lm(trained_tiny, "ar", batch_size=2)
    tokenizer = lm.tokenizer
    pairs = [("The game was played in", " front of a large crowd"), ("", " Robert Boulter")]
    requests = [_instance("loglikelihood", pair, i) for i, pair in enumerate(pairs)]
    scores = lm.loglikelihood(requests)
    for (context, continuation), (score, _) in zip(pairs, scores, strict=True):
        context_ids = [tokenizer.bos_token_id] + tokenizer(context)["input_ids"]
        continuation_ids = tokenizer(continuation)["input_ids"]
        ids = torch.tensor([context_ids + continuation_ids])
        context_mask = torch.zeros_like(ids, dtype=torch.bool)
        context_mask[0, : len(context_ids)] = True
        with torch.no_grad():
            output = lm.model.loss({"input_ids": ids, "context_mask": context_mask})
        token_log_probs = output.extras["target_log_probs"][0, len(context_ids) - 1 :]
        assert token_log_probs.shape[0] == len(continuation_ids)
        assert score == pytest.approx(float(token_log_probs.sum()), abs=1e-4)
        assert score < 0.0


def test_ar_rolling_loglikelihood(trained_tiny):
    lm = _lm(trained_tiny, "ar")
    text = "The game was played in front of a large crowd."
    (total,) = lm.loglikelihood_rolling([_instance("loglikelihood_rolling", (text,))])
    ((expected, _),) = lm.loglikelihood([_instance("loglikelihood", ("", text))])
    assert total == pytest.approx(expected, abs=1e-4)  # one window: the text after BOS
    long_text = " ".join([text] * 30)  # several windows of the model length
    (long_total,) = lm.loglikelihood_rolling([_instance("loglikelihood_rolling", (long_text,))])
    assert math.isfinite(long_total) and long_total < total


def test_long_contexts_are_truncated_from_the_left(trained_tiny):
    lm = _lm(trained_tiny, "ar")
    context = " ".join(["the crowd was large"] * 40)  # far longer than the 64-token model
    continuation = " and loud"
    ((score, _),) = lm.loglikelihood([_instance("loglikelihood", (context, continuation))])
    context_ids, continuation_ids = lm._encode_pair(context, continuation)
    kept = context_ids[-(lm.length - len(continuation_ids)) :]
    (expected,) = lm.score_continuations([(kept, continuation_ids)], ["toy/0/0"])
    assert score == pytest.approx(expected, abs=1e-6)
    too_long = " ".join(["word"] * 200)
    with pytest.raises(ValueError, match="use loglikelihood_rolling"):
        lm.loglikelihood([_instance("loglikelihood", ("A", too_long))])


@pytest.mark.parametrize("family", ["mdlm", "setdlm"])
def test_bounds_are_seeded_per_request(trained_tiny, family):
    pairs = [("The game was played in", " front of a large crowd"), ("He said", " nothing")]
    requests = [_instance("loglikelihood", pair, i) for i, pair in enumerate(pairs)]
    one = _lm(trained_tiny, family, batch_size=1, greedy_check=False).loglikelihood(requests)
    two = _lm(trained_tiny, family, batch_size=2, greedy_check=False).loglikelihood(requests[::-1])
    assert one == two[::-1]  # neither batch size nor order changes a score
    averaged = _lm(trained_tiny, family, mc_samples=8, greedy_check=False).loglikelihood(requests)
    for (score, _), (mean, _) in zip(one, averaged, strict=True):
        assert math.isfinite(mean) and mean < 0.0 and score <= 0.0


# ------------------------------------------------------------------------------ command line
def test_the_command_line_wrapper(trained_tiny, task_folder, tmp_path):
    code = harness.lm_eval_main(
        [
            "--model",
            "setdlm",
            "--model_args",
            _model_args(trained_tiny, "setdlm"),
            "--tasks",
            "gsm8k_setdlm_pareto",
            "--include_path",
            str(task_folder),
            "--limit",
            "2",
            "--gen_kwargs",
            f"max_gen_toks={NEW_TOKENS}",
            "--apply_chat_template",
            "--device",
            "cpu",
            "--output_path",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    (results_file,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]["gsm8k_setdlm_pareto"]
    assert results["sample_len"] == 2
    assert 0.0 <= results["exact_match,strict-match"] <= 1.0


def test_setdlm_lm_eval_refuses_a_missing_model_before_lm_eval_starts(tmp_path):
    """`setdlm lm-eval` names a model that cannot load before lm-eval imports and indexes its
    task files (about 10 s); arguments it cannot read it leaves to lm-eval."""
    from setdlm.commands.evaluation import _setdlm_pretrained

    missing = tmp_path / "no-such-model"
    script = (
        "import sys\n"
        "from setdlm.commands.evaluation import lm_eval\n"
        "from setdlm.checkpoints.folders import CheckpointError\n"
        "try:\n"
        f"    lm_eval(['--model', 'setdlm', '--model_args', 'pretrained={missing},seed=1',\n"
        "             '--tasks', 'gsm8k', '--limit', '1'])\n"
        "except CheckpointError as error:\n"
        "    print(error)\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'lm_eval'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [f"{missing}: no such model folder", "[]"]
    assert _setdlm_pretrained(["--model=setdlm", "--model_args=threshold=0.5,pretrained=a/b"]) == (
        "a/b"
    )
    assert _setdlm_pretrained(["--model", "hf", "--model_args", "pretrained=/x"]) is None
    assert _setdlm_pretrained(["--model", "setdlm", "--model_args", '{"pretrained": 1}']) is None


@pytest.mark.parametrize("family", ["ar", "bd3lm"])
def test_continuous_batching_returns_the_texts_of_batch_1_in_request_order(trained_tiny, family):
    contexts = ["The game was played in", "In 1990", "The river", "She said", "A new", "It"]
    # one configuration, so that the pool takes them all (one seed per request)
    requests = [
        _instance("generate_until", (context, {"max_gen_toks": 8}), i)
        for i, context in enumerate(contexts)
    ]
    one = _lm(trained_tiny, family)
    pooled = _lm(trained_tiny, family, batch_size=3, batching="continuous")
    assert pooled.generate_until(requests) == one.generate_until(requests)
    records = pooled.generation_records
    assert {(r["batching"], r["batch_size"]) for r in records} == {("continuous", 3)}
    assert [r["warmup"] for r in records].count(True) == 1
    assert pooled.speed_summary()["protocol"].startswith("continuous batching, 3 slots")
    assert one.speed_summary()["protocol"].startswith("batch 1: ")
    assert _lm(trained_tiny, family, batch_size=3).batching == "static"  # auto, on a CPU
