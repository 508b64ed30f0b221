"""``setdlm bench``: ``real-size``, ``gpu``, ``decode`` and ``workflow``."""

from __future__ import annotations

from pathlib import Path

from setdlm.commands.command import Command, group
from setdlm.util.validation import (
    BATCH_SIZE,
    EXAMPLES,
    REPEATS,
    THREADS,
    THRESHOLD,
    TOKENS,
    SettingError,
    budget_errors,
    option,
    output_path,
    raise_for,
)


def _add_stop_lengths(parser, scope: str) -> None:
    parser.add_argument(
        "--stop-lengths",
        metavar="gsm8k|FILE",
        default=None,
        help=f"{scope}each row stops, as at an EOS, after as many tokens as a GSM8K reference "
        "solution has (gsm8k: Qwen3 tokens, from SETDLM_DATA_DIR; --new-tokens 256 covers 98%% "
        "of them) or as a run's samples.jsonl says its outputs had (generated_tokens); "
        "default: every row runs to --new-tokens",
    )


def _add_real_size_arguments(parser) -> None:
    parser.add_argument("--tokenizer", default=None, help="default: the data folder's qwen3")
    parser.add_argument("--new-tokens", type=TOKENS, default=6)


def _real_size(args) -> int:
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.recipes.real_size import real_size_smoke
    from setdlm.util.paths import data_path

    tokenizer = load_tokenizer(args.tokenizer or data_path("tokenizers", "qwen3"))
    real_size_smoke(tokenizer, args.new_tokens)
    return 0


REAL_SIZE = Command(
    "real-size",
    "the GSM8K checkpoints' architecture (Qwen3-1.7B, bf16) with random weights: every "
    "family decodes a few tokens on this machine (nothing downloaded; about 4 min on 2 CPUs)",
    _add_real_size_arguments,
    _real_size,
)


def _add_gpu_arguments(parser) -> None:
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=("real", "tiny"), default="real")
    parser.add_argument("--batch-size", type=BATCH_SIZE, default=16)
    parser.add_argument("--compile", action="store_true", help="also with torch.compile")
    parser.add_argument("--new-tokens", type=TOKENS, default=32, help="the budget of every row")
    _add_stop_lengths(parser, "")
    parser.add_argument(
        "--out", type=output_path, default=None, help="also write the figures as JSON"
    )


def _gpu(args) -> int:
    from setdlm.recipes.bench_gpu import GpuCheckSettings, check_gpu
    from setdlm.util.files import atomic_write_json

    settings = GpuCheckSettings(
        device=args.device,
        size=args.size,
        batch_size=args.batch_size,
        compile=args.compile,
        new_tokens=args.new_tokens,
        stop_lengths=args.stop_lengths,
    )
    report = check_gpu(settings)
    if args.out is not None:
        atomic_write_json(args.out, report)
    return 0


GPU = Command(
    "gpu",
    "the prepared accelerator check: copy bandwidth, forward latency against tokens "
    "per forward, tok/s per family at batch 1 and pooled, against the bandwidth bound",
    _add_gpu_arguments,
    _gpu,
)


