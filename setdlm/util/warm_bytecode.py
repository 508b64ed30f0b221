"""Import every setdlm module once, and the test and workflow tools the Makefile runs, so that
Python writes their bytecode (``__pycache__``) at install time (``make install`` runs this).

pip installs the dependencies with ``--no-compile``: compiling all 21,000 of their modules took
74 of the install's 111 CPU-seconds (AMD EPYC), and the project imports about 6,000 of them.
Left to the first import, those were compiled by the first command a user ran: the first
``make test-fast`` after an install took 70 s on a 2-core AMD EPYC at 2.0 GHz (AVX2) against
35-37 s warm (issue 47). Importing them here compiles exactly what the project uses, whatever
the dependencies' versions, once.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import setdlm

# What the Makefile's commands import beyond setdlm itself: the test runner with its plugins,
# and the workflow engine's command line.
TOOLS = ("pytest", "xdist", "hypothesis", "snakemake.cli")


def setdlm_modules() -> list[str]:
    return sorted(
        module.name
        for module in pkgutil.walk_packages(setdlm.__path__, prefix="setdlm.")
        if not module.name.endswith("__main__")
    )


def main() -> int:
    started = time.perf_counter()
    names = [*setdlm_modules(), *TOOLS]
    for name in names:
        importlib.import_module(name)
    seconds = time.perf_counter() - started
    print(f"warm_bytecode: {len(names)} modules and what they import, in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
