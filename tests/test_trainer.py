"""The trainer: bitwise resume, checkpoints, NaN guard, LR schedule, EMA, and real learning."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import setdlm.train.run as run_module
from setdlm.core.outputs import LossOutput
from setdlm.data.text import ChunkedLMDataset, load_wikitext2
from setdlm.data.tokenizers import SpecialTokens, train_bpe_tokenizer
from setdlm.train import (
    ExponentialMovingAverage,
    NonFiniteLossError,
    TrainConfig,
    latest_checkpoint,
    load_weights,
    lr_multiplier,
    train,
)
from setdlm.train.checkpoint import read_manifest, verify_checkpoint, write_checkpoint
from setdlm.train.preemption import Preempted

VOCAB = 64
LENGTH = 12


class SimulatedCrash(RuntimeError):
    pass


class TinyLM(torch.nn.Module):
    """Next-token LM: embedding, dropout, linear head. Its loss counts a random 90% of the
    targets, drawn from the generator, so mishandled generator state changes the result."""

    def __init__(self, vocab_size: int = VOCAB, hidden: int = 16, tie_weights: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, hidden)
        self.dropout = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(hidden, vocab_size)
        if tie_weights:
            self.head.weight = self.embed.weight
        self.calls = 0
        self.nan_at_call: int | None = None
        self.crash_at_call: int | None = None
        self.signal_at_call: tuple[int, int] | None = None  # (call, signal) sent to ourselves

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.embed(input_ids)))  # (B, L, V)

    def loss(self, batch: dict[str, torch.Tensor], *, generator: torch.Generator) -> LossOutput:
        self.calls += 1
        if self.calls == self.crash_at_call:
            raise SimulatedCrash(f"simulated crash in loss call {self.calls}")
        if self.signal_at_call and self.calls == self.signal_at_call[0]:
            os.kill(os.getpid(), self.signal_at_call[1])  # delivered as a real signal
        input_ids = batch["input_ids"]  # (B, L)
        logits = self.logits(input_ids[:, :-1])  # (B, L-1, V)
        targets = input_ids[:, 1:]  # (B, L-1)
        draws = torch.rand(targets.shape, generator=generator, device=generator.device)
        counted = draws.to(targets.device) < 0.9  # (B, L-1)
        counted &= batch["attention_mask"][:, 1:].bool()
        nlls = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * counted
        loss = (nlls.sum(1) / counted.sum(1).clamp(min=1)).mean()
        if self.calls == self.nan_at_call:
            loss = loss * float("nan")
        first = torch.zeros_like(nlls[:, :1])  # position 0 is never a target
        return LossOutput(
            loss, torch.cat([first, nlls], 1), torch.cat([first, counted.float()], 1).long()
        )


def tiny_model(seed: int = 0, **kwargs) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(**kwargs)


@pytest.fixture(scope="module")
def dataset():
    # Arithmetic sequences (random start and stride, mod VOCAB): learnable, all different.
    generator = torch.Generator().manual_seed(0)
    starts = torch.randint(0, VOCAB, (96, 1), generator=generator)
    steps = torch.randint(1, 4, (96, 1), generator=generator)
    input_ids = (starts + steps * torch.arange(LENGTH)) % VOCAB  # (N, L)
    return [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in input_ids]


def config(**overrides) -> TrainConfig:
    values = dict(
        max_steps=8,
        batch_size=4,
        lr=3e-2,
        warmup_steps=2,
        schedule="cosine",
        final_lr_fraction=0.1,
        ema_decay=0.9,
        checkpoint_every=2,
        keep_last=3,
        log_every=1,
        seed=11,
    )
    return TrainConfig(**{**values, **overrides})


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def without_seconds(log: list[dict]) -> list[dict]:
    return [{key: value for key, value in row.items() if key != "seconds"} for row in log]


def assert_same_tensors(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert torch.equal(left[name], right[name]), f"{name} differs"


# --- resume -------------------------------------------------------------------------------


@pytest.mark.parametrize("grad_accum_steps", [1, 3])
def test_interrupted_and_resumed_run_is_bitwise_identical(tmp_path, dataset, grad_accum_steps):
    settings = config(grad_accum_steps=grad_accum_steps)
    reference = tiny_model()
    full = train(reference, dataset, settings, tmp_path / "full", progress=False)
    assert full.final_step == 8 and full.checkpoint_path.name == "step-00000008"

    crashing = tiny_model()
    # Die in the middle of step 5 (its last micro-batch), after the step-4 checkpoint.
    crashing.crash_at_call = 4 * grad_accum_steps + grad_accum_steps
    with pytest.raises(SimulatedCrash):
        train(crashing, dataset, settings, tmp_path / "resumed", progress=False)
    assert latest_checkpoint(tmp_path / "resumed" / "checkpoints").name == "step-00000004"
    with open(tmp_path / "resumed" / "losses.jsonl", "a") as log:
        log.write('{"step": 5, "lo')  # a line torn by the crash: dropped on resume

    fresh = tiny_model(seed=123)  # different initial weights: the checkpoint must restore them
    resumed = train(fresh, dataset, settings, tmp_path / "resumed", progress=False)
    assert resumed.final_step == 8 and resumed.final_loss == full.final_loss
    assert fresh.calls == 4 * grad_accum_steps  # it resumed at step 5, not from scratch
    assert_same_tensors(reference.state_dict(), fresh.state_dict())
    for name in ("ema.safetensors", "optimizer.safetensors", "model.safetensors"):
        assert (full.checkpoint_path / name).read_bytes() == (
            resumed.checkpoint_path / name
        ).read_bytes(), name
    assert without_seconds(read_log(full.losses_path)) == without_seconds(
        read_log(resumed.losses_path)
    )
    assert [row["step"] for row in read_log(resumed.losses_path)] == list(range(1, 9))


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM, signal.SIGINT])
def test_a_preemption_signal_checkpoints_the_current_step_and_resumes_bitwise(
    tmp_path, dataset, signum
):
    settings = config(grad_accum_steps=2)  # checkpoints every 2 steps
    reference = tiny_model()
    train(reference, dataset, settings, tmp_path / "full", progress=False)

    preempted = tiny_model()
    preempted.signal_at_call = (5, signum)  # in step 3's first micro-batch
    before = signal.getsignal(signum)
    with pytest.raises(Preempted) as stop:
        train(preempted, dataset, settings, tmp_path / "preempted", progress=False)
    assert (stop.value.signal_name, stop.value.step) == (signum.name, 3)
    assert preempted.calls == 6  # step 3 was finished, nothing after it was started
    # step 3 is saved although the cadence would have saved only step 2
    assert latest_checkpoint(tmp_path / "preempted" / "checkpoints").name == "step-00000003"
    assert signal.getsignal(signum) == before  # the handlers are given back

    fresh = tiny_model(seed=5)
    train(fresh, dataset, settings, tmp_path / "preempted", progress=False)
    assert fresh.calls == 2 * 5  # steps 4-8 only
    assert_same_tensors(reference.state_dict(), fresh.state_dict())
    assert without_seconds(read_log(tmp_path / "full" / "losses.jsonl")) == without_seconds(
        read_log(tmp_path / "preempted" / "losses.jsonl")
    )


def test_grad_accumulation_matches_one_big_batch(tmp_path, dataset):
    # Same 8 sequences per update either way (the loader cuts consecutive slices of one order);
    # dropout off so that the only randomness is the generator's stream.
    big, accumulated = tiny_model(), tiny_model()
    big.dropout.p = accumulated.dropout.p = 0.0
    train(big, dataset, config(max_steps=3, batch_size=8), tmp_path / "big", progress=False)
    settings = config(max_steps=3, batch_size=4, grad_accum_steps=2)
    train(accumulated, dataset, settings, tmp_path / "accumulated", progress=False)
    accumulated_weights = accumulated.state_dict()
    for name, weight in big.state_dict().items():
        torch.testing.assert_close(weight, accumulated_weights[name], rtol=1e-5, atol=1e-6)


def test_resume_refuses_a_changed_config_and_an_unasked_overwrite(tmp_path, dataset):
    train(tiny_model(), dataset, config(max_steps=2), tmp_path, progress=False)
    with pytest.raises(FileExistsError, match="step-00000002"):
        train(tiny_model(), dataset, config(max_steps=4), tmp_path, resume=False, progress=False)
    with pytest.raises(ValueError, match=r"lr: checkpoint 0\.03, now 0\.01"):
        train(tiny_model(), dataset, config(max_steps=2, lr=1e-2), tmp_path, progress=False)
    done = train(tiny_model(), dataset, config(max_steps=2, log_every=5), tmp_path)
    assert done.final_step == 2 and done.final_loss is not None  # nothing left to do


def test_a_constant_schedule_run_can_be_extended(tmp_path, dataset):
    constant = dict(schedule="constant", warmup_steps=2)
    train(tiny_model(), dataset, config(max_steps=4, **constant), tmp_path / "a", progress=False)
    extended = tiny_model(seed=1)
    train(extended, dataset, config(max_steps=7, **constant), tmp_path / "a", progress=False)
    straight = tiny_model()
    train(straight, dataset, config(max_steps=7, **constant), tmp_path / "b", progress=False)
    assert_same_tensors(straight.state_dict(), extended.state_dict())
    # Under a cosine schedule max_steps sets the rates, so it cannot change on resume.
    train(tiny_model(), dataset, config(max_steps=4), tmp_path / "cosine", progress=False)
    with pytest.raises(ValueError, match="max_steps: checkpoint 4, now 6"):
        train(tiny_model(), dataset, config(max_steps=6), tmp_path / "cosine", progress=False)


# --- checkpoints --------------------------------------------------------------------------


def test_checkpoint_round_trip_reproduces_outputs_exactly(tmp_path, dataset):
    model = tiny_model(tie_weights=True)
    result = train(model, dataset, config(max_steps=4), tmp_path, progress=False)
    inputs = torch.stack([item["input_ids"] for item in dataset[:8]])  # (8, L)
    model.eval()
    expected = model.logits(inputs)

    restored = tiny_model(seed=5, tie_weights=True).eval()
    assert load_weights(restored, result.checkpoint_path, use_ema=False) == "raw"
    assert torch.equal(restored.logits(inputs), expected)
    assert restored.head.weight is restored.embed.weight  # still tied after loading

    averaged = tiny_model(seed=6, tie_weights=True).eval()
    assert load_weights(averaged, result.checkpoint_path) == "ema"
    assert not torch.equal(averaged.logits(inputs), expected)  # EMA lags the raw weights
    # After 4 updates with decay 0.9 the average has moved less far from the initial weights.
    initial = dict(tiny_model(tie_weights=True).named_parameters())
    trained = dict(model.named_parameters())
    for name, param in averaged.named_parameters():
        moved = (param - initial[name]).abs().max()
        assert 0 < moved < (trained[name] - initial[name]).abs().max(), name


def test_only_the_last_k_checkpoints_are_kept(tmp_path, dataset):
    result = train(tiny_model(), dataset, config(max_steps=9, keep_last=2), tmp_path)
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "manifest.json",
        "step-00000008",
        "step-00000009",  # the final step is always saved
    ]
    assert [entry["step"] for entry in read_manifest(checkpoints)] == [8, 9]
    assert result.checkpoint_path == checkpoints / "step-00000009"
    verify_checkpoint(result.checkpoint_path)


def test_a_crash_while_writing_leaves_no_partial_checkpoint(tmp_path, dataset, monkeypatch):
    real_save_file = run_module.save_file
    calls = {"n": 0}

    def save_file_that_dies_in_the_second_checkpoint(tensors, path):
        calls["n"] += 1
        if calls["n"] == 4:  # checkpoint 1 wrote 3 files with save_file; die in checkpoint 2
            Path(path).write_bytes(b"half a file")
            raise OSError("disk full (simulated)")
        real_save_file(tensors, path)

    monkeypatch.setattr(run_module, "save_file", save_file_that_dies_in_the_second_checkpoint)
    with pytest.raises(OSError, match="disk full"):
        train(tiny_model(), dataset, config(max_steps=6), tmp_path, progress=False)
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["manifest.json", "step-00000002"]
    verify_checkpoint(checkpoints / "step-00000002")

    monkeypatch.setattr(run_module, "save_file", real_save_file)
    resumed = train(tiny_model(), dataset, config(max_steps=6), tmp_path, progress=False)
    uninterrupted = train(tiny_model(), dataset, config(max_steps=6), tmp_path / "b")
    model_file = "model.safetensors"
    assert (resumed.checkpoint_path / model_file).read_bytes() == (
        uninterrupted.checkpoint_path / model_file
    ).read_bytes()


def test_write_checkpoint_cleans_up_after_a_failing_writer(tmp_path):
    def good(path: Path) -> None:
        path.write_text("ok")

    def failing(path: Path) -> None:
        path.write_text("partial")
        raise KeyboardInterrupt

    write_checkpoint(tmp_path, 1, {"a.bin": good}, {"note": 1}, keep_last=2)
    manifest_before = (tmp_path / "manifest.json").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, 2, {"a.bin": good, "b.bin": failing}, {}, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "step-00000001"]
    assert (tmp_path / "manifest.json").read_bytes() == manifest_before


def test_staging_files_of_writes_killed_midway_are_gone_when_the_training_resumes(
    tmp_path, dataset
):
    """A SIGKILL between a staging file's write and its rename skips every ``finally``: the
    staging file stays (CI once found a manifest's). The training that resumes removes them,
    and only them: a file that merely looks like one (no PID) is kept."""
    train(tiny_model(), dataset, config(max_steps=6), tmp_path, progress=False)
    killed = [  # what kills mid-write leave: the manifest's, the config's, the loss log's
        tmp_path / "checkpoints" / ".manifest.json.tmp-7515",
        tmp_path / ".config.json.tmp-812",
        tmp_path / ".losses.jsonl.tmp-99",
    ]
    for path in killed:
        path.write_text('{"format": ')
    not_staging = tmp_path / ".notes.tmp-draft"
    not_staging.write_text("a user's file")
    resumed = train(tiny_model(), dataset, config(max_steps=6), tmp_path, progress=False)
    assert not [path for path in killed if path.exists()]
    assert not_staging.read_text() == "a user's file"
    assert [entry["step"] for entry in read_manifest(tmp_path / "checkpoints")][-1] == 6
    verify_checkpoint(resumed.checkpoint_path)


# --- NaN guard ----------------------------------------------------------------------------


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, dataset):
    model = tiny_model()
    model.nan_at_call = 2 * 5  # step 5, second of two micro-batches
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 5 \(micro-batch 2 of 2"):
        train(model, dataset, config(grad_accum_steps=2), tmp_path / "nan", progress=False)
    checkpoints = tmp_path / "nan" / "checkpoints"
    last_good = latest_checkpoint(checkpoints)
    assert last_good.name == "step-00000004"
    assert sorted(p.name for p in checkpoints.iterdir())[-1] == "step-00000004"
    verify_checkpoint(last_good)
    assert max(row["step"] for row in read_log(tmp_path / "nan" / "losses.jsonl")) == 4
    # The weights were not touched by the NaN: they are the step-4 weights.
    state = dict(model.state_dict())
    restored = tiny_model(seed=9)
    load_weights(restored, last_good, use_ema=False)
    assert_same_tensors(state, dict(restored.state_dict()))


# --- schedule, EMA, config ----------------------------------------------------------------


def test_lr_schedule_warms_up_then_stays_or_decays_to_the_final_fraction(tmp_path, dataset):
    constant = TrainConfig(max_steps=100, warmup_steps=4)
    assert [lr_multiplier(s, constant) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_multiplier(99, constant) == 1.0
    cosine = TrainConfig(max_steps=104, warmup_steps=4, schedule="cosine", final_lr_fraction=0.5)
    assert lr_multiplier(4, cosine) == 1.0
    assert lr_multiplier(54, cosine) == pytest.approx(0.75)  # halfway: (1 + 0.5) / 2
    assert lr_multiplier(104, cosine) == pytest.approx(0.5)
    assert lr_multiplier(103, cosine) == pytest.approx(0.5 + 0.25 * (1 + math.cos(math.pi * 0.99)))
    no_warmup = TrainConfig(max_steps=10, schedule="cosine")
    assert lr_multiplier(0, no_warmup) == 1.0 and lr_multiplier(10, no_warmup) == 0.0

    # The trainer applies exactly these rates, step by step.
    settings = config(max_steps=6)
    result = train(tiny_model(), dataset, settings, tmp_path, progress=False)
    logged = [row["lr"] for row in read_log(result.losses_path)]
    assert logged == pytest.approx([settings.lr * lr_multiplier(s, settings) for s in range(6)])


def test_ema_is_the_exponential_average_kept_in_fp32():
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    initial = {name: p.detach().float().clone() for name, p in model.named_parameters()}
    ema = ExponentialMovingAverage(model, decay=0.75)
    assert all(value.dtype == torch.float32 for value in ema.state_dict().values())
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(2.0)
    for _ in range(3):
        ema.update(model)
    for name, value in ema.state_dict().items():
        # shadow_n = d^n * p0 + (1 - d^n) * p1
        expected = 0.75**3 * initial[name] + (1 - 0.75**3) * 2.0
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-6)
    with ema.applied_to(model):
        assert torch.equal(model.weight.float(), ema.state_dict()["weight"].bfloat16().float())
    assert (model.weight == 2.0).all()  # raw weights are back


def test_train_config_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="TrainConfig.max_steps"):
        TrainConfig(max_steps=0)
    with pytest.raises(ValueError, match="TrainConfig.schedule"):
        TrainConfig(max_steps=1, schedule="linear")
    with pytest.raises(ValueError, match=r"unknown TrainConfig keys \['learning_rate'\]"):
        TrainConfig.from_dict({"max_steps": 1, "learning_rate": 1.0})
    settings = config()
    assert TrainConfig.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_bf16_without_a_gpu_warns_and_trains_in_fp32(tmp_path, dataset):
    with pytest.warns(UserWarning, match="no GPU: running fp32"):
        result = train(tiny_model(), dataset, config(max_steps=2, precision="bf16"), tmp_path)
    assert result.final_step == 2


# --- it learns ----------------------------------------------------------------------------


@pytest.mark.slow  # trains on real data
def test_loss_drops_on_real_wikitext(tmp_path):
    text = load_wikitext2()
    tokenizer = train_bpe_tokenizer(text.train, 512, SpecialTokens(), tmp_path / "tokenizer")
    train_set = ChunkedLMDataset(text.train, tokenizer, 64)
    heldout = ChunkedLMDataset(text.heldout, tokenizer, 64)
    heldout_batch = {
        "input_ids": heldout.input_ids[:64],
        "attention_mask": torch.ones_like(heldout.input_ids[:64]),
    }

    def heldout_loss(model: TinyLM) -> float:
        model.eval()
        with torch.no_grad():
            return model.loss(heldout_batch, generator=torch.Generator().manual_seed(0)).loss.item()

    model = tiny_model(vocab_size=len(tokenizer), hidden=64)
    before = heldout_loss(model)
    settings = TrainConfig(
        max_steps=200,
        batch_size=16,
        lr=1e-2,
        warmup_steps=10,
        ema_decay=0.99,
        log_every=20,
        checkpoint_every=200,
    )
    result = train(model, train_set, settings, tmp_path / "run", progress=False)
    log = read_log(result.losses_path)
    assert log[0]["loss"] > math.log(512) - 1.0 and log[-1]["loss"] < log[0]["loss"] - 1.0
    after = heldout_loss(model)
    assert after < before - 1.5, (before, after)
    ema_model = tiny_model(vocab_size=len(tokenizer), hidden=64)
    load_weights(ema_model, result.checkpoint_path)
    assert heldout_loss(ema_model) < before - 1.0
    assert log[-1]["tokens"] == 200 * 16 * 64


# --- learning curves ----------------------------------------------------------------------


class _RandomProbe:
    """A probe that draws from the global RNG and runs the model, as a decoding may."""

    every = 3

    def __init__(self):
        self.seen = []

    def measure(self, model, step):
        assert not model.training and not torch.is_grad_enabled()
        self.seen.append(step)
        noise = torch.rand(4)  # would shift the next updates' draws if not restored
        batch = torch.randint(0, VOCAB, (2, LENGTH))
        logits = model.logits(batch[:, :-1])
        return {"accuracy": float(noise.mean()), "logit_mean": float(logits.mean())}


def test_a_learning_curve_changes_no_weight(tmp_path, dataset):
    """Probing every 3 steps (EMA weights in, RNG draws, eval mode) leaves the run bitwise the
    run without probes; probes.jsonl gets a line per probe and the last step."""
    plain = tiny_model()
    train(plain, dataset, config(), tmp_path / "plain", progress=False)
    probed, probe = tiny_model(), _RandomProbe()
    result = train(probed, dataset, config(), tmp_path / "probed", progress=False, probe=probe)
    assert_same_tensors(dict(plain.state_dict()), dict(probed.state_dict()))
    assert probed.training and probe.seen == [3, 6, 8]
    lines = read_log(tmp_path / "probed" / "probes.jsonl")
    assert [line["step"] for line in lines] == [3, 6, 8] and "accuracy" in lines[0]
    assert lines[-1]["loss"] == result.final_loss
