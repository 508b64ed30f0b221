"""The shared evaluation runner: one result format, one timer, resumable runs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from setdlm.baselines.mdlm import SemiAutoregressiveOptions
from setdlm.checkpoints.folders import load_model
from setdlm.core.decoding import DecodeConfig
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.records import SampleLog, example_seed
from setdlm.eval.runner import Example, RunSettings, Task, run_evaluation
from setdlm.report.compare import RUN_FIELDS
from setdlm.util.files import sha256_file

# how a run went (the comparison's own list), whether a sample was a warm-up one and whether
# it was timed for speed
TIMING_FIELDS = RUN_FIELDS | {"warmup", "timed"}


class Continuation(Task):
    """Continue held-out WikiText-2 prompts; score = share of reference tokens reproduced."""

    name = "continuation"

    def __init__(self, count: int = 5, fail_after: int | None = None):
        self.count, self.fail_after, self.scored = count, fail_after, 0

    def settings(self) -> dict:
        return {"count": self.count}

    def examples(self, tokenizer, model):
        from setdlm.data.text import ChunkedLMDataset, load_wikitext2

        chunks = ChunkedLMDataset(load_wikitext2().heldout, tokenizer, 24)
        return [
            Example(
                id=f"chunk-{i}",
                input_ids=chunks[i]["input_ids"][:16].tolist(),
                prompt=tokenizer.decode(chunks[i]["input_ids"][1:16]),
                reference=chunks[i]["input_ids"][16:].tolist(),
            )
            for i in range(self.count)
        ]

    def decode_config(self, base, tokenizer):
        return base.replace(max_new_tokens=8)

    def score(self, example, text):
        self.scored += 1
        if self.fail_after is not None and self.scored > self.fail_after:
            raise KeyboardInterrupt("killed")
        return {"length": len(text)}

    def aggregate(self, records):
        mean = sum(r["scores"]["length"] for r in records) / len(records)
        return {"mean_length": {"value": mean, "definition": "characters per output"}}


def _load(random_tiny, family):
    folder = random_tiny / family / "model"
    return load_model(folder), load_tokenizer(folder)


def _outputs(folder):
    records = SampleLog(folder / "samples.jsonl").load()
    return {k: {f: v for f, v in r.items() if f not in TIMING_FIELDS} for k, r in records.items()}


SAMPLED = DecodeConfig(do_sample=True, top_p=0.9, confidence_threshold=0.3)


def test_a_run_writes_samples_and_metrics(random_tiny, tmp_path):
    model, tokenizer = _load(random_tiny, "setdlm")
    metrics = run_evaluation(Continuation(), model, tokenizer, SAMPLED, tmp_path / "run")
    lines = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == metrics["examples"] == 5
    record = json.loads(lines[0])
    for key in (
        "id",
        "prompt",
        "output_text",
        "output_ids",
        "reference",
        "scores",
        "generated_tokens",
        "nfe",
        "parallelism",
        "seconds",
    ):
        assert key in record
    speed = metrics["speed"]
    assert speed["timed_examples"] == 4 and speed["warmup_examples"] == 1
    assert speed["tokens_per_second_aggregate"] > 0 and speed["nfe_mean"] > 0
    assert speed["latency_seconds_p95"] >= speed["latency_seconds_p50"] > 0
    assert metrics["quality"]["mean_length"]["definition"]
    assert metrics["hardware"]["cpu_count"] and metrics["software"]["torch"]
    assert len(metrics["config_hash"]) == 16
    # the log it was computed from (a workflow's start skips parsing it while it is unchanged)
    assert metrics["samples_sha256"] == sha256_file(tmp_path / "run" / "samples.jsonl")
    # a finished run is not recomputed
    again = run_evaluation(Continuation(), model, tokenizer, SAMPLED, tmp_path / "run")
    assert again == metrics


def test_a_killed_run_resumes_to_the_same_results(random_tiny, tmp_path):
    model, tokenizer = _load(random_tiny, "mdlm")
    config = SAMPLED.replace(policy=SemiAutoregressiveOptions(block_size=8))
    straight = run_evaluation(Continuation(), model, tokenizer, config, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(Continuation(fail_after=2), model, tokenizer, config, tmp_path / "killed")
    log = tmp_path / "killed" / "samples.jsonl"
    assert len(log.read_text().splitlines()) == 2
    with open(log, "a") as handle:
        handle.write('{"id": "chunk-2", "prompt": "torn')  # died in the middle of a line
    resumed = run_evaluation(Continuation(), model, tokenizer, config, tmp_path / "killed")
    assert resumed["quality"] == straight["quality"]
    assert resumed["samples_sha256"] == sha256_file(log)  # the log as repaired, torn line gone
    assert _outputs(tmp_path / "killed") == _outputs(tmp_path / "straight")
    # warm-up belongs to the examples, not to the process: the resumed run times the same ones
    counted = ("timed_examples", "warmup_examples", "generated_tokens", "nfe_mean", "nfe_total")
    assert {k: resumed["speed"][k] for k in counted} == {k: straight["speed"][k] for k in counted}


def test_warm_up_is_the_first_examples_in_a_batch_of_their_own(random_tiny, tmp_path):
    model, tokenizer = _load(random_tiny, "setdlm")
    settings = RunSettings(batch_size=3, warmup_examples=1)
    metrics = run_evaluation(Continuation(), model, tokenizer, SAMPLED, tmp_path / "run", settings)
    records = SampleLog(tmp_path / "run" / "samples.jsonl").load()
    assert [r["warmup"] for r in records.values()] == [True, False, False, False, False]
    assert [r["batch_size"] for r in records.values()] == [1, 3, 3, 3, 1]
    assert metrics["speed"]["timed_examples"] == 4


def test_batch_size_does_not_change_results(random_tiny, tmp_path):
    model, tokenizer = _load(random_tiny, "bd3lm")
    one = run_evaluation(Continuation(), model, tokenizer, SAMPLED, tmp_path / "one")
    three = run_evaluation(
        Continuation(), model, tokenizer, SAMPLED, tmp_path / "three", RunSettings(batch_size=3)
    )
    assert one["config_hash"] == three["config_hash"]
    assert _outputs(tmp_path / "one") == _outputs(tmp_path / "three")


@pytest.mark.parametrize("family", ["ar", "setdlm"])
def test_continuous_batching_gives_the_samples_of_batch_1_and_says_how_it_was_timed(
    random_tiny, tmp_path, family
):
    model, tokenizer = _load(random_tiny, family)
    task = Continuation(count=7)
    one = run_evaluation(task, model, tokenizer, SAMPLED, tmp_path / "one")
    pooled_settings = RunSettings(batch_size=3, batching="continuous")
    pooled = run_evaluation(task, model, tokenizer, SAMPLED, tmp_path / "pool", pooled_settings)
    assert pooled["config_hash"] == one["config_hash"]  # batching is not part of the result
    assert _outputs(tmp_path / "pool") == _outputs(tmp_path / "one")
    assert pooled["quality"] == one["quality"]
    records = SampleLog(tmp_path / "pool" / "samples.jsonl").load()
    assert {(r["batching"], r["batch_size"]) for r in records.values()} == {("continuous", 3)}
    assert [r["warmup"] for r in records.values()].count(True) == 1
    assert one["speed"]["protocol"].startswith("batch 1: ")
    assert pooled["speed"]["protocol"].startswith("continuous batching, 3 slots: ")
    assert pooled["run"]["batching"] == "continuous"
    timed = [r for r in records.values() if not r["warmup"]]
    # each row's own time in the pool, and its share of the run (time since the previous
    # row finished), which add up to the run: aggregate tok/s is tokens over the run's time
    assert all(r["latency_seconds"] > 0 and r["seconds"] >= 0 for r in timed)
    assert pooled["speed"]["tokens_per_second_aggregate"] == pytest.approx(
        sum(r["generated_tokens"] for r in timed) / sum(r["seconds"] for r in timed)
    )


def test_a_continuous_run_that_is_killed_resumes_to_the_same_samples(random_tiny, tmp_path):
    model, tokenizer = _load(random_tiny, "setdlm")
    settings = RunSettings(batch_size=3, batching="continuous")
    straight = run_evaluation(
        Continuation(count=7), model, tokenizer, SAMPLED, tmp_path / "straight", settings
    )
    with pytest.raises(KeyboardInterrupt):  # dies while scoring the 4th example to finish
        run_evaluation(
            Continuation(count=7, fail_after=3),
            model,
            tokenizer,
            SAMPLED,
            tmp_path / "killed",
            settings,
        )
    assert len(SampleLog(tmp_path / "killed" / "samples.jsonl").load()) == 3  # saved as finished
    resumed = run_evaluation(
        Continuation(count=7), model, tokenizer, SAMPLED, tmp_path / "killed", settings
    )
    assert _outputs(tmp_path / "killed") == _outputs(tmp_path / "straight")
    assert resumed["quality"] == straight["quality"]


@pytest.mark.parametrize("family", ["mdlm", "bd3lm", "setdlm"])
def test_a_speed_subset_times_batch_1_and_counts_every_example_as_batch_1_would(
    random_tiny, tmp_path, family
):
    """The warm-up and the next ``timed_examples`` examples are decoded one at a time and
    timed; the rest in batches, untimed: their tokens, NFE and parallelism are batch 1's."""
    model, tokenizer = _load(random_tiny, family)
    task = Continuation(count=9)
    one = run_evaluation(task, model, tokenizer, SAMPLED, tmp_path / "one")
    settings = RunSettings(batch_size=4, warmup_examples=1, timed_examples=3)
    subset = run_evaluation(task, model, tokenizer, SAMPLED, tmp_path / "subset", settings)
    assert _outputs(tmp_path / "subset") == _outputs(tmp_path / "one")
    assert subset["quality"] == one["quality"]
    records = list(SampleLog(tmp_path / "subset" / "samples.jsonl").load().values())
    assert [r["warmup"] for r in records] == [True] + [False] * 8
    assert [r["timed"] for r in records] == [False, True, True, True] + [False] * 5
    assert [r["batch_size"] for r in records] == [1, 1, 1, 1, 4, 4, 4, 4, 1]
    counted = ("generated_tokens", "nfe_mean", "nfe_total", "parallelism_mean")
    assert {k: subset["speed"][k] for k in counted} == {k: one["speed"][k] for k in counted}
    speed = subset["speed"]
    assert (speed["timed_examples"], speed["counted_examples"]) == (3, 8)
    timed = records[1:4]
    assert speed["tokens_per_second_mean"] == pytest.approx(
        sum(r["generated_tokens"] / r["latency_seconds"] for r in timed) / 3
    )
    assert speed["protocol"].startswith("batch 1: ")
    assert "timed on 3 of the 8 examples after the warm-up" in speed["protocol"]


