"""The ``setdlm`` command line: every workflow step is a subcommand that also works by hand."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="setdlm", description=__doc__)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser(
        "tiny",
        help="train the four tiny families on WikiText-2 and "
        "decode with each (the embedded default job)",
    )
    tiny.add_argument("--out", type=Path, default=Path("results/runs/tiny"))
    tiny.add_argument("--steps", type=int, default=None, help="training steps per family")
    tiny.add_argument(
        "--families", nargs="+", default=None, choices=("ar", "mdlm", "bd3lm", "setdlm")
    )

    parity = commands.add_parser(
        "parity", help="check exact parity with the official code on fixture folders"
    )
    parity.add_argument("folder", type=Path, help="folder of fixture folders (or one of them)")
    parity.add_argument(
        "--strict", action="store_true", help="nominal tolerances only (no float32 noise allowance)"
    )

    bench = commands.add_parser("bench", help="benchmarks")
    bench_commands = bench.add_subparsers(dest="bench", required=True)
    decode = bench_commands.add_parser(
        "decode", help="decode the same prompts with all four families on one tiny backbone"
    )
    decode.add_argument("--backbone", choices=("qwen3", "dit"), default="qwen3")
    decode.add_argument("--layers", type=int, default=4)
    decode.add_argument("--hidden", type=int, default=256)
    decode.add_argument("--prompt-tokens", type=int, default=32)
    decode.add_argument("--new-tokens", type=int, default=128)
    decode.add_argument("--batch-size", type=int, default=1)
    decode.add_argument("--thresholds", type=float, nargs="+", default=[1e6, 0.9])
    decode.add_argument("--repeats", type=int, default=3)

    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return COMMANDS[args.command](args)


def _tiny(args) -> int:
    from dataclasses import replace

    from setdlm.tiny import FAMILIES, TinySettings, run_tiny

    settings = TinySettings()
    if args.steps is not None:
        settings = replace(settings, steps=args.steps)
    run_tiny(args.out, settings, tuple(args.families or FAMILIES))
    return 0


def _parity(args) -> int:
    from setdlm.parity import check_case, check_schedules, fixture_cases

    folder = args.folder
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
    from setdlm.bench import BenchSettings, bench_decode

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
    bench_decode(settings)
    return 0


COMMANDS = {"tiny": _tiny, "parity": _parity, "bench": _bench}

if __name__ == "__main__":
    sys.exit(main())
