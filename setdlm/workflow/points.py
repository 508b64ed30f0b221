"""Guards around one evaluation job (``<task>/<model>/<point>/``), run by the evaluate rule:

    python -m setdlm.workflow.points start FOLDER CONFIG_HASH CODE_VERSION
    setdlm eval ... --out FOLDER
    python -m setdlm.workflow.points finish FOLDER

and, for a model trained once per seed, the same three steps for every τ point of one (task,
model, policy, seed) in one process (the sweep rules; a Python process with torch takes seconds
to start, longer than decoding a point of the default):

    python -m setdlm.workflow.points sweep RUN TASK MODEL POLICY SEED CODE_VERSION

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


def sweep(
    run: str, task: str, model: str, policy: str, seed: int, code_version: str, threads: int = 1
) -> int:
    """Every τ point of one (task, model, decoding policy) for one training seed, in one
    process: what the evaluate rule does per point (start, ``setdlm eval``, finish), without
    paying the start of a Python process with torch for each point. The points and their
    arguments are the plan's, rebuilt from the run's validated ``config.yaml``. ``policy``:
    ``own`` for the family's own decoding policy."""
    import os

    import yaml

    from setdlm.cli import main as setdlm
    from setdlm.workflow.plan import build

    config = yaml.safe_load((Path(run) / "config.yaml").read_text(encoding="utf-8"))
    plan = build(config, os.environ, log=lambda message: None)
    chosen = sweep_points(plan, task, model, policy, seed)
    if not chosen:
        print(
            f"{run}: no {task} point of {model} ({policy} policy) for seed {seed}", file=sys.stderr
        )
        return 2
    for point in chosen:
        start(point.folder, point.config_hash, code_version)
        code = setdlm(["--threads", str(threads), "eval", *point.args])
        if code != 0:
            print(f"{point.folder}: setdlm eval exited {code}", file=sys.stderr)
            return code
        metrics = finish(point.folder)
        print(f"{point.folder}: {metrics['examples']} examples, each once", flush=True)
    return 0


OWN_POLICY = "own"  # a sweep with the family's own decoding policy


def point_policy(point: str) -> str:
    """The decoding policy a point folder name says (``own`` for the family's)."""
    from setdlm.results.layout import POINT_NAME

    match = POINT_NAME.match(point)
    return (match["policy"] if match else None) or OWN_POLICY


def seed_sweeps(plan) -> dict[tuple[str, str, str], list[str]]:
    """(task, model, policy) -> its point names, for the models trained once per seed: each
    sweep is one job per seed (the workflow's sweep rules)."""
    sweeps: dict[tuple[str, str, str], list[str]] = {}
    for task, model, point, _ in plan.seed_points:
        names = sweeps.setdefault((task, model, point_policy(point)), [])
        if point not in names:
            names.append(point)
    return sweeps


def sweep_points(plan, task: str, model: str, policy: str, seed: int) -> list:
    """The plan's seed points of one sweep, in the configuration's τ order."""
    return [
        point
        for (t, m, name, s), point in plan.seed_points.items()
        if (t, m, s) == (task, model, seed) and point_policy(name) == policy
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and len(argv) == 4:
        start(*argv[1:])
        return 0
    if argv[:1] == ["sweep"]:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m setdlm.workflow.points sweep")
        for name in ("run", "task", "model", "policy"):
            parser.add_argument(name)
        parser.add_argument("seed", type=int)
        parser.add_argument("code_version")
        parser.add_argument("--threads", type=int, default=1)
        args = parser.parse_args(argv[1:])
        return sweep(
            args.run, args.task, args.model, args.policy, args.seed, args.code_version, args.threads
        )
    if argv[:1] == ["finish"] and len(argv) == 2:
        metrics = finish(argv[1])
        print(f"{argv[1]}: {metrics['examples']} examples, each once")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
