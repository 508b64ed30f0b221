"""One timer for every family: speed from the same decoding run as quality.

Each example's record carries its generated tokens (counted up to the stop point, the same way
for every family), ``latency_seconds`` (the wall time of the decoding call that produced it,
the device synchronized before and after), ``seconds`` (its share of that call: latency over
the batch size), its counted NFE and parallelism, and whether it was a warm-up example. The
summary excludes warm-up examples and reports aggregate tokens/s (total tokens / total
seconds), the mean of per-example tokens/s (tokens / latency; the paper's number at batch 1),
latency percentiles, NFE and parallelism.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from contextlib import contextmanager

import torch

from setdlm.eval.records import speed_protocol


@contextmanager
def synchronized_timer(device: torch.device):
    """Yields a dict whose "seconds" holds the elapsed time once the block ends."""
    elapsed = {}
    _synchronize(device)
    start = time.perf_counter()
    try:
        yield elapsed
    finally:
        _synchronize(device)
        elapsed["seconds"] = time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> dict:
    """Peak accelerator memory where there is one, else the process's peak resident set."""
    if device.type == "cuda":
        return {"kind": "cuda max_memory_allocated", "bytes": torch.cuda.max_memory_allocated()}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # Linux reports kilobytes
    return {"kind": "process peak RSS", "bytes": rss * scale}


def decoding_fields(
    output, row: int, batch_size: int, *, call_seconds: float | None = None, batching="static"
) -> dict:
    """The speed fields of one row of a ``GenerationOutput`` that every sample record carries
    (what ``summarize_speed`` reads).

    Static batches pass ``call_seconds``, the synchronized wall time of the whole decoding call:
    every row's latency is the call, its share the call over the batch. Continuous batching
    passes none: the row's latency is its own time in the pool and its share the time since the
    previous row finished, both measured by the engine.
    """
    if call_seconds is None:
        latency, share = output.row_latency_seconds[row], output.row_share_seconds[row]
    else:
        latency, share = call_seconds, call_seconds / batch_size
    return {
        "generated_tokens": output.num_generated[row],
        "stopped": output.stopped[row],
        "nfe": output.row_forwards[row],
        "steps": output.row_steps[row],
        "positions_evaluated": output.row_positions[row],
        "parallelism": output.parallelism[row],
        "latency_seconds": latency,
        "seconds": share,
        "batch_size": batch_size,
        "batching": batching,
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize_speed(records: list[dict]) -> dict:
    """Speed metrics over the timed (non-warm-up) records."""
    timed = [r for r in records if not r.get("warmup")]
    if not timed:
        return {"timed_examples": 0}
    seconds = [r["seconds"] for r in timed]
    latency = [r["latency_seconds"] for r in timed]
    tokens = [r["generated_tokens"] for r in timed]
    per_example = [t / s for t, s in zip(tokens, latency, strict=True) if s > 0]
    # records written before positions were counted have none: the metric is then absent
    positions = [r.get("positions_evaluated") for r in timed]
    per_token = None
    if None not in positions and sum(tokens):
        per_token = sum(positions) / sum(tokens)
    return {
        "protocol": speed_protocol(timed),
        "timed_examples": len(timed),
        "warmup_examples": len(records) - len(timed),
        "generated_tokens": sum(tokens),
        "tokens_per_second_aggregate": sum(tokens) / sum(seconds) if sum(seconds) else 0.0,
        "tokens_per_second_mean": statistics.mean(per_example) if per_example else 0.0,
        "tokens_per_second_std": statistics.pstdev(per_example) if per_example else 0.0,
        "tokens_per_second_min": min(per_example, default=0.0),
        "tokens_per_second_median": statistics.median(per_example) if per_example else 0.0,
        "tokens_per_second_max": max(per_example, default=0.0),
        "latency_seconds_p50": _percentile(latency, 0.50),
        "latency_seconds_p95": _percentile(latency, 0.95),
        "nfe_mean": statistics.mean(r["nfe"] for r in timed),
        "nfe_total": sum(r["nfe"] for r in timed),
        "parallelism_mean": statistics.mean(r["parallelism"] for r in timed),
        # backbone positions computed per generated token: 1 for AR with a cache, more for
        # families that recompute or predict positions they do not commit
        "positions_per_token": per_token,
    }
