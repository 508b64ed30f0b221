"""``setdlm plan``: the jobs a workflow configuration asks for, by rule, and with ``--cost``
what they cost in GPU hours (setdlm/workflow/cost.py states the model), before submitting."""

from __future__ import annotations

import os
from pathlib import Path

from setdlm.commands.command import Command


def _add_arguments(parser) -> None:
    parser.add_argument(
        "configfiles",
        nargs="+",
        type=Path,
        help="the configuration files, merged in order as `snakemake --configfile A B` does "
        "(e.g. workflows/config/paper.yaml)",
    )
    parser.add_argument(
        "--cost", action="store_true", help="GPUs and GPU hours per rule, with the model's terms"
    )


def merged(paths: list[Path]) -> dict:
    """The files' configuration merged as Snakemake merges --configfile: mappings key by key,
    the later file winning, anything else replaced."""
    from setdlm.workflow.config import ConfigError, load_yaml

    config: dict = {}
    for path in paths:
        try:
            value = load_yaml(path)
        except OSError as error:
            raise ConfigError([f"cannot read it ({error.strerror or error})"], str(path)) from None
        if not isinstance(value, dict):
            raise ConfigError(["expected a mapping of settings"], str(path))
        _update(config, value)
    return config


def _update(into: dict, value: dict) -> None:
    """Snakemake's update_config: a mapping is merged into a mapping of the merged config's own
    (a new one where there was none), never stored as the file's object. A file's YAML alias
    (tiny.yaml's models share one `train` block) must not carry a later file's change to one
    model into the others that share it."""
    for key, item in value.items():
        if isinstance(item, dict):
            if not isinstance(into.get(key), dict):
                into[key] = {}
            _update(into[key], item)
        else:
            into[key] = item


def _run(args) -> int:
    from setdlm.workflow import plan as workflow_plan
    from setdlm.workflow.cost import costs, render

    source = ", ".join(map(str, args.configfiles))
    config = merged(args.configfiles)
    workflow_plan.use_revisions(config, os.environ, source=source)
    plan = workflow_plan.build(config, os.environ, source=source)
    rules = costs(plan)
    if args.cost:
        print(render(rules))
        return 0
    for rule in rules:
        print(f"{rule.rule:22s} {rule.jobs:6d}")
    print(f"{'total':22s} {sum(rule.jobs for rule in rules):6d}")
    return 0


PLAN = Command(
    "plan",
    "the jobs of a workflow configuration by rule (--cost: GPUs and GPU hours), nothing run",
    _add_arguments,
    _run,
)
