"""``setdlm tiny``: the embedded default job."""

from __future__ import annotations

import sys
from pathlib import Path

from setdlm.commands.command import Command
from setdlm.families import FAMILY_NAMES
from setdlm.util.validation import option, output_path


def _add_arguments(parser) -> None:
    parser.add_argument("--out", type=output_path, default=Path("results/runs/tiny"))
    parser.add_argument(
        "--steps",
        type=option("$defs/train/properties/steps"),
        default=None,
        help="training steps per family",
    )
    parser.add_argument("--families", nargs="+", default=None, choices=FAMILY_NAMES)


def _run(args) -> int:
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


TINY = Command(
    "tiny",
    "train the four tiny families on WikiText-2 and decode with each (the embedded default job)",
    _add_arguments,
    _run,
)
