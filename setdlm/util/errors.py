"""Input errors: what a user got wrong, reported in a line or two, never as a traceback.

Every error a user can cause (a bad value, file, key, checkpoint, result folder or store) is a
``UserError`` whose message names the input and what was expected. The command lines print it
as ``setdlm <command>: <message>`` and exit 2; anything else that escapes is a bug and keeps its
traceback. ``SETDLM_TRACEBACK=1`` shows the traceback of an input error too.
"""

from __future__ import annotations

import argparse
import os
import sys

TRACEBACK_ENV = "SETDLM_TRACEBACK"
EXIT_USAGE = 2  # argparse's code for bad arguments; ours for every other bad input
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A bad input; the message says which one and what was expected."""


class DataError(UserError, ValueError):
    """A data file that is empty or malformed."""


def report(command: str, run) -> int:
    """``run()``'s exit code; an input error or an interrupt becomes a message and a code."""
    try:
        return run()
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
        print(f"{command}: {error.filename}: {error.strerror or error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{command}: interrupted; finished work is kept, rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a two-line error (the problem, then where the usage is) instead of the
    whole usage block; sub-commands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n(`{self.prog} --help` shows the usage)\n")
