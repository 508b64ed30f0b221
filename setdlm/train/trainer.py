"""The one training loop for every model family.

A family is any ``torch.nn.Module`` with

    model.loss(batch, *, generator) -> LossOutput

where ``batch`` holds ``input_ids`` (B, L), ``attention_mask`` (B, L) and optionally
``context_mask`` (B, L), and ``generator`` (a CPU generator, so the draws do not depend on the
device) supplies all of the loss's randomness; dropout draws from torch's global RNG. The
trainer owns both, and the data order, so that a run interrupted after any checkpoint and
resumed ends with bitwise the same weights as an uninterrupted one (on the same hardware and
thread count). A preemption signal (SIGUSR1, SIGTERM, SIGINT; see ``preemption``) ends the run after
the step under way with a checkpoint of that step, so a preempted job loses no work.

Devices and processes come from ``accelerate``: one CPU process, one GPU, or DDP under
``accelerate launch``; bf16 autocast on GPU when the config asks for it.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate import Accelerator

from setdlm.core.outputs import LossOutput
from setdlm.train.checkpoint import latest_checkpoint
from setdlm.train.config import TrainConfig
from setdlm.train.preemption import Preempted, watch_preemption
from setdlm.train.run import TrainingRun
from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_json, atomic_write_text, remove_leftover_temporaries
from setdlm.util.progress import progress_bar

LOSSES_NAME = "losses.jsonl"
PROBES_NAME = "probes.jsonl"


class Probe(Protocol):
    """A measurement taken along training (a learning curve): every ``every`` steps and at the
    last one, ``measure(model, step)`` gets the model holding its EMA weights (the ones an
    evaluation would load), in eval mode and without gradients, and returns a JSON-able dict."""

    every: int

    def measure(self, model: torch.nn.Module, step: int) -> dict[str, Any]: ...


class NonFiniteLossError(UserError, FloatingPointError):
    """The loss or gradient norm became NaN/inf; the run stopped before applying the update."""


@dataclass(frozen=True)
class TrainResult:
    final_step: int
    final_loss: float | None  # the loss of the last update (None if no update was ever made)
    losses_path: Path  # JSON lines: step, loss, lr, grad_norm, tokens, seconds
    checkpoint_path: Path | None  # the newest checkpoint folder


class _LossForward(torch.nn.Module):
    """Routes ``model.loss`` through ``forward``, so DDP synchronizes its gradients and
    accelerate's autocast wraps it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> LossOutput:
        return self.model.loss(batch, generator=generator)


def train(
    model: torch.nn.Module,
    dataset: Any,
    config: TrainConfig,
    out_dir: str | Path,
    resume: bool = True,
    *,
    accelerator: Accelerator | None = None,
    progress: bool = True,
    probe: Probe | None = None,
) -> TrainResult:
    """Train ``model`` on ``dataset`` (a sequence of item dicts of (L,) tensors) for
    ``config.max_steps`` optimizer steps, writing checkpoints and ``losses.jsonl`` to ``out_dir``.

    With ``resume`` the newest checkpoint in ``out_dir`` is continued; without it an existing
    checkpoint is an error (nothing already computed is overwritten). A fresh run seeds torch's
    global RNG from ``config.seed``. ``model`` ends holding the raw (not EMA) weights.

    ``probe`` adds a line to ``probes.jsonl`` every ``probe.every`` steps; it cannot change the
    updates (the RNG states and the training weights are put back after it), so a run with a
    probe ends with the same weights as one without.
    """
    out_dir = Path(out_dir)
    checkpoints_dir = out_dir / "checkpoints"
    losses_path = out_dir / LOSSES_NAME
    probes_path = out_dir / PROBES_NAME
    run = TrainingRun.create(model, dataset, config, accelerator)
    accelerator = run.accelerator

    checkpoint = latest_checkpoint(checkpoints_dir)
    if checkpoint is not None and not resume:
        raise FileExistsError(
            f"{out_dir} already holds checkpoint {checkpoint.name}; pass resume=True to continue "
            f"it or choose a new output folder"
        )
    if checkpoint is not None:
        run.restore(checkpoint)
    else:
        run.seed_everything()
    counters = run.counters
    if accelerator.is_main_process:
        # A kill mid-write (a SIGKILL skips every finally) leaves a staging file beside the
        # manifest, config or log it was replacing; this training is the folder's one writer.
        remove_leftover_temporaries(out_dir)
        atomic_write_json(out_dir / "config.json", config.to_dict())
        _truncate_losses(losses_path, counters.step)
        _truncate_losses(probes_path, counters.step)

    loss_module = accelerator.prepare_model(_LossForward(model))
    model.train()
    bar = progress_bar(
        config.max_steps,
        "train",
        counters.step,
        unit="step",
        enabled=progress and accelerator.is_main_process,
    )
    started = time.perf_counter() - counters.seconds
    with watch_preemption() as preemption:
        try:
            while counters.step < config.max_steps:
                lr = run.scheduler.get_last_lr()[0]
                losses, tokens = _accumulate_gradients(run, loss_module)  # (P, A), int
                grad_norm = float(
                    accelerator.clip_grad_norm_(model.parameters(), config.clip_norm or math.inf)
                )
                _check_finite(losses, grad_norm, counters.step + 1, checkpoints_dir)
                run.optimizer.step()
                run.scheduler.step()
                run.optimizer.zero_grad(set_to_none=True)
                if run.ema is not None:
                    run.ema.update(model)

                counters.step += 1
                counters.tokens += tokens
                counters.seconds = time.perf_counter() - started
                counters.loss = float(losses.mean())
                bar.update(1)
                is_last = counters.step == config.max_steps
                if accelerator.is_main_process and (
                    counters.step % config.log_every == 0 or is_last
                ):
                    record = {
                        "step": counters.step,
                        "loss": counters.loss,
                        "lr": lr,
                        "grad_norm": grad_norm,
                        "tokens": counters.tokens,
                        "seconds": round(counters.seconds, 3),
                    }
                    _append_line(losses_path, record)
                    bar.set_postfix(loss=f"{counters.loss:.4f}", lr=f"{lr:.2e}")
                if probe is not None and (counters.step % probe.every == 0 or is_last):
                    measured = _measure(probe, run, model)
                    if accelerator.is_main_process:
                        record = {"step": counters.step, "loss": counters.loss, **measured}
                        _append_line(probes_path, record)
                stop = _preempted_anywhere(accelerator, preemption.raised)
                if counters.step % config.checkpoint_every == 0 or is_last or stop:
                    run.save(checkpoints_dir)
                if stop and not is_last:
                    raise Preempted(
                        preemption.signal_name or "another process's preemption signal",
                        counters.step,
                        str(latest_checkpoint(checkpoints_dir)),
                    )
        finally:
            bar.close()
    return TrainResult(
        final_step=counters.step,
        final_loss=counters.loss,
        losses_path=losses_path,
        checkpoint_path=latest_checkpoint(checkpoints_dir),
    )


