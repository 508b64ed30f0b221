"""Held-out likelihood runs for every family."""

from __future__ import annotations

import json

import pytest

from setdlm.checkpoints.folders import load_model
from setdlm.data.tokenizers import load_tokenizer
from setdlm.families import FAMILY_NAMES as FAMILIES
from setdlm.tasks.likelihood import run_likelihood


@pytest.mark.parametrize("family", FAMILIES)
def test_likelihood_run_for_every_family(trained_tiny, tmp_path, family):
    folder = trained_tiny / family / "model"
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    one = run_likelihood(model, tokenizer, "wikitext2", tmp_path / "one", limit=6, batch_size=4)
    three = run_likelihood(
        model, tokenizer, "wikitext2", tmp_path / "three", num_samples=3, limit=6, batch_size=4
    )
    quality = {name: metric["value"] for name, metric in one["quality"].items()}
    assert quality["sequences"] == 6 and quality["tokens"] > 0
    assert 1.0 < quality["nll"] < 7.0  # trained below ln(512) = 6.24, far from zero
    assert quality["perplexity"] > 1 and quality["bits_per_byte"] > 0
    three_nll = three["quality"]["nll"]
    if family == "ar":  # exact: Monte-Carlo draws change nothing
        assert three_nll["value"] == pytest.approx(quality["nll"], rel=1e-12)
        assert three_nll["definition"].startswith("exact NLL")
    else:
        assert three_nll["value"] != quality["nll"]
        assert "3 Monte-Carlo draws" in three_nll["definition"]
    # resume: a torn run finishes with the same numbers
    samples = (tmp_path / "one" / "samples.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "one" / "metrics.json").unlink()
    (tmp_path / "one" / "samples.jsonl").write_text("".join(samples[:3]) + samples[3][:10])
    resumed = run_likelihood(model, tokenizer, "wikitext2", tmp_path / "one", limit=6, batch_size=4)
    assert resumed["quality"] == one["quality"]
    # the batch cut short was recomputed whole, but no id was written twice
    lines = (tmp_path / "one" / "samples.jsonl").read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 6
    assert json.loads((tmp_path / "one" / "metrics.json").read_text())["config_hash"]