def _add_decode_arguments(parser) -> None:
    parser.add_argument("--backbone", choices=("qwen3", "dit"), default="qwen3")
    parser.add_argument("--layers", type=option("$defs/train/properties/num_layers"), default=4)
    parser.add_argument("--hidden", type=option("$defs/train/properties/hidden_size"), default=256)
    parser.add_argument(
        "--vocab",
        type=option("$defs/train/properties/vocab_size"),
        default=2048,
        help="the random models' vocabulary (GPT-2's 50257 and Qwen3's 151936 are the "
        "published checkpoints'; a greedy step's cost grows with it)",
    )
    parser.add_argument("--prompt-tokens", type=TOKENS, default=32)
    parser.add_argument("--new-tokens", type=TOKENS, default=128)
    parser.add_argument("--batch-size", type=BATCH_SIZE, default=1)
    parser.add_argument("--thresholds", type=THRESHOLD, nargs="+", default=[1e6, 0.9])
    parser.add_argument("--repeats", type=REPEATS, default=3)
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="compare static batches with a continuous-batching pool of each --batch-sizes "
        "size over --prompts random prompts of varied lengths (aggregate tok/s)",
    )
    parser.add_argument("--batch-sizes", type=BATCH_SIZE, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prompts", type=EXAMPLES, default=256, help="with --continuous")
    _add_stop_lengths(parser, "with --continuous and random models: ")
    parser.add_argument(
        "--models",
        type=Path,
        default=None,
        help="with --continuous: a run's models folder (results/runs/tiny/models) whose trained "
        "mini-benchmark models decode its arithmetic problems; default: random weights and "
        "random prompts",
    )
    parser.add_argument(
        "--against",
        metavar="REVISION",
        default=None,
        help="compare this checkout with a git revision of it (e.g. c6a2d05) on the same "
        "weights, in interleaved rounds: tok/s ratio (this / that) with its range, engine host "
        "ms per step on each side, and whether the tokens are the same",
    )
    parser.add_argument("--rounds", type=REPEATS, default=5, help="with --against")
    parser.add_argument("--threads", type=THREADS, default=1, help="with --against: per side")


def _decode(args) -> int:
    from setdlm.recipes.bench import (
        BenchSettings,
        arithmetic_workloads,
        bench_batching,
        bench_decode,
        length_workloads,
        random_workloads,
    )

    settings = BenchSettings(
        backbone=args.backbone,
        num_layers=args.layers,
        hidden_size=args.hidden,
        vocab_size=args.vocab,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        batch_size=args.batch_size,
        thresholds=tuple(args.thresholds),
        repeats=args.repeats,
    )
    if args.against is not None:
        if args.continuous or args.models is not None:
            raise SettingError("--against compares static batches of random models")
        from setdlm.recipes.bench_revisions import compare_revisions

        compare_revisions(args.against, settings, args.rounds, args.threads)
        return 0
    if args.stop_lengths is not None and not args.continuous:
        raise SettingError("--stop-lengths goes with --continuous (the batching benchmark)")
    if args.models is None and args.stop_lengths is None:
        raise_for(_budget_errors(settings, args.continuous))
    if args.continuous:
        if args.models is not None and args.stop_lengths is not None:
            raise SettingError(
                "--stop-lengths is for random models; the trained --models stop at their own EOS"
            )
        if args.models is not None:
            workloads = arithmetic_workloads(args.models, args.prompts)
        elif args.stop_lengths is not None:
            workloads = length_workloads(settings, args.prompts, args.stop_lengths)
        else:
            workloads = random_workloads(settings, args.prompts)
        bench_batching(workloads, tuple(args.batch_sizes), tuple(args.thresholds))
    else:
        bench_decode(settings)
    return 0


def _budget_errors(settings, continuous: bool) -> list[str]:
    """The random models' length holds the longest prompt and the budget (the continuous
    benchmark's random prompts run up to twice --prompt-tokens); past it a backbone would
    decode positions the model does not have."""
    longest = 2 * settings.prompt_tokens if continuous else settings.prompt_tokens
    where = "--new-tokens (with --prompt-tokens)"
    return budget_errors(settings.new_tokens, settings.length, where, longest)


DECODE = Command(
    "decode",
    "decode the same prompts with all four families on one tiny backbone",
    _add_decode_arguments,
    _decode,
)


def _add_workflow_arguments(parser) -> None:
    parser.add_argument(
        "run",
        nargs="?",
        default="results/runs/tiny",
        help="a workflow run folder (default: the default's, results/runs/tiny)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="first run the default (all_tables) from nothing into a scratch results folder, "
        "the reference models copied, and summarize that run",
    )
    parser.add_argument(
        "--work",
        type=output_path,
        default=None,
        help="with --fresh: the scratch folder (its results/ is replaced; default: a new "
        "temporary folder)",
    )
    parser.add_argument("--cores", type=THREADS, default=None, help="with --fresh: cores to use")


def _workflow(args) -> int:
    from setdlm.recipes.bench_workflow import main

    return main(args)


WORKFLOW = Command(
    "workflow",
    "where a workflow run's time went: seconds per stage, job and point (--fresh: a new run "
    "of the default first)",
    _add_workflow_arguments,
    _workflow,
)

BENCH = group("bench", "benchmarks", "bench", (REAL_SIZE, GPU, DECODE, WORKFLOW))
