"""Guards around one evaluation job (``<task>/<model>/<point>/``), run by the evaluate rule:

    python -m setdlm.workflow.points start FOLDER CONFIG_HASH CODE_VERSION
    setdlm eval ... --out FOLDER
    python -m setdlm.workflow.points finish FOLDER

Before: ``start`` keeps the samples of an interrupted run of the same job (``setdlm eval``
resumes them) but clears a folder left by another configuration or code version, which the
job is rerunning because of that change. ``workflow.json`` records which job filled the folder.

After: ``finish`` checks what Snakemake cannot: ``metrics.json`` covers every example and
``samples.jsonl`` holds each exactly once. A cluster job whose status reads UNKNOWN is taken
for a success, so a result is only accepted when its files say it is complete.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from setdlm.results.layout import RESULT_FILES
from setdlm.util.files import atomic_write_json

STAMP = "workflow.json"


def start(folder: str | Path, config_hash: str, code_version: str) -> None:
    folder = Path(folder)
    stamp = {"config_hash": config_hash, "code_version": code_version}
    path = folder / STAMP
    if path.exists() and json.loads(path.read_text()) == stamp:
        return  # the same job again: resume its samples
    for name in RESULT_FILES:
        (folder / name).unlink(missing_ok=True)
    atomic_write_json(path, stamp)


def finish(folder: str | Path) -> dict:
    """The metrics, once they are known to describe every sample exactly once."""
    folder = Path(folder)
    metrics = json.loads((folder / "metrics.json").read_text())
    lines = (folder / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    ids = [json.loads(line)["id"] for line in lines if line.strip()]
    duplicated = sorted(i for i, count in Counter(ids).items() if count > 1)
    if duplicated:
        raise RuntimeError(f"{folder}: samples.jsonl repeats examples {duplicated[:5]}")
    if metrics.get("examples") != len(ids):
        raise RuntimeError(
            f"{folder}: metrics.json counts {metrics.get('examples')} examples, "
            f"samples.jsonl holds {len(ids)}"
        )
    return metrics


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and len(argv) == 4:
        start(*argv[1:])
        return 0
    if argv[:1] == ["finish"] and len(argv) == 2:
        metrics = finish(argv[1])
        print(f"{argv[1]}: {metrics['examples']} examples, each once")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
