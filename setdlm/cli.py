"""The ``setdlm`` command line: every workflow step is a subcommand that also works by hand."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from setdlm.checkpoints.zoo import LEGACY_FAMILIES
from setdlm.families import FAMILY_NAMES, policy_names
from setdlm.util.errors import ArgumentParser, report
from setdlm.util.paths import DataNotFoundError
from setdlm.util.progress import QUIET_ENV
from setdlm.util.validation import (
    BATCH_SIZE,
    BLOCK_SIZE,
    EXAMPLES,
    HEADS,
    LENGTH,
    NEW_TOKENS,
    REPEATS,
    SEED,
    THREADS,
    THRESHOLD,
    TOKENS,
    WINDOW,
    SettingError,
    budget_errors,
    option,
    output_path,
    raise_for,
)


def _parse_threads(text: str) -> int:
    try:
        return THREADS(text)
    except argparse.ArgumentTypeError as error:
        raise SettingError(f"--threads: {error}") from None


def main(argv: list[str] | None = None) -> int:
    """Run one command; a bad input ends in a message naming it and exit code 2, not in a
    traceback (setdlm/util/errors.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((a for a in argv if not a.startswith("-") and a in COMMANDS), "")
    return report(f"setdlm {name}".strip(), lambda: _main(argv))


def _main(argv: list[str]) -> int:
    # The global options, read before the forwarded commands, which parse the rest themselves.
    while argv[:1] in (["--threads"], ["--quiet"]):
        if argv[0] == "--quiet":
            os.environ[QUIET_ENV] = "1"  # inherited by the processes a command starts
            argv = argv[1:]
            continue
        threads = _parse_threads(argv[1] if len(argv) > 1 else "")
        argv = argv[2:]
        import torch

        torch.set_num_threads(threads)
    if argv and argv[0] in (*PASSTHROUGH, "lm-eval"):
        # These commands parse their own arguments, options included.
        return _forward(argparse.Namespace(command=argv[0], rest=argv[1:]))
    parser = ArgumentParser(prog="setdlm", description=__doc__)
    parser.add_argument(
        "--threads", type=THREADS, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bars (they are off outside a terminal)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser(
        "tiny",
        help="train the four tiny families on WikiText-2 and "
        "decode with each (the embedded default job)",
    )
    tiny.add_argument("--out", type=output_path, default=Path("results/runs/tiny"))
    tiny.add_argument(
        "--steps",
        type=option("$defs/train/properties/steps"),
        default=None,
        help="training steps per family",
    )
    tiny.add_argument("--families", nargs="+", default=None, choices=FAMILY_NAMES)

    parity = commands.add_parser(
        "parity", help="check exact parity with the official code on fixture folders"
    )
    parity.add_argument("folder", type=Path, help="folder of fixture folders (or one of them)")
    parity.add_argument(
        "--strict", action="store_true", help="nominal tolerances only (no float32 noise allowance)"
    )

    legacy = commands.add_parser(
        "import-legacy",
        help="turn an OWT AR/MDLM Lightning .ckpt (mdlm/bd3lms codebase) into a model folder, "
        "running none of the code its pickle names",
    )
    legacy.add_argument("checkpoint", type=Path, help="the .ckpt file")
    legacy.add_argument("--family", choices=LEGACY_FAMILIES, required=True)
    legacy.add_argument("--out", type=output_path, required=True, help="model folder to write")
    legacy.add_argument(
        "--force", action="store_true", help="replace the model folder --out if there is one"
    )
    legacy.add_argument("--heads", type=HEADS, default=None, help="attention heads (default 12)")
    legacy.add_argument("--length", type=LENGTH, default=None, help="model length (default 1024)")
    legacy.add_argument(
        "--raw-weights", action="store_true", help="the training weights, not the EMA ones"
    )

    models = commands.add_parser("models", help="list the published checkpoints by key")
    models.add_argument(
        "--pin",
        nargs="+",
        metavar="KEY",
        default=None,
        help="pin these keys (or 'all') to their Hub repositories' current commits (needs the Hub)",
    )

    generate = commands.add_parser(
        "generate", help="decode a prompt with a model folder, a published key or a Hub id"
    )
    generate.add_argument("model", help="folder, key (gsm8k:setdlm-smax8) or Hub id")
    generate.add_argument("--prompt", required=True)
    generate.add_argument(
        "--max-new-tokens", type=NEW_TOKENS, default=None, help="default: 64, or what fits"
    )
    generate.add_argument("--threshold", type=THRESHOLD, default=1e6, help="confidence τ")
    generate.add_argument(
        "--policy", choices=policy_names(), default=None, help="default: the family's own"
    )
    generate.add_argument("--window", type=WINDOW, default=None, help="SetDLM W")
    generate.add_argument("--block-size", type=BLOCK_SIZE, default=None, help="MDLM/BD3LM block")
    generate.add_argument("--sample", action="store_true", help="sample instead of greedy")
    generate.add_argument(
        "--top-p", type=option("$defs/unconditional/properties/top_p"), default=1.0
    )
    generate.add_argument(
        "--repetition-penalty",
        type=option("$defs/unconditional/properties/repetition_penalty"),
        default=1.0,
    )
    generate.add_argument("--seed", type=SEED, default=0)
    generate.add_argument("--no-bos", action="store_true", help="do not prepend BOS")
    generate.add_argument(
        "--tokenizer", default=None, help="tokenizer folder or Hub id (default: the model's own)"
    )

    from setdlm.eval.commands import add_parsers as add_eval_parsers

    add_eval_parsers(commands)
    lm_eval = commands.add_parser(
        "lm-eval",
        help="lm-eval's command line with the `setdlm` model registered (arguments pass through)",
    )
    lm_eval.add_argument("rest", nargs=argparse.REMAINDER)
    tasks = commands.add_parser(
        "lm-eval-tasks",
        help="write offline lm-eval task files (GSM8K local and the paper protocol)",
    )
    tasks.add_argument("folder", type=output_path)
    tasks.add_argument("--source", choices=("auto", "local", "hub"), default="auto")

    # Subcommands with their own argument parsers (arguments pass through).
    for name, help_text in PASSTHROUGH_HELP.items():
        forwarded = commands.add_parser(name, help=help_text, add_help=False)
        forwarded.add_argument("rest", nargs=argparse.REMAINDER)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_commands = bench.add_subparsers(dest="bench", required=True)
    real_size = bench_commands.add_parser(
        "real-size",
        help="the GSM8K checkpoints' architecture (Qwen3-1.7B, bf16) with random weights: every "
        "family decodes a few tokens on this machine (nothing downloaded; about 4 min on 2 CPUs)",
    )
    real_size.add_argument("--tokenizer", default=None, help="default: the data folder's qwen3")
    real_size.add_argument("--new-tokens", type=TOKENS, default=6)
    gpu = bench_commands.add_parser(
        "gpu",
        help="the prepared accelerator check: copy bandwidth, forward latency against tokens "
        "per forward, tok/s per family at batch 1 and pooled, against the bandwidth bound",
    )
    gpu.add_argument("--device", default="cuda")
    gpu.add_argument("--size", choices=("real", "tiny"), default="real")
    gpu.add_argument("--batch-size", type=BATCH_SIZE, default=16)
    gpu.add_argument("--compile", action="store_true", help="also with torch.compile")
    gpu.add_argument("--new-tokens", type=TOKENS, default=32, help="the budget of every row")
    _add_stop_lengths(gpu, "")
    gpu.add_argument("--out", type=output_path, default=None, help="also write the figures as JSON")
    decode = bench_commands.add_parser(
        "decode", help="decode the same prompts with all four families on one tiny backbone"
    )
    decode.add_argument("--backbone", choices=("qwen3", "dit"), default="qwen3")
    decode.add_argument("--layers", type=option("$defs/train/properties/num_layers"), default=4)
    decode.add_argument("--hidden", type=option("$defs/train/properties/hidden_size"), default=256)
    decode.add_argument("--prompt-tokens", type=TOKENS, default=32)
    decode.add_argument("--new-tokens", type=TOKENS, default=128)
    decode.add_argument("--batch-size", type=BATCH_SIZE, default=1)
    decode.add_argument("--thresholds", type=THRESHOLD, nargs="+", default=[1e6, 0.9])
    decode.add_argument("--repeats", type=REPEATS, default=3)
    decode.add_argument(
        "--continuous",
        action="store_true",
        help="compare static batches with a continuous-batching pool of each --batch-sizes "
        "size over --prompts random prompts of varied lengths (aggregate tok/s)",
    )
    decode.add_argument("--batch-sizes", type=BATCH_SIZE, nargs="+", default=[1, 4, 16])
    decode.add_argument("--prompts", type=EXAMPLES, default=256, help="with --continuous")
    _add_stop_lengths(decode, "with --continuous and random models: ")
    decode.add_argument(
        "--models",
        type=Path,
        default=None,
        help="with --continuous: a run's models folder (results/runs/tiny/models) whose trained "
        "mini-benchmark models decode its arithmetic problems; default: random weights and "
        "random prompts",
    )
    decode.add_argument(
        "--against",
        metavar="REVISION",
        default=None,
        help="compare this checkout with a git revision of it (e.g. c6a2d05) on the same "
        "weights, in interleaved rounds: tok/s ratio (this / that) with its range, engine host "
        "ms per step on each side, and whether the tokens are the same",
    )
    decode.add_argument("--rounds", type=REPEATS, default=5, help="with --against")
    decode.add_argument("--threads", type=THREADS, default=1, help="with --against: per side")

    args = parser.parse_args(argv)
    return COMMANDS[args.command](args)


def _tiny(args) -> int:
    from dataclasses import replace

    from setdlm.recipes.tiny import TinySettings, run_tiny
    from setdlm.train.preemption import EXIT_PREEMPTED, Preempted

    settings = TinySettings()
    if args.steps is not None:
        settings = replace(settings, steps=args.steps)
    try:
        run_tiny(args.out, settings, tuple(args.families or FAMILY_NAMES))
    except Preempted as stop:
        print(f"setdlm tiny: {stop}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    return 0


def _import_legacy(args) -> int:
    from setdlm.checkpoints.folders import save_model
    from setdlm.checkpoints.legacy import load_lightning

    _refuse_to_replace(args.out, args.force)
    model = load_lightning(
        args.checkpoint,
        args.family,
        use_ema=not args.raw_weights,
        n_heads=args.heads,
        length=args.length,
    )
    folder = save_model(model, args.out)
    parameters = sum(p.numel() for p in model.parameters())
    weights = "raw" if args.raw_weights else "EMA"
    print(f"{folder}: {args.family} DiT, {parameters:,} parameters ({weights} weights)")
    return 0


def _refuse_to_replace(out: Path, force: bool) -> None:
    """``save_model`` puts the new folder in the place of ``out``, removing what was there:
    an existing model folder only with ``--force``, and never anything else."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not ((out / "config.json").is_file() and (out / "model.safetensors").is_file()):
        raise SettingError(
            f"--out {out}: exists and is not a model folder (no config.json and "
            "model.safetensors), so it is not replaced; expected a new folder"
        )
    if not force:
        raise SettingError(
            f"--out {out}: a model folder is already there; expected a new folder, or --force "
            "to replace this one"
        )


def _parity(args) -> int:
    from setdlm.checkpoints.parity import check_case, check_schedules, fixture_cases

    folder = args.folder
    if not folder.is_dir():
        raise DataNotFoundError(f"{folder} is not a folder (expected official-parity fixtures)")
    cases = [folder] if (folder / "reference.json").exists() else fixture_cases(folder)
    schedules = folder / "noise_schedules.json"
    if not cases and not schedules.exists():
        print(f"no fixture folders (with reference.json) under {folder}", file=sys.stderr)
        return 2
    groups = [lambda: check_schedules(schedules)] if schedules.exists() else []
    groups += [lambda case=case: check_case(case, strict=args.strict) for case in cases]
    failures = total = 0
    for group in groups:
        for check in group():
            print(check.line(), flush=True)
            failures += not check.passed
            total += 1
    print(
        f"{'FAILED' if failures else 'PASSED'}: {failures} failing of {total} checks "
        f"over {len(cases)} model case(s)"
    )
    return 1 if failures else 0


def _bench(args) -> int:
    run = {"gpu": _bench_gpu, "real-size": _bench_real_size, "decode": _bench_decode}
    return run[args.bench](args)


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


def _bench_gpu(args) -> int:
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


def _bench_real_size(args) -> int:
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.recipes.real_size import real_size_smoke
    from setdlm.util.paths import data_path

    tokenizer = load_tokenizer(args.tokenizer or data_path("tokenizers", "qwen3"))
    real_size_smoke(tokenizer, args.new_tokens)
    return 0


def _bench_decode(args) -> int:
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
        raise_for(_bench_budget_errors(settings, args.continuous))
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


def _bench_budget_errors(settings, continuous: bool) -> list[str]:
    """The random models' length holds the longest prompt and the budget (the continuous
    benchmark's random prompts run up to twice --prompt-tokens); past it a backbone would
    decode positions the model does not have."""
    longest = 2 * settings.prompt_tokens if continuous else settings.prompt_tokens
    where = "--new-tokens (with --prompt-tokens)"
    return budget_errors(settings.new_tokens, settings.length, where, longest)


def _models(args) -> int:
    from setdlm.checkpoints.zoo import PUBLISHED, REVISIONS_FILE, pin_revisions

    if args.pin:
        keys = list(PUBLISHED) if args.pin == ["all"] else args.pin
        for key, commit in pin_revisions(keys).items():
            print(f"{key:22s} pinned to {commit}")
        print(f"wrote {REVISIONS_FILE}; commit it so that every run loads these weights")
        return 0
    for spec in PUBLISHED.values():
        extra = f"  ({spec.note})" if spec.note else ""
        revision = spec.revision[:12] if spec.revision else "unpinned"
        print(
            f"{spec.key:22s} {spec.hub_id:42s} {spec.family:7s} L={spec.length:<5d} "
            f"{revision}{extra}"
        )
    return 0


def _generate(args) -> int:
    from setdlm.checkpoints.zoo import load_pretrained, load_tokenizer_for
    from setdlm.core.decoding import DecodeConfig
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.eval.commands import decoding_option_errors, tokenizer_option_errors
    from setdlm.families import with_knobs

    if not args.prompt.strip():
        raise SettingError(
            "--prompt is empty: expected text to continue (samples from BOS alone are "
            "`setdlm eval unconditional`)"
        )
    loaded = load_pretrained(args.model)
    length = loaded.model.config.length
    knobs = {"window": args.window, "block_size": args.block_size}
    raise_for(decoding_option_errors(loaded.model, args.model, knobs, args.policy))
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer_for(loaded)
    raise_for(tokenizer_option_errors(tokenizer, loaded.model))
    spec = loaded.spec
    prompt = tokenizer.encode(args.prompt, add_special_tokens=False)
    if not args.no_bos and tokenizer.bos_token_id is not None:
        prompt = [tokenizer.bos_token_id, *prompt]
    if len(prompt) >= length:
        raise SettingError(
            f"--prompt: {len(prompt)} tokens leave no room in a model of length {length}; "
            f"expected at most {length - 1}"
        )
    # By default as many new tokens as fit, at most 64.
    budget = args.max_new_tokens or min(64, length - len(prompt))
    raise_for(budget_errors(budget, length, "--max-new-tokens", len(prompt)))
    config = DecodeConfig(
        max_new_tokens=budget,
        confidence_threshold=args.threshold,
        do_sample=args.sample,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        eos_token_ids=(tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else (),
    )
    family = loaded.model.config.family
    # A published checkpoint decodes with its paper knobs unless an option says otherwise.
    config = with_knobs(config, family, **(spec.decode_knobs() if spec is not None else {}))
    config = with_knobs(config, family, args.policy, **knobs)
    output = loaded.model.generate([prompt], config, seeds=[args.seed])
    print(tokenizer.decode(output.new_token_ids[0]))
    print(
        f"[{output.num_generated[0]} tokens, {output.nfe} backbone forwards, "
        f"parallelism {output.parallelism[0]:.2f}, {output.wall_seconds:.2f} s]",
        file=sys.stderr,
    )
    return 0


def _eval(args) -> int:
    from setdlm.eval.commands import run

    return run(args)


def _lm_eval(args) -> int:
    from setdlm.eval.harness import lm_eval_main

    return lm_eval_main(args.rest)


def _lm_eval_tasks(args) -> int:
    from setdlm.eval.harness import write_gsm8k_tasks

    print(write_gsm8k_tasks(args.folder, args.source))
    return 0


# name -> ("module:function taking argv and returning an exit code", help)
PASSTHROUGH = {
    "data": ("setdlm.workflow.data:main", "prepare task data with a sha256 + row-count manifest"),
    "train": ("setdlm.workflow.train:main", "train one model of a workflow configuration"),
    "profile": ("setdlm.workflow.profile:main", "install the Snakemake profiles (slurm)"),
    "sync": ("setdlm.tracking:sync_main", "mirror finished results into MLflow (idempotent)"),
    "ui": ("setdlm.tracking:ui_main", "open the MLflow UI on the local store"),
    "report": ("setdlm.report:main", "tables and Pareto figures from the result files"),
    "check": ("setdlm.report:check_main", "compare results with a committed baseline"),
    "compare": ("setdlm.report.compare:main", "do two runs of one configuration agree exactly"),
    "check-decoding": (
        "setdlm.report.decoding_check:main",
        "decode the default's points with the reference models against a baseline (make check)",
    ),
    "check-speed": (
        "setdlm.report.speed_check:main",
        "the decoding engine's time per step relative to the backbone's, against a reference",
    ),
    "check-training": (
        "setdlm.report.training_check:main",
        "trained models' losses and accuracy against the reference seeds' spread",
    ),
    "export-references": (
        "setdlm.workflow.train:export_main",
        "copy a run's trained models into the reference folder (make reference-models)",
    ),
    "analyze-errors": (
        "setdlm.recipes.error_analysis:main",
        "where an arithmetic model goes wrong: errors by the role of the token",
    ),
    "aggregate": (
        "setdlm.eval.seeds:main",
        "a point's per-seed results into its metrics.json (mean, two-level interval)",
    ),
}
PASSTHROUGH_HELP = {name: help_text for name, (_, help_text) in PASSTHROUGH.items()}


def _forward(args) -> int:
    import importlib

    if args.command == "lm-eval":
        return _lm_eval(args)
    module, function = PASSTHROUGH[args.command][0].split(":")
    return getattr(importlib.import_module(module), function)(args.rest)


COMMANDS = {
    **{name: _forward for name in PASSTHROUGH},
    "eval": _eval,
    "lm-eval": _lm_eval,
    "lm-eval-tasks": _lm_eval_tasks,
    "tiny": _tiny,
    "parity": _parity,
    "bench": _bench,
    "models": _models,
    "import-legacy": _import_legacy,
    "generate": _generate,
}

if __name__ == "__main__":
    sys.exit(main())
