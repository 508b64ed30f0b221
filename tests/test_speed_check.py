"""`setdlm check-speed`: the engine's time per step relative to the backbone's, against the
committed reference. Only the failing direction is asserted (a timing can always pass by luck;
a 2 ms stall per step on a ~1 ms forward cannot)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from setdlm.core.decoding import engine
from setdlm.report import speed_check
from setdlm.report.speed_check import SpeedCheckError, compare, load_reference


def test_a_slower_engine_step_fails_the_committed_reference(monkeypatch):
    reference = load_reference(Path(__file__).parents[1] / speed_check.DEFAULT_BASELINE)
    decode_targets = engine._decode_targets

    def stalled(*args, **kwargs):  # what a sync or a costlier confidence would add
        time.sleep(0.002)
        return decode_targets(*args, **kwargs)

    monkeypatch.setattr(engine, "_decode_targets", stalled)
    monkeypatch.setattr(speed_check, "REPEATS", 1)
    ratios = speed_check.measure(log=lambda line: None)
    assert set(ratios) == set(reference["host_per_forward"])
    problems = compare(reference, ratios)
    assert len(problems) == len(ratios), problems  # every variant over its bound


def test_a_missing_variant_is_a_failure_and_a_bad_reference_a_clear_error(tmp_path):
    reference = {"format": 1, "factor": 1.5, "host_per_forward": {"ar/1e+06": 0.2, "x/1": 0.1}}
    assert compare(reference, {"ar/1e+06": 0.29, "x/1": 0.1}) == []
    assert compare(reference, {"ar/1e+06": 0.31, "x/1": 0.1})[0].startswith("ar/1e+06")
    assert "not measured" in compare(reference, {"ar/1e+06": 0.2})[0]
    path = tmp_path / "speed.json"
    path.write_text(json.dumps({"format": 1, "host_per_forward": {}}))
    with pytest.raises(SpeedCheckError, match="speed.json: not an engine speed reference"):
        load_reference(path)
    with pytest.raises(SpeedCheckError, match="check-speed --write"):
        load_reference(tmp_path / "missing.json")


@pytest.mark.e2e
def test_two_revisions_decode_the_same_weights_in_turns(tmp_path):
    """`setdlm bench decode --against HEAD`: the committed revision in a worker of its own
    (exported, the checkout untouched) against this tree, every variant with its ratio."""
    from setdlm.recipes.bench import BenchSettings
    from setdlm.recipes.bench_revisions import compare_revisions

    settings = BenchSettings(num_layers=1, hidden_size=64, new_tokens=8, prompt_tokens=8)
    rows = compare_revisions("HEAD", settings, rounds=2, log=lambda line: None)
    assert [(r.family, r.threshold) for r in rows] == [
        ("ar", 1e6),
        ("mdlm", 1e6),
        ("mdlm", 0.9),
        ("bd3lm", 1e6),
        ("bd3lm", 0.9),
        ("setdlm", 1e6),
        ("setdlm", 0.9),
    ]
    for row in rows:
        assert row.ratio_low <= row.ratio <= row.ratio_high and row.ratio > 0
        assert row.this_nfe > 0 and row.that_nfe > 0
    with pytest.raises(Exception, match="not a commit"):
        compare_revisions("no-such-revision", settings, rounds=2, log=lambda line: None)
