"""The prepared GPU check: what one accelerator gives each family, against its memory bound.

``setdlm bench gpu`` measures, on one device, in a few minutes:

1. copy bandwidth: a device-to-device copy of a large buffer (bytes read + written per second);
2. forward latency against the tokens fed per forward (1 to 256), at batch 1, no cache: where
   a forward stops being bound by reading the weights;
3. per family, decoding tok/s at batch 1, in static batches of B and through a
   continuous-batching pool of B slots (the same prompts; how many of them the pool gave the
   static batches' tokens is reported, not required: bf16 kernels may round a batch's rows
   differently), eager and (``--compile``) with ``torch.compile`` on the backbone, each beside
   "% of the bandwidth bound": weight bytes x forwards per second / measured bandwidth, the
   share of the time a forward would take if it only had to read the weights once.

Random weights never emit an EOS, so every row runs to the budget; ``--stop-lengths gsm8k``
stops each row where a GSM8K reference solution of that many tokens would end (with
``--new-tokens 256``), or ``--stop-lengths FILE`` where a run's samples.jsonl says its outputs
ended: the spread of lengths that decides what the pool gains over static batches.

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
from setdlm.recipes.bench import (
    BenchSettings,
    bench_decode_config,
    describe_stop_lengths,
    stop_lengths,
)
from setdlm.util.errors import UserError
from setdlm.util.validation import budget_errors, raise_for, torch_device


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
    stop_lengths: str | None = None  # "gsm8k" or a samples.jsonl: where rows stop (bench.py)


def check_gpu(settings: GpuCheckSettings = GpuCheckSettings(), log=print) -> dict:
    """Run the three measurements; returns them (and logs one table each)."""
    hint = "; to try the script on this machine pass --device cpu --size tiny"
    device = torch_device(settings.device, hint=hint)
    raise_for(
        budget_errors(
            settings.new_tokens, model_length(settings), "--new-tokens", settings.prompt_tokens
        )
    )
    bandwidth = copy_bandwidth(device, settings.copy_megabytes)
    log(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s ({device}, {_device_name(device)})")
    report = {"device": _device_name(device), "bandwidth_bytes_per_second": bandwidth}
    stops = None
    if settings.stop_lengths is not None:
        stops, what = stop_lengths(settings.stop_lengths, settings.prompts)
        report["stop_lengths"] = describe_stop_lengths(stops, what, settings.new_tokens)
        log(report["stop_lengths"])
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
            measured = _throughput(family, runner, prompts, stops, settings)
            for row in _with_bound(measured, weight_bytes, bandwidth):
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
    f"{'family':7s} {'mode':9s} {'B':>4s} {'batching':10s} {'tok/s':>10s} {'fwd/s':>8s} "
    f"{'NFE':>6s} {'% bw bound':>11s} {'same as static':>15s}"
)


def _line(row: dict) -> str:
    same = row.get("same_tokens_as_static")
    return (
        f"{row['family']:7s} {row['mode']:9s} {row['batch_size']:4d} {row['batching']:10s} "
        f"{row['tokens_per_second']:10.1f} {row['forwards_per_second']:8.1f} {row['nfe']:6d} "
        f"{row['bandwidth_bound_percent']:10.1f}% {'' if same is None else same:>15s}"
    )


def _throughput(family, model, prompts, stops, settings) -> list[dict]:
    """Batch 1 over the first 4 prompts, then static batches of B and a pool of B slots over
    all of them: one row each, with the outputs' tokens, forwards and seconds."""
    config = bench_decode_config(
        family, BenchSettings(new_tokens=settings.new_tokens, mdlm_block=32), threshold=0.9
    )
    size = settings.batch_size
    stops = stops or [None] * len(prompts)
    alone = [([prompt], [stop]) for prompt, stop in zip(prompts[:4], stops[:4], strict=True)]
    batches = [(prompts[i : i + size], stops[i : i + size]) for i in range(0, len(prompts), size)]
    runs = [
        ("static", 1, alone),
        ("static", size, batches),
        ("continuous", size, [(prompts, stops)]),
    ]
    rows, static_tokens = [], None
    for batching, batch_size, calls in runs:
        pooled = {"batch_size": size} if batching == "continuous" else {}
        try:
            model.generate(calls[0][0][:1], config, **pooled)  # warm-up (and compilation)
            outputs = [model.generate(p, config, stop_after=s, **pooled) for p, s in calls]
        except Exception as error:  # a compiled backbone can fail at its first real call
            return rows + [_failed(family, batch_size, batching, error)]
        tokens = [ids for output in outputs for ids in output.new_token_ids]
        seconds = sum(o.wall_seconds for o in outputs)
        row = {
            "family": family,
            "batch_size": batch_size,
            "batching": batching,
            "tokens_per_second": sum(sum(o.num_generated) for o in outputs) / seconds,
            "forwards_per_second": sum(o.nfe for o in outputs) / seconds,
            "nfe": sum(o.nfe for o in outputs),
        }
        if batching == "continuous" and static_tokens is not None:
            same = sum(a == b for a, b in zip(tokens, static_tokens, strict=True))
            row["same_tokens_as_static"] = f"{same}/{len(tokens)}"
        if batch_size > 1 and batching == "static":
            static_tokens = tokens
        rows.append(row)
    return rows


def _with_bound(rows: list[dict], weight_bytes: int, bandwidth: float) -> list[dict]:
    """Each row with the share of its forwards' time that reading the weights once would take."""
    bound = 100 * weight_bytes / bandwidth  # 100 x the seconds one read of the weights takes
    return [row | {"bandwidth_bound_percent": bound * row["forwards_per_second"]} for row in rows]


def _failed(family: str, size: int, batching: str, error: Exception) -> dict:
    return {
        "family": family,
        "batch_size": size,
        "batching": batching,
        "tokens_per_second": 0.0,
        "forwards_per_second": 0.0,
        "nfe": 0,
        "error": f"{type(error).__name__}: {error}",
    }


def model_length(settings: GpuCheckSettings) -> int:
    """The length of the models the check builds."""
    if settings.size == "real":
        from setdlm.recipes.real_size import LENGTH

        return LENGTH
    return BenchSettings().length


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
