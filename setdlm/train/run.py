"""The state of a training run, and how it goes into a checkpoint and comes back out.

A run is the model plus everything an update depends on: optimizer moments, LR schedule, EMA,
data position, every RNG and the running totals. ``save`` writes all of it, ``restore`` puts
all of it back, so the next update after a resume is the one an uninterrupted run would make.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from safetensors.torch import load_model, save_file, save_model

from setdlm.data.loader import ResumableBatchLoader, derive_seed
from setdlm.train.checkpoint import (
    EMA_FILE,
    MODEL_FILE,
    read_state,
    read_tensors,
    verify_checkpoint,
    write_checkpoint,
)
from setdlm.train.config import TrainConfig, lr_multiplier, resume_differences
from setdlm.train.ema import ExponentialMovingAverage
from setdlm.train.state import (
    capture_rng,
    optimizer_from_tensors,
    optimizer_to_tensors,
    restore_rng,
)

OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"


@dataclass
class RunCounters:
    """Run totals that continue across resumes."""

    step: int = 0  # optimizer updates applied
    tokens: int = 0  # real (attention-mask) tokens seen, all processes
    seconds: float = 0.0  # wall time spent training
    loss: float | None = None  # the loss of the last update


@dataclass
class TrainingRun:
    config: TrainConfig
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    ema: ExponentialMovingAverage | None
    loader: ResumableBatchLoader
    # On the CPU: a run draws the same noise levels and orders on any device; families draw
    # on ``generator.device`` and move the result to the data's device.
    loss_generator: torch.Generator = field(default_factory=torch.Generator)
    counters: RunCounters = field(default_factory=RunCounters)

    @classmethod
    def create(
        cls,
        model: torch.nn.Module,
        dataset: Any,
        config: TrainConfig,
        accelerator: Accelerator | None = None,
    ) -> TrainingRun:
        """A fresh run: optimizer, schedule, EMA and data stream around ``model``."""
        accelerator = accelerator or Accelerator(mixed_precision=mixed_precision(config))
        # On the device before the optimizer exists, so restored moments land beside the weights.
        model.to(accelerator.device)
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_multiplier(step, config)
        )
        loader = ResumableBatchLoader(
            dataset,
            config.batch_size,
            config.seed,
            rank=accelerator.process_index,
            world_size=accelerator.num_processes,
        )
        ema = ExponentialMovingAverage(model, config.ema_decay) if config.ema_decay > 0 else None
        return cls(config, accelerator, model, optimizer, scheduler, ema, loader)

    def seed_everything(self) -> None:
        """Seed every RNG an update may draw from; each process gets its own streams."""
        seed, rank = self.config.seed, self.accelerator.process_index
        torch.manual_seed(derive_seed(seed, "torch", rank))  # CPU and every CUDA device
        random.seed(derive_seed(seed, "python", rank))
        np.random.seed(derive_seed(seed, "numpy", rank) % 2**32)
        self.loss_generator.manual_seed(derive_seed(seed, "loss", rank))

    def save(self, checkpoints_dir: Path) -> None:
        """Write a checkpoint from the main process; every process contributes its RNG states."""
        accelerator = self.accelerator
        rng_by_process = gather_object([capture_rng(self.loss_generator)])  # [(tensors, plain)]
        if accelerator.is_main_process:
            optimizer_tensors, optimizer_plain = optimizer_to_tensors(self.optimizer)
            rng_tensors = {
                f"rank{rank}.{name}": tensor
                for rank, (tensors, _) in enumerate(rng_by_process)
                for name, tensor in tensors.items()
            }
            writers = {
                MODEL_FILE: lambda path: save_model(self.model, str(path)),
                OPTIMIZER_FILE: lambda path: save_file(optimizer_tensors, path),
                RNG_FILE: lambda path: save_file(rng_tensors, path),
            }
            if self.ema is not None:
                ema_tensors = {name: value.cpu() for name, value in self.ema.state_dict().items()}
                writers[EMA_FILE] = lambda path: save_file(ema_tensors, path)
            state = {
                "config": self.config.to_dict(),
                "world_size": accelerator.num_processes,
                "data_position": self.loader.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "optimizer": optimizer_plain,
                "rng": [plain for _, plain in rng_by_process],
                "counters": vars(self.counters),
            }
            step, keep_last = self.counters.step, self.config.keep_last
            write_checkpoint(checkpoints_dir, step, writers, state, keep_last)
        accelerator.wait_for_everyone()

    def restore(self, checkpoint: Path) -> None:
        """Continue ``checkpoint``: weights, optimizer, schedule, EMA, data position, RNGs."""
        verify_checkpoint(checkpoint)
        state = read_state(checkpoint)
        differences = resume_differences(TrainConfig.from_dict(state["config"]), self.config)
        if differences:
            raise ValueError(
                f"cannot resume {checkpoint} with a different training config: "
                + "; ".join(differences)
            )
        rank, world_size = self.accelerator.process_index, self.accelerator.num_processes
        if state["world_size"] != world_size:
            raise ValueError(
                f"{checkpoint} was written by {state['world_size']} process(es); resuming with "
                f"{world_size} could not continue the same random streams"
            )
        device = str(self.accelerator.device)
        load_model(self.model, checkpoint / MODEL_FILE, strict=True, device=device)
        optimizer_tensors = read_tensors(checkpoint, OPTIMIZER_FILE)
        optimizer_from_tensors(self.optimizer, optimizer_tensors, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(read_tensors(checkpoint, EMA_FILE))
        self.loader.load_state_dict(state["data_position"])
        prefix = f"rank{rank}."
        rng_tensors = {
            name.removeprefix(prefix): tensor
            for name, tensor in read_tensors(checkpoint, RNG_FILE).items()
            if name.startswith(prefix)
        }
        restore_rng(self.loss_generator, rng_tensors, state["rng"][rank])
        self.counters = RunCounters(**state["counters"])


def mixed_precision(config: TrainConfig) -> str:
    """Accelerate's ``mixed_precision`` for the config: bf16 autocast on GPU, fp32 on CPU."""
    if config.precision == "fp32":
        return "no"
    if not torch.cuda.is_available():
        warnings.warn(
            "TrainConfig.precision is bf16 (GPU autocast) but there is no GPU: running fp32",
            stacklevel=4,  # the caller of train()
        )
        return "no"
    return "bf16"
