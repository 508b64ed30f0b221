"""Training: one loop for every model family, its checkpoints and its settings.

    from setdlm.train import TrainConfig, train
    result = train(model, dataset, TrainConfig(max_steps=300), "runs/tiny/ar")

Modules: ``config`` (TrainConfig, the LR schedule), ``trainer`` (the loop), ``run`` (what a
checkpoint captures and a resume restores), ``checkpoint`` (atomic folders, manifest,
keep-last-K, loading weights for evaluation), ``ema``, and ``state`` (optimizer and RNG state
without pickles).
"""

from setdlm.train.checkpoint import latest_checkpoint, load_weights
from setdlm.train.config import TrainConfig, lr_multiplier
from setdlm.train.ema import ExponentialMovingAverage
from setdlm.train.trainer import NonFiniteLossError, TrainResult, train

__all__ = [
    "ExponentialMovingAverage",
    "NonFiniteLossError",
    "TrainConfig",
    "TrainResult",
    "latest_checkpoint",
    "load_weights",
    "lr_multiplier",
    "train",
]
