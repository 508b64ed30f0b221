"""Optimizer and RNG state as (safetensors tensors, JSON metadata) pairs, and back.

A bitwise-exact resume needs the optimizer moments, every random number generator a training
step draws from (torch CPU and CUDA for dropout, the loss generator for noise levels and orders,
Python's and NumPy's in case a family uses them) and nothing pickled, so each state is split
into tensors (stored losslessly by safetensors) and plain values (JSON; Python writes floats
with enough digits to read them back exactly).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def optimizer_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split ``optimizer.state_dict()`` into ``"<param index>.<key>"`` tensors and JSON."""
    state_dict = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, Any] = {}
    for index, param_state in state_dict["state"].items():
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                plain[f"{index}.{key}"] = value
    groups = [
        {key: list(value) if isinstance(value, tuple) else value for key, value in group.items()}
        for group in state_dict["param_groups"]
    ]
    return tensors, {"param_groups": groups, "plain": plain}


def optimizer_from_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], metadata: dict
) -> None:
    """Restore what ``optimizer_to_tensors`` saved (moments move to the parameters' device)."""
    state: dict[int, dict[str, Any]] = {}
    for flat_key, value in [*tensors.items(), *metadata["plain"].items()]:
        index, key = flat_key.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    groups = [
        {
            key: tuple(value) if isinstance(value, list) and key != "params" else value
            for key, value in group.items()
        }
        for group in metadata["param_groups"]
    ]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def capture_rng(loss_generator: torch.Generator) -> tuple[dict[str, torch.Tensor], dict]:
    """This process's RNG states: (uint8/int64 tensors, JSON-able values)."""
    tensors = {
        "torch_cpu": torch.get_rng_state(),
        "loss_generator": loss_generator.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["torch_cuda"] = torch.cuda.get_rng_state()  # the current device's
    numpy_kind, numpy_keys, numpy_position, has_gauss, cached_gauss = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(numpy_keys.astype(np.int64))
    python_version, python_internal, python_gauss = random.getstate()
    plain = {
        "numpy": [numpy_kind, int(numpy_position), int(has_gauss), float(cached_gauss)],
        "python": [python_version, list(python_internal), python_gauss],
    }
    return tensors, plain


def restore_rng(
    loss_generator: torch.Generator, tensors: dict[str, torch.Tensor], plain: dict
) -> None:
    """Put back what ``capture_rng`` captured."""
    torch.set_rng_state(tensors["torch_cpu"])
    loss_generator.set_state(tensors["loss_generator"])
    if "torch_cuda" in tensors:
        if not torch.cuda.is_available():
            raise RuntimeError("the checkpoint holds a CUDA RNG state but CUDA is not available")
        torch.cuda.set_rng_state(tensors["torch_cuda"])
    numpy_kind, numpy_position, has_gauss, cached_gauss = plain["numpy"]
    numpy_keys = tensors["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy_kind, numpy_keys, numpy_position, has_gauss, cached_gauss))
    python_version, python_internal, python_gauss = plain["python"]
    random.setstate((python_version, tuple(python_internal), python_gauss))
