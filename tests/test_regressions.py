"""The regression check has teeth: real decoder regressions, injected into the engine, the KV
cache and the family policies, fail ``setdlm check`` against a baseline written by the unchanged
decoder; the unchanged decoder passes.

Both ways CI can meet a baseline: recorded on this very CPU (exact comparison) and recorded on
another kind of CPU (faked here by editing the recorded numerics, so ``compare`` applies the
same across-numerics rules it applies on a real AVX2 or AVX-512 machine unlike the baseline's:
accuracy within the intervals, with no blanket factor for models the run trains; declared
relative tolerances for NFE and parallelism). Every regression fails on both.

The models are the default run's SetDLM and BD3LM recipes on the arithmetic problems, trained by
``setdlm train`` with fewer steps (about four minutes for both): accurate enough that a decoder
that loses all accuracy moves it past the statistical tolerance, which the test checks first.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from setdlm.cli import main as setdlm

MODELS = {
    "setdlm-smax8-arith": {"family": "setdlm", "d": 4, "window": 4},
    "bd3lm-s4-arith": {"family": "bd3lm", "block_size": 4},
}
TRAIN = {
    "corpus": "arithmetic",
    "problems": 20000,
    "length": 56,
    "steps": 1000,
    "batch_size": 32,
    "lr": 3.0e-3,
    "warmup_steps": 50,
    "ema_decay": 0.99,
}
# One token per forward, and nearly the whole window at once: where a window one short shows.
THRESHOLDS = ("1e6", "0.1")
PROBLEMS = "200"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("arith-models")
    config = {
        "name": "regressions",
        "models": {name: {**entry, "train": TRAIN} for name, entry in MODELS.items()},
        "tasks": {"arithmetic-solve": {"models": list(MODELS)}},
    }
    config_path = folder / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    previous = torch.get_num_threads()
    try:
        for name in MODELS:
            command = ["--threads", "2", "--quiet", "train", "--config", str(config_path)]
            assert setdlm([*command, "--model", name, "--out", str(folder / name)]) == 0
    finally:
        torch.set_num_threads(previous)
    return folder


def evaluate(models: Path, run: Path) -> Path:
    """The check's layout: RUN/arithmetic-solve/<model>/tau-<τ>/, every τ of THRESHOLDS."""
    for name in MODELS:
        out = run / "arithmetic-solve" / name
        # one thread, whatever the fixtures set: the numerics of every run here are the same
        command = ["--threads", "1", "--quiet", "eval", "arithmetic", "--model", str(models / name)]
        command += ["--out", str(out), "--limit", PROBLEMS, "--threshold", *THRESHOLDS]
        assert setdlm(command) == 0
    return run


@pytest.fixture(scope="module")
def baseline(models, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("baseline")
    run = evaluate(models, folder / "run")
    path = folder / "baseline.json"
    assert setdlm(["check", "--baseline", str(path), str(run), "--write"]) == 0
    return path


def recorded_elsewhere(baseline: Path, folder: Path) -> Path:
    """The same baseline as if written on another kind of CPU."""
    recorded = json.loads(baseline.read_text())
    for point in recorded["points"].values():
        capability = point["numerics"]["cpu_capability"]
        point["numerics"]["cpu_capability"] = f"not-{capability}"
    path = folder / "baseline-other-cpu.json"
    path.write_text(json.dumps(recorded))
    return path


def check(baseline: Path, run: Path) -> int:
    return setdlm(["check", "--baseline", str(baseline), str(run)])


# ------------------------------------------------------------------------- the regressions
def tau_ignored(monkeypatch):
    """Every step commits only its quota: τ has no effect."""
    from setdlm.core.decoding import engine

    original = engine.select_by_confidence
    monkeypatch.setattr(
        engine, "select_by_confidence", lambda c, d, k, t, **kw: original(c, d, k, math.inf, **kw)
    )


def confidence_inverted(monkeypatch):
    """The comparison flipped: the least confident predictions, and all below τ, commit."""
    from setdlm.core.decoding import engine

    original = engine.select_by_confidence
    inverted = lambda c, d, k, t, **kw: original([-v for v in c], d, k, -t, **kw)  # noqa: E731
    monkeypatch.setattr(engine, "select_by_confidence", inverted)


def window_off_by_one(monkeypatch):
    """SetDLM's sliding window one position short of W."""
    from setdlm.model import SlidingWindowPolicy

    original = SlidingWindowPolicy.__init__

    def shorter(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.window -= 1

    monkeypatch.setattr(SlidingWindowPolicy, "__init__", shorter)


def cache_commit_skipped(monkeypatch):
    """The tokens fed to be cached are never written to the KV cache."""
    from setdlm.core.kv_cache import KVCache

    original = KVCache.commit_prefix
    monkeypatch.setattr(
        KVCache, "commit_prefix", lambda self, counts, pos: original(self, [0] * len(counts), pos)
    )


def bd3lm_wrong_mask(monkeypatch):
    """BD3LM's block decoded with the wrong mask: its masked positions blind to each other
    and the clean tokens causal, as in SetDLM, instead of bidirectional within the block."""
    import baselines.bd3lm
    from setdlm.core import masks

    class WrongMasks:
        def __getattr__(self, name):
            return getattr(masks, name)

        @staticmethod
        def clean_then_noisy_mask(clean, noisy, **_):
            return masks.clean_then_noisy_mask(
                clean, noisy, clean_causal=True, noisy_see_each_other=False
            )

    monkeypatch.setattr(baselines.bd3lm, "masks", WrongMasks())


REGRESSIONS = [
    tau_ignored,
    confidence_inverted,
    window_off_by_one,
    cache_commit_skipped,
    bd3lm_wrong_mask,
]


# ------------------------------------------------------------------------------ the tests
def test_the_unchanged_decoder_passes_on_this_cpu_and_against_another(
    models, baseline, tmp_path, capsys
):
    run = evaluate(models, tmp_path / "run")
    assert check(baseline, run) == 0
    assert "PASSED" in capsys.readouterr().out
    assert check(recorded_elsewhere(baseline, tmp_path), run) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "compared by the across-numerics rules" in out


def test_the_models_are_accurate_enough_for_the_statistical_rule_to_bite(baseline):
    """A broken decoder can only lose accuracy the check sees if there is accuracy to lose:
    every point's accuracy exceeds the tolerance against an accuracy of 0."""
    from setdlm.report.check import statistical_tolerance

    points = json.loads(baseline.read_text())["points"]
    for key, point in points.items():
        accuracy = point["metrics"]["quality.strict_match.value"]
        lost = statistical_tolerance(accuracy["bootstrap_95"], [0.0, 0.0], int(PROBLEMS))
        assert accuracy["value"] > lost, (key, accuracy, lost)
    setdlm_fast = points["arithmetic-solve/setdlm-smax8-arith/tau-0.1"]["metrics"]
    assert setdlm_fast["speed.parallelism_mean"]["value"] > 1.5  # τ = 0.1 decodes in parallel


@pytest.mark.parametrize("regression", REGRESSIONS, ids=lambda r: r.__name__)
def test_a_decoder_regression_fails_the_check_on_any_cpu(
    regression, models, baseline, tmp_path, monkeypatch, capsys
):
    regression(monkeypatch)
    run = evaluate(models, tmp_path / "run")
    monkeypatch.undo()
    assert check(baseline, run) == 1
    assert "FAILED" in capsys.readouterr().out
    elsewhere = check(recorded_elsewhere(baseline, tmp_path), run)
    assert elsewhere == 1  # no blanket training factor hides an accuracy-only regression
    assert "FAILED" in capsys.readouterr().out
