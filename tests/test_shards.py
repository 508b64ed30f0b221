"""One point over several jobs (a task's `shards`, setdlm/workflow/jobs.py), through Snakemake:
the merged point equals the point one job decodes, sample by sample and in its quality, and a
lost shard is decoded again alone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_env import copy_of_run, environ

from setdlm.report.compare import RUN_FIELDS, compare_runs

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SHARDS = 3

# A model of each kind of cache (AR's, SetDLM's) trained a few steps on the arithmetic
# problems, solving 10 of them at τ = 1e6 and 0.5: what the shards split is the examples.
CONFIG = {
    "name": "shards",
    "train": {
        "corpus": "arithmetic",
        "generator": "arithmetic-2",
        "problems": 200,
        "length": 64,
        "hidden_size": 32,
        "num_layers": 1,
        "steps": 10,
        "warmup_steps": 2,
        "batch_size": 8,
    },
    "models": {
        "ar": {"family": "ar", "train": {}},
        "setdlm-smax8": {"family": "setdlm", "d": 4, "window": 4, "train": {}},
    },
    "tasks": {
        "arithmetic-solve": {
            "models": ["ar", "setdlm-smax8"],
            "limit": 10,
            "thresholds": [1.0e6, 0.5],
            "overrides": {"ar": {"thresholds": [1.0e6]}},
            "jobs": "point",
            "batch_size": 4,
            "timed_examples": 3,
        }
    },
}


def _run(workdir: Path, data_dir: Path, config: dict, *targets: str) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    command = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2"]
    command += [*(targets or ("all_evaluations",)), "--configfile", str(workdir / "config.yaml")]
    done = subprocess.run(command, capture_output=True, text=True, env=environ(data_dir))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout + done.stderr


def _sample_lines(folder: Path) -> list[str]:
    """samples.jsonl line by line, less the fields that say how the run went."""
    lines = (folder / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    return [json.dumps({k: v for k, v in r.items() if k not in RUN_FIELDS}) for r in rows]


# whole workflow runs in subprocesses: the end-to-end tier (issue 47)
@pytest.mark.slow
@pytest.mark.e2e
def test_a_sharded_point_equals_the_point_of_one_job_and_a_missing_shard_runs_alone(
    tmp_path, data_dir
):
    whole = tmp_path / "whole"
    _run(whole, data_dir, CONFIG)
    sharded_config = json.loads(json.dumps(CONFIG))
    sharded_config["tasks"]["arithmetic-solve"]["shards"] = SHARDS
    run = "results/runs/shards"
    point = "arithmetic-solve/setdlm-smax8/tau-0.5"
    # The same trained models (a copy of the run, Snakemake's records with it), the points gone:
    # the sharded run decodes them again and trains nothing.
    sharded = copy_of_run(whole, tmp_path)
    shutil.rmtree(sharded / run / "arithmetic-solve")
    # Every shard but one (as when a shard job was killed, or its node lost): then the run
    # decodes that shard alone, and merges each point.
    points = (point, "arithmetic-solve/setdlm-smax8/tau-1e+06", "arithmetic-solve/ar/tau-1e+06")
    shard_markers = [
        f"{run}/{where}/shards/{index}-of-{SHARDS}/shard.json"
        for where in points
        for index in range(SHARDS)
    ]
    missing = f"{run}/{point}/shards/1-of-{SHARDS}/shard.json"
    first = _run(sharded, data_dir, sharded_config, *[m for m in shard_markers if m != missing])
    assert re.search(rf"^evaluate_shard\s+{3 * SHARDS - 1}$", first, re.MULTILINE), first[-3000:]
    assert not re.search(r"^train_model\s", first, re.MULTILINE), first[-3000:]
    output = _run(sharded, data_dir, sharded_config)
    assert re.search(r"^evaluate_shard\s+1$", output, re.MULTILINE), output[-3000:]
    assert "wildcards: where=arithmetic-solve/setdlm-smax8/tau-0.5, shard=1-of-3" in output

    compared, differences = compare_runs(whole / run, sharded / run)
    assert compared == 3 and differences == []
    assert _sample_lines(sharded / run / point) == _sample_lines(whole / run / point)
    quality = [
        json.dumps(json.loads((root / run / point / "metrics.json").read_text())["quality"])
        for root in (whole, sharded)
    ]
    assert quality[0] == quality[1]  # the same bytes
    shards = sorted((sharded / run / point / "shards").iterdir())
    assert [s.name for s in shards] == [f"{i}-of-{SHARDS}" for i in range(SHARDS)]
    assert [len(_sample_lines(s)) for s in shards] == [3, 3, 4]
    assert "Nothing to be done" in _run(sharded, data_dir, sharded_config)

    # where the time went: every job's benchmark file, shards included
    from setdlm.recipes.bench_workflow import summary

    text = summary(sharded / run)
    assert re.search(rf"\| evaluate \| {3 + 3 * SHARDS} \|", text), text
    assert "| arithmetic-solve | 3 |" in text


def test_shards_need_a_job_per_point():
    """A job over several points cannot be split by examples: the configuration says so."""
    import os

    from setdlm.workflow.config import ConfigError
    from setdlm.workflow.plan import build

    config = json.loads(json.dumps(CONFIG))
    config["tasks"]["arithmetic-solve"].update(jobs="task", shards=2)
    with pytest.raises(ConfigError, match=r"arithmetic-solve\.shards: .*needs `jobs: point`"):
        build(config, os.environ, log=lambda message: None)
