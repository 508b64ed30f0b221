"""Input errors: what a user got wrong, reported in a line or two, never as a traceback.

Every error a user can cause (a bad value, file, key, checkpoint, result folder or store) is a
``UserError`` whose message names the input and what was expected. The command lines print it
as ``setdlm <command>: <message>`` and exit 2; anything else that escapes is a bug and keeps its
traceback. ``SETDLM_TRACEBACK=1`` shows the traceback of an input error too.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

TRACEBACK_ENV = "SETDLM_TRACEBACK"
EXIT_USAGE = 2  # argparse's code for bad arguments; ours for every other bad input
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a command the closed pipe stopped exits with


class UserError(Exception):
    """A bad input; the message says which one and what was expected."""


class DataError(UserError, ValueError):
    """A data file that is empty or malformed."""


def report(command: str, run) -> int:
    """``run()``'s exit code; an input error or an interrupt becomes a message and a code."""
    try:
        code = run()
        sys.stdout.flush()  # a reader gone before the last buffered output: caught here too
        return code
    except BrokenPipeError:
        # The reader of the output left (`setdlm report tables RUN | head -1`): nothing is
        # wrong and there is nothing to say. What is still buffered goes nowhere, so that the
        # interpreter's last flush does not fail on the closed pipe again.
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except SystemExit:  # argparse after --help or a usage error: its output may be cut too
        _flush_or_discard_stdout()
        raise
    except UserError as error:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"{command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        # A path the user gave that cannot be read or written (not a folder, no permission,
        # disk full): the path and the reason are the message. Other OS errors are bugs.
        if error.filename is None or os.environ.get(TRACEBACK_ENV):
            raise
        print(f"{command}: {error.filename}: {_os_problem(error)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{command}: interrupted; finished work is kept, rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


def _os_problem(error: OSError) -> str:
    """The reason, in words that say what to do where the OS's alone would not."""
    reason = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"{reason}: nothing was written there; what was finished before is kept (free some "
            "space, then run the same command again: it resumes)"
        )
    if error.errno == errno.EEXIST:
        return f"{reason} (a file is where a folder is needed; expected a folder, or a new path)"
    if error.errno == errno.ENOTDIR:
        return f"{reason} (a file is on the way where a folder is needed)"
    return reason


def _flush_or_discard_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()


def _discard_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's captured stream)
        pass


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a two-line error (the problem, then where the usage is) instead of the
    whole usage block; sub-commands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n(`{self.prog} --help` shows the usage)\n")
