"""The batching benchmark (``setdlm bench decode --continuous``) on its replayed-length workloads:
random models whose rows stop where GSM8K's reference solutions, or a run's outputs, end."""

from __future__ import annotations

import json

import pytest

from setdlm.data.tokenizers import load_tokenizer
from setdlm.families import FAMILY_NAMES
from setdlm.recipes.bench import BenchSettings, bench_batching, length_workloads, stop_lengths
from setdlm.tasks.gsm8k import load_gsm8k
from setdlm.util.errors import DataError
from setdlm.util.paths import data_path

SETTINGS = BenchSettings(num_layers=1, hidden_size=64, prompt_tokens=8, new_tokens=120)


def test_each_row_stops_at_its_gsm8k_reference_length_static_and_pooled():
    lines = []
    workloads = length_workloads(SETTINGS, 6, "gsm8k", log=lines.append)
    qwen3 = load_tokenizer(data_path("tokenizers", "qwen3"))
    references = [len(qwen3(p.answer)["input_ids"]) for p in load_gsm8k("test", limit=6)]
    assert [w.family for w in workloads] == list(FAMILY_NAMES)
    assert all(w.stop_after == references for w in workloads)
    # the first six are 47 to 210 tokens long: most stop inside the budget, two run to it
    assert min(references) < SETTINGS.new_tokens < max(references)
    assert lines[0].startswith("stop lengths: GSM8K test reference solutions in Qwen3 tokens")

    rows = bench_batching(workloads, (1, 4), (0.9,), log=lines.append)
    # (ar 1e6; three τ=0.9 families) x (B=1 static, B=4 static, B=4 continuous)
    assert len(rows) == 3 * len(FAMILY_NAMES)
    expected_tokens = sum(min(length, SETTINGS.new_tokens) for length in references)
    for row in rows:  # static and pooled alike (bench_batching checks they give equal tokens)
        assert round(row.tokens_per_second * row.wall_seconds) == expected_tokens, row


def test_the_workload_models_hold_the_longest_prompt_and_the_budget():
    work = length_workloads(SETTINGS, 2, "gsm8k", log=lambda line: None)[0]
    assert work.model.config.length >= 2 * SETTINGS.prompt_tokens + SETTINGS.new_tokens
    assert max(len(p) for p in work.prompts) + SETTINGS.new_tokens <= work.model.config.length


def test_stop_lengths_replay_a_runs_samples_without_touching_them(tmp_path):
    log = tmp_path / "samples.jsonl"
    lines = [json.dumps({"id": f"e{i}", "generated_tokens": n}) for i, n in enumerate((5, 0, 31))]
    log.write_text("\n".join(lines) + '\n{"id": "e3", "generated_tok')  # a torn last line
    before = log.read_bytes()
    lengths, what = stop_lengths(str(log), 7)
    assert lengths == [5, 1, 31, 5, 1, 31, 5]  # file order, cycling; 0 tokens: an EOS at once
    assert what == f"generated_tokens of {log}"
    assert log.read_bytes() == before  # read, never repaired


def test_stop_lengths_from_a_bad_file_say_which_and_what(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        stop_lengths(str(tmp_path / "missing.jsonl"), 3)
    log = tmp_path / "samples.jsonl"
    log.write_text(json.dumps({"id": "e0", "seconds": 1.0}) + "\n")
    with pytest.raises(DataError, match=r"samples.jsonl: record 'e0' has no generated_tokens"):
        stop_lengths(str(log), 3)
    log.write_text("not json\n")
    with pytest.raises(DataError, match="no sample records"):
        stop_lengths(str(log), 3)
