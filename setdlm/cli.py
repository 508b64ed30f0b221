"""The ``setdlm`` command line: every workflow step is a subcommand that also works by hand."""

from __future__ import annotations

import argparse
import os
import sys

from setdlm.commands.bench import BENCH
from setdlm.commands.command import Command, add_commands, forwarded
from setdlm.commands.evaluation import EVAL, LM_EVAL, LM_EVAL_TASKS
from setdlm.commands.models import GENERATE, IMPORT_LEGACY, MODELS, PARITY
from setdlm.commands.plan import PLAN
from setdlm.commands.rehearsal import REHEARSAL
from setdlm.commands.tiny import TINY
from setdlm.util.errors import ArgumentParser, report
from setdlm.util.progress import QUIET_ENV
from setdlm.util.validation import THREADS, SettingError

# Every command, in the order `setdlm --help` lists them (setdlm/commands/command.py: the shape).
COMMANDS: tuple[Command, ...] = (
    TINY,
    PARITY,
    IMPORT_LEGACY,
    MODELS,
    GENERATE,
    EVAL,
    LM_EVAL,
    LM_EVAL_TASKS,
    # Commands with their own argument parsers (arguments pass through).
    forwarded(
        "data", "setdlm.workflow.data:main", "prepare task data with a sha256 + row-count manifest"
    ),
    forwarded("train", "setdlm.workflow.train:main", "train one model of a workflow configuration"),
    forwarded("profile", "setdlm.workflow.profile:main", "install the Snakemake profiles (slurm)"),
    forwarded(
        "sync", "setdlm.tracking:sync_main", "mirror finished results into MLflow (idempotent)"
    ),
    forwarded("ui", "setdlm.tracking:ui_main", "open the MLflow UI on the local store"),
    forwarded("report", "setdlm.report:main", "tables and Pareto figures from the result files"),
    forwarded("check", "setdlm.report:check_main", "compare results with a committed baseline"),
    forwarded(
        "compare", "setdlm.report.compare:main", "do two runs of one configuration agree exactly"
    ),
    forwarded(
        "check-decoding",
        "setdlm.report.decoding_check:main",
        "decode the default's points with the reference models against a baseline (make check)",
    ),
    forwarded(
        "check-speed",
        "setdlm.report.speed_check:main",
        "the decoding engine's time per step relative to the backbone's, against a reference",
    ),
    forwarded(
        "check-training",
        "setdlm.report.training_check:main",
        "trained models' losses and accuracy against the reference seeds' spread",
    ),
    forwarded(
        "export-references",
        "setdlm.workflow.train:export_main",
        "copy a run's trained models into the reference folder (make reference-models)",
    ),
    forwarded(
        "analyze-errors",
        "setdlm.recipes.error_analysis:main",
        "where an arithmetic model goes wrong: errors by the role of the token",
    ),
    forwarded(
        "aggregate",
        "setdlm.eval.seeds:main",
        "a point's per-seed results into its metrics.json (mean, two-level interval)",
    ),
    BENCH,
    PLAN,
    REHEARSAL,
)
BY_NAME = {command.name: command for command in COMMANDS}


def main(argv: list[str] | None = None) -> int:
    """Run one command; a bad input ends in a message naming it and exit code 2, not in a
    traceback (setdlm/util/errors.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((a for a in argv if not a.startswith("-") and a in BY_NAME), "")
    return report(f"setdlm {name}".strip(), lambda: _main(argv, name))


def _main(argv: list[str], name: str) -> int:
    argv = _global_options(argv)
    command = BY_NAME.get(argv[0]) if argv else None
    if command is not None and command.forwards:  # it parses its arguments, options included
        return command.run(argparse.Namespace(command=command.name, rest=argv[1:]))
    # Only the named command declares its arguments (`setdlm --help` declares none): the
    # others' may import what this command never needs (eval's, torch).
    args = build_parser(only=name).parse_args(argv)
    return BY_NAME[args.command].run(args)


def build_parser(only: str | None = None) -> ArgumentParser:
    """Every command's parser, or with ``only`` that command's alone in full: the others are
    there by name and help, all that ``setdlm --help`` shows of them."""
    parser = ArgumentParser(prog="setdlm", description=__doc__)
    parser.add_argument(
        "--threads", type=THREADS, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bars (they are off outside a terminal)"
    )
    add_commands(parser, COMMANDS, "command", only)
    return parser


def _global_options(argv: list[str]) -> list[str]:
    """The arguments after the leading global options, which take effect here: before the
    forwarded commands, which parse the rest themselves."""
    while argv[:1] in (["--threads"], ["--quiet"]):
        if argv[0] == "--quiet":
            os.environ[QUIET_ENV] = "1"  # inherited by the processes a command starts
            argv = argv[1:]
            continue
        threads = _parse_threads(argv[1] if len(argv) > 1 else "")
        argv = argv[2:]
        import torch

        torch.set_num_threads(threads)
    return argv


def _parse_threads(text: str) -> int:
    try:
        return THREADS(text)
    except argparse.ArgumentTypeError as error:
        raise SettingError(f"--threads: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
