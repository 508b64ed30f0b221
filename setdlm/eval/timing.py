"""One timer for every family: speed from the same decoding run as quality.

Each example's record carries its generated tokens (counted up to the stop point, the same way
for every family), ``latency_seconds`` (the wall time of the decoding call that produced it,
the device synchronized before and after), ``seconds`` (its share of that call: latency over
the batch size), its counted NFE and parallelism, whether it was a warm-up example and whether
it was timed for speed (a run with a speed subset times only the examples it decodes one at a
time). The summary excludes warm-up examples: counted speed (NFE, parallelism, tokens) is over
all the others, and timed speed over the timed ones: aggregate tokens/s (total tokens / total
seconds), the mean of per-example tokens/s (tokens / latency; the paper's number at batch 1)
and latency percentiles.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from contextlib import contextmanager

import torch

from setdlm.core.decoding.parallelism import tokens_per_forward
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
        "content_tokens": output.num_content[row],
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


def _tokens_per_forward(counted: list[dict]) -> dict:
    """Beside the official parallelism factor (``parallelism``, what the paper plots), tokens
    per forward: each example's text tokens (EOS and padding excluded) over its NFE, the mean
    over the examples as the factor's is (setdlm/core/decoding/parallelism.py). Absent for
    records written before ``content_tokens`` was."""
    if not all("content_tokens" in r for r in counted):
        return {}
    values = [tokens_per_forward(r["content_tokens"], r["nfe"]) for r in counted]
    return {"tokens_per_forward_mean": statistics.mean(values)}


def summarize_speed(records: list[dict]) -> dict:
    """Speed metrics: the counted ones (NFE, parallelism, tokens) over every example but the
    warm-up, the timed ones (tokens/s, latency) over the examples timed for speed, which are
    all of those unless the run timed a subset (records marked ``"timed": false``; records
    written before the mark existed were all timed)."""
    counted = [r for r in records if not r.get("warmup")]
    if not counted:
        return {"timed_examples": 0}
    timed = [r for r in counted if r.get("timed", True)]
    seconds = [r["seconds"] for r in timed]
    latency = [r["latency_seconds"] for r in timed]
    timed_tokens = [r["generated_tokens"] for r in timed]
    per_example = [t / s for t, s in zip(timed_tokens, latency, strict=True) if s > 0]
    tokens = [r["generated_tokens"] for r in counted]
    # records written before positions were counted have none: the metric is then absent
    positions = [r.get("positions_evaluated") for r in counted]
    per_token = None
    if None not in positions and sum(tokens):
        per_token = sum(positions) / sum(tokens)
    protocol = speed_protocol(timed) if timed else "not timed"
    if timed and len(timed) < len(counted):
        protocol += (
            f"; timed on {len(timed)} of the {len(counted)} examples after the warm-up (the "
            "first ones), the others decoded in batches: counted (NFE, parallelism), not timed"
        )
    return {
        "protocol": protocol,
        "timed_examples": len(timed),
        "counted_examples": len(counted),
        "warmup_examples": len(records) - len(counted),
        "generated_tokens": sum(tokens),
        "tokens_per_second_aggregate": sum(timed_tokens) / sum(seconds) if sum(seconds) else 0.0,
        "tokens_per_second_mean": statistics.mean(per_example) if per_example else 0.0,
        "tokens_per_second_std": statistics.pstdev(per_example) if per_example else 0.0,
        "tokens_per_second_min": min(per_example, default=0.0),
        "tokens_per_second_median": statistics.median(per_example) if per_example else 0.0,
        "tokens_per_second_max": max(per_example, default=0.0),
        "latency_seconds_p50": _percentile(latency, 0.50) if latency else 0.0,
        "latency_seconds_p95": _percentile(latency, 0.95) if latency else 0.0,
        "nfe_mean": statistics.mean(r["nfe"] for r in counted),
        "nfe_total": sum(r["nfe"] for r in counted),
        "parallelism_mean": statistics.mean(r["parallelism"] for r in counted),
        **_tokens_per_forward(counted),
        # backbone positions computed per generated token: 1 for AR with a cache, more for
        # families that recompute or predict positions they do not commit
        "positions_per_token": per_token,
    }