def test_a_run_with_a_speed_subset_that_is_killed_resumes_to_the_same_results(
    random_tiny, tmp_path
):
    model, tokenizer = _load(random_tiny, "setdlm")
    settings = RunSettings(batch_size=3, timed_examples=2)
    straight = run_evaluation(
        Continuation(count=8), model, tokenizer, SAMPLED, tmp_path / "straight", settings
    )
    with pytest.raises(KeyboardInterrupt):  # dies in its first batch after the timed ones
        run_evaluation(
            Continuation(count=8, fail_after=4),
            model,
            tokenizer,
            SAMPLED,
            tmp_path / "killed",
            settings,
        )
    resumed = run_evaluation(
        Continuation(count=8), model, tokenizer, SAMPLED, tmp_path / "killed", settings
    )
    assert _outputs(tmp_path / "killed") == _outputs(tmp_path / "straight")
    counted = ("timed_examples", "counted_examples", "nfe_total", "parallelism_mean")
    assert {k: resumed["speed"][k] for k in counted} == {k: straight["speed"][k] for k in counted}


@pytest.mark.parametrize("timed_examples", [None, 2])
def test_a_point_in_shards_merges_to_the_samples_and_quality_of_one_run(
    random_tiny, tmp_path, timed_examples
):
    """Three shards (contiguous slices), each decoded by itself, merged: the samples of the
    whole run in its order, its quality and counted speed exactly; each shard warms up on its
    own first timed example (the task's warm-up example is shard 0's)."""
    from setdlm.eval.runner import merge_shards

    model, tokenizer = _load(random_tiny, "setdlm")
    task = Continuation(count=8)
    settings = RunSettings(batch_size=2, timed_examples=timed_examples)
    whole = run_evaluation(task, model, tokenizer, SAMPLED, tmp_path / "whole", settings)
    shards = [tmp_path / "point" / "shards" / f"{index}-of-3" for index in range(3)]
    for index, folder in enumerate(shards):
        sliced = dataclasses.replace(settings, shard=(index, 3))
        marker = run_evaluation(task, model, tokenizer, SAMPLED, folder, sliced)
        assert marker["shard"] == [index, 3] and not (folder / "metrics.json").exists()
    assert [len(SampleLog(f / "samples.jsonl").load()) for f in shards] == [2, 3, 3]
    assert merge_shards(tmp_path / "point", shards) == 8
    merged = run_evaluation(task, model, tokenizer, SAMPLED, tmp_path / "point", settings)
    assert _outputs(tmp_path / "point") == _outputs(tmp_path / "whole")

    def order(folder):
        return [json.loads(line)["id"] for line in (folder / "samples.jsonl").open()]

    assert order(tmp_path / "point") == order(tmp_path / "whole")
    assert json.dumps(merged["quality"]) == json.dumps(whole["quality"])
    assert merged["config_hash"] == whole["config_hash"]
    counted = ("timed_examples", "counted_examples", "nfe_total", "parallelism_mean")
    assert {k: merged["speed"][k] for k in counted} == {k: whole["speed"][k] for k in counted}


