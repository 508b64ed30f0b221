"""The command line's one shape: every command is a ``Command`` (a name, a help line, an
``add_arguments`` and a ``run``) registered in ``setdlm.cli.COMMANDS``, and ``setdlm --help``
lists exactly those."""

from __future__ import annotations

import re

import pytest

from setdlm.cli import BY_NAME, COMMANDS, build_parser, main
from setdlm.commands.command import Command


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse after --help
        return stop.code or 0


def test_every_registered_command_has_the_one_shape():
    assert len(BY_NAME) == len(COMMANDS), "two commands share a name"
    for command in COMMANDS:
        assert isinstance(command, Command), command
        assert command.name and command.help.strip(), command
        assert callable(command.add_arguments) and callable(command.run), command.name


def test_the_help_lists_exactly_the_registered_commands(capsys):
    assert _exit_code(["--help"]) == 0
    out = capsys.readouterr().out
    (listed,) = set(re.findall(r"\{([a-z,-]+)\}", out))
    assert listed.split(",") == [command.name for command in COMMANDS]
    squeezed = "".join(out.split())  # each help line, however argparse wrapped it
    for command in COMMANDS:
        assert "".join(f"{command.name} {command.help}".split()) in squeezed, command.name
    assert "--threads THREADS" in out and "--quiet" in out


def test_the_parser_built_for_one_command_lists_the_others_the_same():
    # `setdlm NAME` declares NAME's arguments alone: nothing else shows in the top help
    everything = build_parser().format_help()
    assert build_parser(only="").format_help() == everything
    assert build_parser(only="models").format_help() == everything


@pytest.mark.parametrize("name", [command.name for command in COMMANDS])
def test_every_command_s_help_exits_0(name, capsys):
    assert _exit_code([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    if not BY_NAME[name].forwards:  # a forwarded command's help is its own (lm-eval's too)
        assert out.startswith(f"usage: setdlm {name} ")


def test_bench_lists_its_commands_and_each_one_s_help_exits_0(capsys):
    assert _exit_code(["bench", "--help"]) == 0
    assert "{real-size,gpu,decode,workflow}" in capsys.readouterr().out
    for name in ("real-size", "gpu", "decode", "workflow"):
        assert _exit_code(["bench", name, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: setdlm bench {name} ")
