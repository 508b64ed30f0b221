"""The paper's separate throughput protocol (SPEC 3.8), as an explicit option.

The paper measured speed in runs of their own: batch 1, the first 50 examples as warm-up, then
N measured examples (cycling through the dataset when it is shorter), reporting the mean and
standard deviation of per-example tokens/s. Our default takes speed from the quality run
itself; this reproduces the paper's number for comparison, written to ``throughput.json``.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from setdlm.core.decoding import DecodeConfig
from setdlm.eval.fingerprint import hardware
from setdlm.eval.records import example_seed
from setdlm.eval.runner import Task
from setdlm.eval.timing import synchronized_timer
from setdlm.util.errors import DataError
from setdlm.util.files import atomic_write_json
from setdlm.util.progress import progress_range as progress_bar_range


def paper_throughput(
    task: Task,
    model,
    tokenizer,
    decode: DecodeConfig,
    out_dir: str | Path,
    measured: int,
    warmup: int = 50,
    seed: int = 1234,
) -> dict:
    decode = task.decode_config(decode, tokenizer)
    examples = task.examples(tokenizer, model)
    if not examples:
        raise DataError(f"task {task.name} has no examples to time")
    rates, tokens, forwards = [], [], []
    cycle = itertools.cycle(examples)
    for index in progress_bar_range(warmup + measured, "paper throughput"):
        example = next(cycle)
        config = (
            decode
            if example.max_new_tokens is None
            else decode.replace(max_new_tokens=example.max_new_tokens)
        )
        with synchronized_timer(model.device) as elapsed:
            output = model.generate(
                [example.input_ids],
                config,
                seeds=[example_seed(seed, example.id)],
                tokenizer=tokenizer,
            )
        if index >= warmup:
            rates.append(output.num_generated[0] / elapsed["seconds"])
            tokens.append(output.num_generated[0])
            forwards.append(output.nfe)
    result = {
        "protocol": f"paper: batch 1, {warmup} warm-up, {measured} measured (cycling), mean of "
        "per-example tokens/s",
        "tokens_per_second_mean": statistics.mean(rates),
        "tokens_per_second_std": statistics.pstdev(rates),
        "generated_tokens_mean": statistics.mean(tokens),
        "nfe_mean": statistics.mean(forwards),
        "decode": decode.to_dict(),
        "hardware": hardware(model.device),
    }
    atomic_write_json(Path(out_dir) / "throughput.json", result)
    return result
