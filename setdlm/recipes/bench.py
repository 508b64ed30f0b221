"""Decoding benchmark: the four families on one tiny backbone, same prompts, same engine.

Reports, per family and confidence threshold τ: tokens/s, counted NFE, parallelism factor,
mean time per backbone forward, and the engine overhead, the share of decoding wall time spent
outside backbone forwards. Figures are medians over repeats after one warm-up run; compare
them within one run (absolute CPU speed drifts between minutes on shared machines).

``bench_batching`` (``setdlm bench decode --continuous``) compares static batches with a
continuous-batching pool of the same size on the same prompts: random models and prompts, or
the mini benchmark's trained models on their arithmetic problems (``--models``). Random models
never emit an EOS, so their rows all run to the budget; ``--stop-lengths gsm8k`` gives each
prompt the length of a GSM8K reference solution instead (or ``--stop-lengths FILE`` the output
lengths of a run's samples.jsonl), where its row stops as at an EOS: the spread of output
lengths that continuous batching is for.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from setdlm.core.decoding import DecodeConfig
from setdlm.core.family import ModelConfig, default_schedule
from setdlm.core.random_weights import redraw_weights
from setdlm.families import FAMILY_NAMES, build_model, with_knobs
from setdlm.families import family as family_info
from setdlm.util.errors import DataError
from setdlm.util.progress import progress_bar


@dataclass(frozen=True)
class BenchSettings:
    backbone: str = "qwen3"  # the NOTES comparison: Qwen3-style 4 x 256, vocab 2048, length 256
    num_layers: int = 4
    hidden_size: int = 256
    vocab_size: int = 2048
    length: int = 256
    prompt_tokens: int = 32
    new_tokens: int = 128
    batch_size: int = 1
    thresholds: tuple[float, ...] = (1e6, 0.9)
    block_size: int = 4  # BD3LM S; SetDLM d = S, M = 2S, W = d
    mdlm_block: int = 32
    repeats: int = 3
    sharpness: float = 4.0
    seed: int = 0


@dataclass(frozen=True)
class BenchRow:
    family: str
    threshold: float
    tokens_per_second: float
    nfe: int
    parallelism: float
    forward_ms: float
    overhead: float
    # engine time outside the backbone over backbone time, median over repeats: the figure
    # `setdlm check-speed` guards (both sides slow down together on a slower machine)
    host_per_forward: float

    def line(self) -> str:
        return (
            f"{self.family:7s} {self.threshold:8.3g} {self.tokens_per_second:10.1f} "
            f"{self.nfe:6d} {self.parallelism:8.2f} {self.forward_ms:10.3f} "
            f"{100 * self.overhead:9.1f}% {self.host_per_forward:8.3f}"
        )


HEADER = (
    f"{'family':7s} {'tau':>8s} {'tok/s':>10s} {'NFE':>6s} {'parallel':>8s} "
    f"{'fwd ms':>10s} {'overhead':>10s} {'host/fwd':>8s}"
)


def thresholds_of(family: str, thresholds: tuple[float, ...]) -> tuple[float, ...]:
    """The τ a family is benchmarked at: one point for a left-to-right family, which commits
    one token per forward whatever τ is."""
    return (1e6,) if family_info(family).left_to_right else thresholds


def bench_decode_config(family: str, settings: BenchSettings, threshold: float) -> DecodeConfig:
    """The benchmarks' decoding: the budget, τ, and the family's "bench" knobs (MDLM in
    semi-AR blocks of ``settings.mdlm_block``)."""
    base = DecodeConfig(max_new_tokens=settings.new_tokens, confidence_threshold=threshold)
    knobs = family_info(family).decoding_knobs("bench", {"mdlm_block": settings.mdlm_block})
    return with_knobs(base, family, **knobs)


def bench_model(family: str, settings: BenchSettings):
    """A randomly initialized model whose predictions are peaked enough for τ to matter."""
    torch.manual_seed(settings.seed)
    model = redraw_weights(build_model(_config(family, settings)), settings.seed, gain=3.0)
    with torch.no_grad():
        # A larger final-norm gain sharpens the output distribution, so that confidences span
        # the τ grid as a trained model's do (random weights alone give near-uniform ones).
        final_norm = dict(model.named_parameters()).get(
            "backbone.model.model.norm.weight",
            dict(model.named_parameters()).get("backbone.output_layer.norm_final.weight"),
        )
        final_norm.fill_(settings.sharpness)
    return model.eval()


def _config(family: str, settings: BenchSettings) -> ModelConfig:
    vocab, length = settings.vocab_size, settings.length
    if settings.backbone == "qwen3":
        heads = max(1, settings.hidden_size // 64)
        backbone = {
            "architecture": {
                "model_type": "qwen3",
                "vocab_size": vocab,
                "hidden_size": settings.hidden_size,
                "intermediate_size": 3 * settings.hidden_size,
                "num_hidden_layers": settings.num_layers,
                "num_attention_heads": heads,
                "num_key_value_heads": max(1, heads // 2),
                "head_dim": 64,
                "max_position_embeddings": 2 * length,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1e6,
                "tie_word_embeddings": True,
            },
            "use_causal_mask": family_info(family).dit["causal_attention"],
            "attn_implementation": "sdpa",
        }
    else:
        backbone = {
            "vocab_size": vocab,
            "hidden_size": settings.hidden_size,
            "n_heads": max(1, settings.hidden_size // 64),
            "num_layers": settings.num_layers,
            "cond_dim": 128,
            "dropout": 0.0,
            "adaln": False,
            "length": length,
        }
    schedule = default_schedule(family, length, settings.block_size)
    return ModelConfig(
        family=family,
        length=length,
        vocab_size=vocab,
        mask_token_id=vocab - 1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        backbone_kind=settings.backbone,
        backbone=backbone,
        block_size=settings.block_size if "block_size" in family_info(family).settings else None,
        schedule=schedule,
    )


def bench_decode(settings: BenchSettings = BenchSettings(), log=print) -> list[BenchRow]:
    generator = torch.Generator().manual_seed(settings.seed + 1)
    prompts = torch.randint(
        3,
        settings.vocab_size - 1,
        (settings.batch_size, settings.prompt_tokens),
        generator=generator,
    )
    prompts[:, 0] = 1  # BOS
    rows = []
    log(HEADER)
    decodes = sum(
        len(thresholds_of(family, settings.thresholds)) * (settings.repeats + 1)
        for family in FAMILY_NAMES
    )
    bar = progress_bar(decodes, "bench decode", unit="decode")
    say = bar.write if log is print else log  # lines above the bar, not through it
    for family in FAMILY_NAMES:
        model = bench_model(family, settings)
        for threshold in thresholds_of(family, settings.thresholds):
            config = bench_decode_config(family, settings, threshold)
            runs = []
            for _ in range(settings.repeats + 1):
                runs.append(model.generate(prompts.tolist(), config))
                bar.update()
            runs = runs[1:]  # the first run warms up allocators and kernels
            wall = statistics.median(r.wall_seconds for r in runs)
            forward = statistics.median(r.forward_seconds for r in runs)
            tokens = sum(runs[0].num_generated)
            row = BenchRow(
                family=family,
                threshold=threshold,
                tokens_per_second=tokens / wall,
                nfe=runs[0].nfe,
                parallelism=statistics.mean(runs[0].parallelism),
                forward_ms=1000 * forward / runs[0].nfe,
                overhead=statistics.median(
                    (r.wall_seconds - r.forward_seconds) / r.wall_seconds for r in runs
                ),
                host_per_forward=statistics.median(
                    (r.wall_seconds - r.forward_seconds) / r.forward_seconds for r in runs
                ),
            )
            rows.append(row)
            say(row.line())
    bar.close()
    return rows


# ------------------------------------------------------------------ static vs continuous batching
@dataclass(frozen=True)
class BatchingRow:
    family: str
    threshold: float
    batch_size: int
    batching: str  # "static" or "continuous"
    tokens_per_second: float  # aggregate: all generated tokens over the whole run's wall time
    nfe: int  # backbone forwards of the whole run
    wall_seconds: float

    def line(self, static: float | None, alone: float) -> str:
        versus_static = "" if static is None else f"{self.tokens_per_second / static:9.2f}x"
        return (
            f"{self.family:7s} {self.threshold:8.3g} {self.batch_size:4d} {self.batching:10s} "
            f"{self.tokens_per_second:10.1f} {self.nfe:7d} {versus_static:>10s} "
            f"{self.tokens_per_second / alone:9.2f}x"
        )


BATCHING_HEADER = (
    f"{'family':7s} {'tau':>8s} {'B':>4s} {'batching':10s} {'tok/s':>10s} {'NFE':>7s} "
    f"{'vs static':>10s} {'vs B=1':>10s}"
)


def random_prompts(count: int, settings: BenchSettings) -> list[list[int]]:
    """``count`` prompts of random lengths (a quarter to twice ``prompt_tokens``), BOS first."""
    generator = torch.Generator().manual_seed(settings.seed + 2)
    low, high = max(2, settings.prompt_tokens // 4), 2 * settings.prompt_tokens
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return [
        [1] + torch.randint(3, settings.vocab_size - 1, (n - 1,), generator=generator).tolist()
        for n in lengths
    ]


@dataclass(frozen=True)
class Workload:
    """What one family decodes in the batching benchmark."""

    family: str
    model: object
    prompts: list[list[int]]
    config: Callable[[float], DecodeConfig]  # τ -> the decoding settings
    tokenizer: object = None  # for stop strings; None when the stop rules need no text
    stop_after: list[int] | None = None  # per prompt: where its row stops, as at an EOS


def random_workloads(settings: BenchSettings, num_prompts: int) -> list[Workload]:
    """The four families with random weights, on random prompts of varied lengths (no stop
    rule: every row decodes the whole budget, rows differ only in their NFE at low τ)."""
    prompts = random_prompts(num_prompts, settings)

    def config_for(family):
        return lambda threshold: bench_decode_config(family, settings, threshold)

    return [Workload(f, bench_model(f, settings), prompts, config_for(f)) for f in FAMILY_NAMES]


def gsm8k_stop_lengths(count: int) -> list[int]:
    """Per prompt i, the length of GSM8K test problem i's reference solution under the Qwen3
    tokenizer (the published GSM8K checkpoints' own), cycling through the 1,319 problems:
    where a row stops, as at an EOS, to replay GSM8K's spread of output lengths."""
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.tasks.gsm8k import load_gsm8k
    from setdlm.util.paths import data_path

    tokenizer = load_tokenizer(data_path("tokenizers", "qwen3"))
    problems = load_gsm8k("test")
    answers = [problems[i % len(problems)].answer for i in range(count)]
    return [len(tokenizer(text)["input_ids"]) for text in answers]


def sample_log_lengths(path: Path, count: int) -> list[int]:
    """Per prompt i, the ``generated_tokens`` of record i of a result's ``samples.jsonl`` (in
    file order, cycling): a run's own output lengths, say a trained checkpoint's on GSM8K. A
    record of 0 tokens stops after 1 (an EOS at once). The file is read, never repaired."""
    from setdlm.eval.records import SampleLog

    if not path.is_file():
        raise DataError(f"--stop-lengths {path}: no such file (expected gsm8k or a samples.jsonl)")
    records = list(SampleLog(path).scan()[0].values())
    if not records:
        raise DataError(f"{path}: no sample records in it (JSON lines with an id)")
    lengths = []
    for record in records:
        tokens = record.get("generated_tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise DataError(
                f"{path}: record {record['id']!r} has no generated_tokens (a whole number >= 0), "
                f"got {tokens!r}"
            )
        lengths.append(max(1, tokens))
    return [lengths[i % len(lengths)] for i in range(count)]


def stop_lengths(source: str, count: int) -> tuple[list[int], str]:
    """Where each of ``count`` prompts' rows stops, and what the lengths are: "gsm8k"
    (``gsm8k_stop_lengths``) or a ``samples.jsonl`` file (``sample_log_lengths``)."""
    if source == "gsm8k":
        return gsm8k_stop_lengths(count), "GSM8K test reference solutions in Qwen3 tokens"
    return sample_log_lengths(Path(source), count), f"generated_tokens of {source}"


def describe_stop_lengths(lengths: list[int], what: str, budget: int) -> str:
    ranked = sorted(lengths)
    past = sum(length > budget for length in lengths)
    return (
        f"stop lengths: {what}, {len(lengths)} prompts: min {ranked[0]}, median "
        f"{ranked[len(ranked) // 2]}, p90 {ranked[9 * len(ranked) // 10]}, max {ranked[-1]}; "
        f"{past} past the budget of {budget} run to it"
    )


def length_workloads(
    settings: BenchSettings, num_prompts: int, source: str = "gsm8k", log=print
) -> list[Workload]:
    """``random_workloads`` whose rows stop where ``source``'s lengths say (``stop_lengths``);
    a length past the budget runs to the budget. The models are long enough for the longest
    prompt plus the budget."""
    lengths, what = stop_lengths(source, num_prompts)
    settings = replace(
        settings, length=max(settings.length, 2 * settings.prompt_tokens + settings.new_tokens)
    )
    log(describe_stop_lengths(lengths, what, settings.new_tokens))
    return [replace(work, stop_after=lengths) for work in random_workloads(settings, num_prompts)]


def arithmetic_workloads(models_dir: Path, num_prompts: int) -> list[Workload]:
    """The mini benchmark's trained models (``<run>/models/*-arith``) on its test problems,
    with the task's own decoding (EOS stop, its budget): rows stop where their solution ends."""
    from setdlm.checkpoints.folders import load_model
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.tasks.arithmetic_task import (
        ArithmeticSettings,
        ArithmeticTask,
        arithmetic_decode_config,
    )

    folders = sorted(p for p in Path(models_dir).glob("*-arith") if (p / "config.json").exists())
    if not folders:
        raise DataError(
            f"{models_dir}: no trained mini-benchmark model (a '*-arith' folder with a "
            "config.json); run `make run` first, or leave out --models"
        )
    task = ArithmeticTask(ArithmeticSettings(limit=num_prompts))
    workloads = []
    for folder in folders:
        model, tokenizer = load_model(folder).eval(), load_tokenizer(folder)
        prompts = [example.input_ids for example in task.examples(tokenizer, model)]

        def config_for(threshold, model=model, tokenizer=tokenizer):
            base = arithmetic_decode_config(model, DecodeConfig(confidence_threshold=threshold))
            return task.decode_config(base, tokenizer)

        workloads.append(Workload(model.config.family, model, prompts, config_for, tokenizer))
    return workloads


def bench_batching(
    workloads: list[Workload],
    batch_sizes: tuple[int, ...],
    thresholds: tuple[float, ...],
    log=print,
) -> list[BatchingRow]:
    """Aggregate tok/s of static batches against a continuous-batching pool of the same size,
    over the same prompts, per family and τ, in one run.

    Both modes must give every prompt the same tokens (they are checked, and a difference is an
    error): only the time differs. Each (family, τ) first decodes a pool's worth of prompts
    untimed to warm up kernels and allocators.
    """
    rows = []
    log(BATCHING_HEADER)
    for work in workloads:
        for threshold in thresholds_of(work.family, thresholds):
            config = work.config(threshold)
            largest = max(batch_sizes)
            work.model.generate(
                work.prompts[:largest],
                config,
                tokenizer=work.tokenizer,
                batch_size=largest,
                stop_after=_stops(work, 0, largest),
            )
            alone = None
            for size in batch_sizes:
                static, static_tokens = _static_run(work, config, threshold, size)
                alone = alone or static.tokens_per_second
                rows.append(static)
                log(static.line(None, alone))
                if size == 1:
                    continue
                output = work.model.generate(
                    work.prompts,
                    config,
                    tokenizer=work.tokenizer,
                    batch_size=size,
                    stop_after=work.stop_after,
                )
                if output.new_token_ids != static_tokens:
                    raise RuntimeError(
                        f"{work.family} τ={threshold} B={size}: continuous batching changed tokens"
                    )
                pooled = BatchingRow(
                    work.family,
                    threshold,
                    size,
                    "continuous",
                    sum(output.num_generated) / output.wall_seconds,
                    output.nfe,
                    output.wall_seconds,
                )
                rows.append(pooled)
                log(pooled.line(static.tokens_per_second, alone))
    return rows


def _static_run(work: Workload, config: DecodeConfig, threshold: float, size: int):
    tokens, new_ids, nfe, wall = 0, [], 0, 0.0
    for start in range(0, len(work.prompts), size):
        batch = work.prompts[start : start + size]
        stops = _stops(work, start, start + size)
        output = work.model.generate(batch, config, tokenizer=work.tokenizer, stop_after=stops)
        tokens += sum(output.num_generated)
        new_ids += output.new_token_ids
        nfe += output.nfe
        wall += output.wall_seconds
    row = BatchingRow(work.family, threshold, size, "static", tokens / wall, nfe, wall)
    return row, new_ids


def _stops(work: Workload, start: int, end: int) -> list[int] | None:
    return None if work.stop_after is None else work.stop_after[start:end]