def _measure(probe: Probe, run: TrainingRun, model: torch.nn.Module) -> dict[str, Any]:
    """The probe on the EMA weights (the raw ones without an EMA), leaving the run as it was:
    the global RNG states are restored, so the next update draws what it would have drawn."""
    states = torch.random.get_rng_state(), _cuda_rng_states()
    weights = run.ema.applied_to(model) if run.ema is not None else nullcontext(model)
    try:
        with weights, torch.no_grad():
            model.eval()
            return probe.measure(model, run.counters.step)
    finally:
        model.train()
        torch.random.set_rng_state(states[0])
        if states[1] is not None:
            torch.cuda.set_rng_state_all(states[1])


def _cuda_rng_states():
    return torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None


def _preempted_anywhere(accelerator: Accelerator, raised: bool) -> bool:
    """Whether any process got a preemption signal: all of them must stop at the same step."""
    if accelerator.num_processes == 1:
        return raised
    flag = torch.tensor([float(raised)], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item() > 0)


def _accumulate_gradients(
    run: TrainingRun, loss_module: torch.nn.Module
) -> tuple[torch.Tensor, int]:
    """Forward and backward ``grad_accum_steps`` micro-batches; return their losses from every
    process, (num_processes, grad_accum_steps), and the number of real tokens they held."""
    accelerator, accum_steps = run.accelerator, run.config.grad_accum_steps
    losses, tokens = [], torch.zeros((), dtype=torch.long, device=accelerator.device)
    for micro_step in range(accum_steps):
        batch = {
            key: value.to(accelerator.device) for key, value in run.loader.next_batch().items()
        }
        tokens += batch["attention_mask"].sum()
        last = micro_step == accum_steps - 1
        # DDP all-reduces gradients only on the last micro-batch of the step.
        with nullcontext() if last else accelerator.no_sync(loss_module):
            output = loss_module(batch, generator=run.loss_generator)
            accelerator.backward(output.loss / accum_steps)
        losses.append(output.loss.detach().float())
    gathered = accelerator.gather(torch.stack(losses)[None])  # (P, A)
    return gathered.cpu(), int(accelerator.reduce(tokens, reduction="sum"))


def _check_finite(losses: torch.Tensor, grad_norm: float, step: int, checkpoints_dir: Path) -> None:
    """Stop before a NaN/inf reaches the weights; the newest checkpoint stays as it was."""
    bad = (~torch.isfinite(losses)).nonzero().tolist()  # [[process, micro_batch], ...]
    if bad:
        process, micro_batch = bad[0]
        problem = (
            f"loss is {losses[process, micro_batch].item()} at step {step} (micro-batch "
            f"{micro_batch + 1} of {losses.shape[1]}, process {process})"
        )
    elif not math.isfinite(grad_norm):
        problem = f"gradient norm is {grad_norm} at step {step}"
    else:
        return
    last_good = latest_checkpoint(checkpoints_dir)
    where = f"last good checkpoint: {last_good}" if last_good else "no checkpoint was written yet"
    raise NonFiniteLossError(f"{problem}; the update was not applied, {where}")


def _append_line(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def _truncate_losses(path: Path, step: int) -> None:
    """Drop log lines past the step being resumed from (they will be recomputed)."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if _logged_step(line) <= step]
    if kept != lines:
        atomic_write_text(path, "".join(kept))


def _logged_step(line: str) -> float:
    """The step of a log line; a line torn by a crash mid-write counts as past every step."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf
