"""Guards around each evaluation point (``<task>/<model>/<point>/``, or its ``seed-<k>/``):

    python -m setdlm.workflow.points start FOLDER CONFIG_HASH CODE_VERSION
    setdlm eval ... --out FOLDER
    python -m setdlm.workflow.points finish FOLDER

and the evaluation jobs, which take these three steps for each of their points in one process
(setdlm/workflow/jobs.py: a Python process with torch takes seconds to start, longer than
decoding a point of the default), and the shard jobs of a point split over several jobs (whose
point job then merges them):

    python -m setdlm.workflow.points job RUN KEY CODE_VERSION
    python -m setdlm.workflow.points shard RUN POINT SHARD CODE_VERSION

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


def run_job(run: str, key: str, code_version: str, threads: int = 1) -> int:
    """Every point of one evaluation job (setdlm/workflow/jobs.py), in one process: what a job
    per point does (start, ``setdlm eval``, finish), without paying the start of a Python
    process with torch (and a model, a featurizer, a scorer) for each point. The points and
    their arguments are the plan's, rebuilt from the run's validated ``config.yaml``; a point
    already finished by this configuration and code returns at once."""
    import os

    import yaml

    from setdlm.cli import main as setdlm
    from setdlm.workflow.jobs import evaluation_jobs
    from setdlm.workflow.plan import build

    config = yaml.safe_load((Path(run) / "config.yaml").read_text(encoding="utf-8"))
    jobs = evaluation_jobs(build(config, os.environ, log=lambda message: None))
    if key not in jobs:
        print(f"{run}: no evaluation job {key!r} in its configuration", file=sys.stderr)
        return 2
    job = jobs[key]
    for point in job.points:
        start(point.folder, point.config_hash, code_version)
        if job.shards > 1:  # its samples are its shards': the evaluation then only scores
            from setdlm.eval.runner import merge_shards

            count = merge_shards(Path(point.folder), [Path(s.folder) for s in job.shard_jobs()])
            print(f"{point.folder}: {count} samples from {job.shards} shards", flush=True)
        code = setdlm(["--threads", str(threads), "eval", *point.args])
        if code != 0:
            print(f"{point.folder}: setdlm eval exited {code}", file=sys.stderr)
            return code
        metrics = finish(point.folder)
        print(f"{point.folder}: {metrics['examples']} examples, each once", flush=True)
    return 0


def run_shard(run: str, where: str, name: str, code_version: str, threads: int = 1) -> int:
    """One shard job: a slice of a point's examples into ``<point>/shards/<name>/``, with the
    guards of a point (its stamp names the shard: another slicing starts it over)."""
    import os

    import yaml

    from setdlm.cli import main as setdlm
    from setdlm.workflow.jobs import shard_jobs
    from setdlm.workflow.plan import build

    config = yaml.safe_load((Path(run) / "config.yaml").read_text(encoding="utf-8"))
    shards = shard_jobs(build(config, os.environ, log=lambda message: None), run)
    if (where, name) not in shards:
        print(f"{run}: no shard {name} of {where} in its configuration", file=sys.stderr)
        return 2
    shard = shards[(where, name)]
    start(shard.folder, f"{shard.point.config_hash}/{name}", code_version)
    code = setdlm(["--threads", str(threads), "eval", *shard.args])
    if code == 0:
        marker = json.loads((Path(shard.folder) / "shard.json").read_text())
        print(f"{shard.folder}: {len(marker['examples'])} examples", flush=True)
    return code


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and len(argv) == 4:
        start(*argv[1:])
        return 0
    if argv[:1] == ["job"]:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m setdlm.workflow.points job")
        for name in ("run", "key", "code_version"):
            parser.add_argument(name)
        parser.add_argument("--threads", type=int, default=1)
        args = parser.parse_args(argv[1:])
        return run_job(args.run, args.key, args.code_version, args.threads)
    if argv[:1] == ["shard"]:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m setdlm.workflow.points shard")
        for name in ("run", "where", "name", "code_version"):
            parser.add_argument(name)
        parser.add_argument("--threads", type=int, default=1)
        args = parser.parse_args(argv[1:])
        return run_shard(args.run, args.where, args.name, args.code_version, args.threads)
    if argv[:1] == ["finish"] and len(argv) == 2:
        metrics = finish(argv[1])
        print(f"{argv[1]}: {metrics['examples']} examples, each once")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