def test_shards_of_two_configurations_are_not_merged(random_tiny, tmp_path):
    from setdlm.eval.runner import ResultFolderTaken, merge_shards

    model, tokenizer = _load(random_tiny, "ar")
    shards = [tmp_path / "shards" / f"{index}-of-2" for index in range(2)]
    for index, (folder, config) in enumerate(zip(shards, [SAMPLED, DecodeConfig()], strict=True)):
        run_evaluation(
            Continuation(count=4), model, tokenizer, config, folder, RunSettings(shard=(index, 2))
        )
    with pytest.raises(ResultFolderTaken, match="several configurations"):
        merge_shards(tmp_path / "point", shards)


def test_a_speed_subset_needs_at_least_one_timed_example():
    with pytest.raises(ValueError, match="timed_examples must be at least 1"):
        RunSettings(timed_examples=0)


def test_batching_must_be_static_or_continuous():
    with pytest.raises(ValueError, match="batching must be one of"):
        RunSettings(batching="dynamic")


def test_a_folder_never_mixes_two_configurations(random_tiny, tmp_path):
    model, tokenizer = _load(random_tiny, "ar")
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(
            Continuation(fail_after=1), model, tokenizer, DecodeConfig(), tmp_path / "run"
        )
    with pytest.raises(ValueError, match="holds samples of configuration"):
        run_evaluation(
            Continuation(), model, tokenizer, DecodeConfig(repetition_penalty=1.2), tmp_path / "run"
        )


def test_example_seeds_depend_only_on_base_seed_and_id():
    assert example_seed(1, "a") == example_seed(1, "a")
    assert len({example_seed(1, "a"), example_seed(2, "a"), example_seed(1, "b")}) == 3


def test_the_log_keeps_the_first_complete_line_of_each_id_and_repairs_the_file(tmp_path):
    """Two writers on one folder, or a kill mid-batch: repeated ids and torn lines anywhere."""
    path = tmp_path / "samples.jsonl"
    lines = [
        '{"id": "a", "v": 1}',
        '{"id": "b", "v": 2',  # torn by an interleaved writer
        '{"id": "a", "v": 9}',  # a second writer's copy
        "[1, 2]",  # not a record
        '{"id": "c", "v": 3}',
    ]
    path.write_text("\n".join(lines) + '\n{"id": "d"')  # and a torn last line
    records = SampleLog(path).load()
    assert {k: r["v"] for k, r in records.items()} == {"a": 1, "c": 3}
    assert path.read_text() == '{"id": "a", "v": 1}\n{"id": "c", "v": 3}\n'
    assert SampleLog(path).load() == records  # nothing left to repair
