"""The prepared GPU check: what one accelerator gives each family, against its memory bound.

``setdlm bench gpu`` measures, on one device, in a few minutes:

1. copy bandwidth: a device-to-device copy of a large buffer (bytes read + written per second);
2. forward latency against the tokens fed per forward (1 to 256), at batch 1, no cache: where
   a forward stops being bound by reading the weights;
3. per family, decoding tok/s at batch 1 and through a continuous-batching pool of B slots,
   eager and (``--compile``) with ``torch.compile`` on the backbone, each beside "% of the
   bandwidth bound": weight bytes x forwards per second / measured bandwidth, the share of
   the time a forward would take if it only had to read the weights once.

The model is the GSM8K checkpoints' architecture (``real_size``: Qwen3-1.7B, bf16) with random
weights, so nothing is downloaded; ``--size tiny`` runs the same script on the tiny benchmark
model (to try it on a CPU). Random weights give near-uniform predictions, so every step commits
one token whatever τ: the numbers are the engine's and the hardware's, not a trained model's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from setdlm.families import FAMILY_NAMES
from setdlm.recipes.bench import BenchSettings, bench_decode_config
from setdlm.util.errors import UserError


@dataclass(frozen=True)
class GpuCheckSettings:
    device: str = "cuda"
    size: str = "real"  # "real" (Qwen3-1.7B, bf16) or "tiny" (the decode benchmark's model)
    batch_size: int = 16
    prompts: int = 32
    prompt_tokens: int = 128
    new_tokens: int = 32
    widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    compile: bool = False
    copy_megabytes: int = 1024


def check_gpu(settings: GpuCheckSettings = GpuCheckSettings(), log=print) -> dict:
    """Run the three measurements; returns them (and logs one table each)."""
    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"--device {settings.device}: no CUDA device here; to try the script on this "
            "machine pass --device cpu --size tiny"
        )
    bandwidth = copy_bandwidth(device, settings.copy_megabytes)
    log(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s ({device}, {_device_name(device)})")
    report = {"device": _device_name(device), "bandwidth_bytes_per_second": bandwidth}
    generator = torch.Generator().manual_seed(0)
    families = []
    header_due = True
    for index, family in enumerate(FAMILY_NAMES):
        model = _model(family, settings)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if index == 0:
            report["forward_latency"] = forward_latency(model, settings.widths, log)
        vocab = model.config.vocab_size
        prompts = [
            torch.randint(3, vocab - 1, (settings.prompt_tokens,), generator=generator).tolist()
            for _ in range(settings.prompts)
        ]
        modes = [("eager", model)]
        if settings.compile:
            modes.append(("compiled", compiled(model, log)))
        for mode, runner in modes:
            if runner is None:
                continue
            for row in _throughput(family, runner, prompts, settings, weight_bytes, bandwidth):
                if header_due:
                    log(HEADER)
                    header_due = False
                families.append(row | {"mode": mode})
                log(_line(families[-1]) + (f"  ({row['error']})" if "error" in row else ""))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["families"] = families
    return report


def copy_bandwidth(device: torch.device, megabytes: int, repeats: int = 10) -> float:
    """Bytes moved per second (read + write) by a device-to-device copy of ``megabytes``."""
    size = megabytes * 2**20
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    _synchronize(device)
    return 2 * size * repeats / (time.perf_counter() - start)


@torch.inference_mode()
def forward_latency(model, widths: tuple[int, ...], log=print, repeats: int = 5) -> list[dict]:
    """Median milliseconds of one backbone forward of Q tokens (batch 1, no cache, no mask)."""
    device = model.device
    rows = []
    log(f"{'tokens':>8s} {'fwd ms':>10s} {'tok/s':>12s}")
    for width in widths:
        ids = torch.randint(3, model.config.vocab_size - 1, (1, width), device=device)
        positions = torch.arange(width, device=device)[None]
        model.decode_forward(ids, positions, None, None)  # warm-up (kernels, allocator)
        times = []
        for _ in range(repeats):
            _synchronize(device)
            start = time.perf_counter()
            model.decode_forward(ids, positions, None, None)
            _synchronize(device)
            times.append(time.perf_counter() - start)
        milliseconds = 1000 * statistics.median(times)
        rows.append({"tokens": width, "forward_ms": milliseconds})
        log(f"{width:8d} {milliseconds:10.3f} {1000 * width / milliseconds:12.1f}")
    return rows


def compiled(model, log=print):
    """A shallow stand-in for ``model`` whose backbone is ``torch.compile``d (dynamic shapes),
    or None, said aloud, when compiling is not possible here."""
    import copy

    try:
        twin = copy.copy(model)  # shares the weights; only the backbone attribute differs
        twin._modules = dict(model._modules)
        twin._modules["backbone"] = torch.compile(model.backbone, dynamic=True)
        return twin
    except Exception as error:  # torch raises many kinds here (no compiler, no Triton, ...)
        log(f"torch.compile unavailable, eager only: {type(error).__name__}: {error}")
        return None


HEADER = (
    f"{'family':7s} {'mode':9s} {'B':>4s} {'tok/s':>10s} {'fwd/s':>8s} {'NFE':>6s} "
    f"{'% bw bound':>11s}"
)


def _line(row: dict) -> str:
    return (
        f"{row['family']:7s} {row['mode']:9s} {row['batch_size']:4d} "
        f"{row['tokens_per_second']:10.1f} {row['forwards_per_second']:8.1f} {row['nfe']:6d} "
        f"{row['bandwidth_bound_percent']:10.1f}%"
    )


def _throughput(family, model, prompts, settings, weight_bytes, bandwidth) -> list[dict]:
    config = bench_decode_config(
        family, BenchSettings(new_tokens=settings.new_tokens, mdlm_block=32), threshold=0.9
    )
    rows = []
    for size in (1, settings.batch_size):
        subset = prompts[:4] if size == 1 else prompts
        options = {} if size == 1 else {"batch_size": size}
        try:
            model.generate(subset[:1], config, **options)  # warm-up (and compilation)
            outputs = (
                [model.generate(subset, config, **options)]
                if size > 1
                else [model.generate([prompt], config) for prompt in subset]
            )
        except Exception as error:  # a compiled backbone can fail at its first real call
            return rows + [_failed(family, size, error)]
        seconds = sum(o.wall_seconds for o in outputs)
        forwards = sum(o.nfe for o in outputs)
        per_second = forwards / seconds
        rows.append(
            {
                "family": family,
                "batch_size": size,
                "tokens_per_second": sum(sum(o.num_generated) for o in outputs) / seconds,
                "forwards_per_second": per_second,
                "nfe": forwards,
                # the share of each forward's time that reading the weights once would take
                "bandwidth_bound_percent": 100 * weight_bytes * per_second / bandwidth,
            }
        )
    return rows


def _failed(family: str, size: int, error: Exception) -> dict:
    return {
        "family": family,
        "batch_size": size,
        "tokens_per_second": 0.0,
        "forwards_per_second": 0.0,
        "nfe": 0,
        "bandwidth_bound_percent": 0.0,
        "error": f"{type(error).__name__}: {error}",
    }


def _model(family: str, settings: GpuCheckSettings):
    if settings.size == "real":
        from setdlm.recipes.real_size import QWEN3_TOKENS, build_real_size

        return build_real_size(family, QWEN3_TOKENS, device=settings.device)
    if settings.size == "tiny":
        from setdlm.recipes.bench import bench_model

        return bench_model(family, BenchSettings()).to(settings.device)
    raise UserError(f"--size must be real or tiny, got {settings.size!r}")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
