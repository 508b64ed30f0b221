"""The prepared GPU check runs end to end (here on the CPU with the tiny model), so that a
session lent an accelerator spends its minutes measuring, not debugging."""

from __future__ import annotations

import pytest
import torch

from setdlm.families import FAMILY_NAMES
from setdlm.recipes.bench_gpu import GpuCheckSettings, check_gpu
from setdlm.util.errors import UserError


# The whole check, every family at batch 1, in static batches and through the pool (about 13 s
# on one AMD EPYC core): the end-to-end tier, with the other runs of whole commands (issue 47).
@pytest.mark.slow
@pytest.mark.e2e
def test_the_gpu_check_measures_every_family_against_the_bandwidth_bound():
    settings = GpuCheckSettings(
        device="cpu",
        size="tiny",
        batch_size=4,
        prompts=5,  # the pool refills: 5 prompts through 4 slots
        prompt_tokens=16,
        new_tokens=48,
        widths=(1, 8),
        copy_megabytes=64,
        stop_lengths="gsm8k",  # the first five: 60, 47, 210, 47, 108 tokens
    )
    lines = []
    report = check_gpu(settings, log=lines.append)
    assert report["bandwidth_bytes_per_second"] > 0
    assert [row["tokens"] for row in report["forward_latency"]] == [1, 8]
    rows = report["families"]
    runs = [(1, "static"), (4, "static"), (4, "continuous")]
    assert [(r["family"], r["batch_size"], r["batching"]) for r in rows] == [
        (family, size, batching) for family in FAMILY_NAMES for size, batching in runs
    ]
    for row in rows:
        assert "error" not in row, row
        assert row["tokens_per_second"] > 0 and row["bandwidth_bound_percent"] > 0, row
    for row in rows[2::3]:  # fp32 on a CPU: the pool gives the static batches' tokens
        assert row["same_tokens_as_static"] == "5/5", row
    assert any(line.startswith("copy bandwidth:") for line in lines)
    assert report["stop_lengths"].endswith("3 past the budget of 48 run to it")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_gpu_the_check_says_how_to_try_it():
    with pytest.raises(UserError, match="--device cpu --size tiny"):
        check_gpu(GpuCheckSettings())
