"""The measured list of slow tests (tests/slow_tests.txt): each test of the fast tier's kind
whose setup, call and teardown took ``THRESHOLD_S`` or more is marked slow by conftest.py.

    python tests/slow_tests.py      # (make slow-tests) measures the fast tier and rewrites it

The measurement runs the fast tier as `make test-fast` does, without the list, with pytest's
``--durations=0``."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

LIST = Path(__file__).with_name("slow_tests.txt")
IGNORE_LIST_ENV = "SETDLM_IGNORE_SLOW_LIST"
THRESHOLD_S = 0.05
HEADER = """\
# Tests of the fast tier's kind (random weights, no workflow run) that each took 0.05 s or more
# (setup included) on the 2-core AMD EPYC: tests/conftest.py marks them slow, so that
# `make test-fast` stays within a minute on the slower Intel Xeon. `make test` runs them all.
# Regenerate with `make slow-tests` after adding tests (it measures the fast tier and rewrites
# this list).
"""
DURATION = re.compile(r"^([0-9.]+)s (?:setup|call|teardown)\s+(\S.*)$")


def listed() -> set[str]:
    """The node ids of the list (none when the measurement asks to ignore it)."""
    if os.environ.get(IGNORE_LIST_ENV) or not LIST.is_file():
        return set()
    lines = LIST.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def measure() -> dict[str, float]:
    command = [sys.executable, "-m", "pytest", "-q", "-m", "not slow and not e2e"]
    command += ["-n", "2", "--dist", "loadfile", "--durations=0", "-p", "no:cacheprovider"]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, IGNORE_LIST_ENV: "1"}
    )
    if done.returncode != 0:
        sys.exit(f"the fast tier failed; fix it first:\n{done.stdout[-3000:]}")
    seconds: dict[str, float] = collections.Counter()
    for line in done.stdout.splitlines():
        if found := DURATION.match(line):
            seconds[found.group(2).strip()] += float(found.group(1))
    return seconds


def main() -> None:
    seconds = measure()
    slow = sorted(node for node, spent in seconds.items() if spent >= THRESHOLD_S)
    LIST.write_text(HEADER + "".join(f"{node}\n" for node in slow), encoding="utf-8")
    print(f"{LIST}: {len(slow)} tests of {sum(seconds[n] for n in slow):.0f} s marked slow")


if __name__ == "__main__":
    main()
