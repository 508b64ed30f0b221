"""The batching benchmark (``setdlm bench decode --continuous``) on its GSM8K-length workload:
random models whose rows stop where GSM8K's reference solutions end."""

from __future__ import annotations

from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.gsm8k import load_gsm8k
from setdlm.families import FAMILY_NAMES
from setdlm.recipes.bench import BenchSettings, bench_batching, gsm8k_length_workloads
from setdlm.util.paths import data_path

SETTINGS = BenchSettings(num_layers=1, hidden_size=64, prompt_tokens=8, new_tokens=120)


def test_each_row_stops_at_its_gsm8k_reference_length_static_and_pooled():
    lines = []
    workloads = gsm8k_length_workloads(SETTINGS, 6, log=lines.append)
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
    work = gsm8k_length_workloads(SETTINGS, 2, log=lambda line: None)[0]
    assert work.model.config.length >= 2 * SETTINGS.prompt_tokens + SETTINGS.new_tokens
    assert max(len(p) for p in work.prompts) + SETTINGS.new_tokens <= work.model.config.length
