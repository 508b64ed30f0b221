"""workflows/config/models.yaml, generated from the one table of published checkpoints.

setdlm/checkpoints/zoo.py is where keys, Hub ids and loading settings are defined; models.yaml
shows the same table to workflow configurations (and to the checks that run before any job is
queued) without importing the package. A test fails when the file and the table disagree;
regenerate it with

    python -m setdlm.workflow.models > workflows/config/models.yaml
"""

from __future__ import annotations

import dataclasses
import sys

import yaml

HEADER = """\
# Published checkpoints: compact key -> Hub id and every setting loading needs (no setting is
# guessed from a name). GENERATED from setdlm/checkpoints/zoo.py; do not edit by hand.
# Regenerate with
#   python -m setdlm.workflow.models > workflows/config/models.yaml
# (tests/test_workflow.py fails when this file and the table disagree). Workflow configurations
# name these keys under models.<name>.checkpoint.<domain>.
"""


def models_table() -> dict:
    from setdlm.checkpoints.zoo import PUBLISHED, SIZES

    checkpoints = {}
    for key, spec in PUBLISHED.items():
        settings = dataclasses.asdict(spec)
        del settings["key"]
        checkpoints[key] = settings
    # zoo.resolve also reads "<domain>:setdlm-d<d>" as smax 2d; list the published ones.
    aliases = {
        f"{spec.task}:setdlm-d{spec.d}": f"{spec.task}:setdlm-smax{2 * spec.d}"
        for spec in PUBLISHED.values()
        if spec.d in SIZES  # a SetDLM's d
    }
    return {"checkpoints": checkpoints, "aliases": aliases}


def render() -> str:
    body = yaml.safe_dump(models_table(), sort_keys=False, allow_unicode=True, width=100)
    return HEADER + body


if __name__ == "__main__":
    sys.stdout.write(render())
