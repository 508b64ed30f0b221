"""The one shape of a ``setdlm`` subcommand, and the commands that forward their arguments."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial


@dataclass(frozen=True)
class Command:
    """``setdlm NAME``: ``help`` is its line in ``setdlm --help``, ``add_arguments(parser)``
    declares its options on its own parser, ``run(args)`` runs it and returns the exit code.

    A command that ``forwards`` parses its own arguments, options and ``--help`` included:
    its ``args.rest`` is everything after its name."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    forwards: bool = False


def forwarded(name: str, target: str, help: str) -> Command:
    """A command run by ``target``, ``"module:function"``: a function that takes the arguments
    after the command's name and returns an exit code (the module is imported when it runs)."""
    return Command(name, help, _add_rest, partial(_forward, target), forwards=True)


def _add_rest(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER)


def _forward(target: str, args: argparse.Namespace) -> int:
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)(args.rest)


def group(name: str, help: str, dest: str, commands: tuple[Command, ...]) -> Command:
    """A command whose first argument names one of ``commands`` (``setdlm bench decode``),
    in ``args.<dest>``."""
    by_name = {command.name: command for command in commands}

    def run(args: argparse.Namespace) -> int:
        return by_name[getattr(args, dest)].run(args)

    return Command(name, help, partial(add_commands, commands=commands, dest=dest), run)


def add_commands(
    parser: argparse.ArgumentParser,
    commands: tuple[Command, ...],
    dest: str,
    only: str | None = None,
) -> None:
    """A required sub-command of ``parser``, one of ``commands``, its name in ``args.<dest>``.
    With ``only``, only that command declares its arguments: the others are there by name and
    help, all that ``parser``'s own ``--help`` shows of them."""
    parsers = parser.add_subparsers(dest=dest, required=True)
    for command in commands:
        sub = parsers.add_parser(command.name, help=command.help, add_help=not command.forwards)
        if only is None or command.name == only:
            command.add_arguments(sub)
