"""The paper rehearsal end to end (`make rehearsal`, in a scratch working directory): the stand-in
cache and data folder, then paper.yaml's whole DAG with workflows/config/paper-rehearsal.yaml
through the local profile. Every table and figure of the paper is written and names the
substitutions, every point is in MLflow (the OWT AR and MDLM DITLegacy ones too) with its
checkpoint's revision, and the pinned older revision is the one loaded.

A run already finished in a working directory named by $SETDLM_REHEARSAL_WORKDIR is checked
instead of running another: .ci/run's rehearsal through SLURM (.ci/rehearsal-stage), so that CI
pays for one rehearsal. About 7 minutes on 2 cores otherwise (docs/reproducing-the-paper.md).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_env import environ

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # make test-e2e, not make test

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = REPO / "workflows" / "config"
NAME = "paper-rehearsal"
TABLES = ("gsm8k_pareto", "cnndm", "rocstories_infill", "unconditional", "likelihood")
FIGURES = ("gsm8k", "cnndm", "infill-1", "infill-3", "unconditional")


def _rehearsal(tmp_path, data_dir) -> Path:
    """The working directory of a finished rehearsal: the one $SETDLM_REHEARSAL_WORKDIR names,
    else a new one."""
    if os.environ.get("SETDLM_REHEARSAL_WORKDIR"):
        return Path(os.environ["SETDLM_REHEARSAL_WORKDIR"])
    work = tmp_path / "work"
    hf_home = work / "results" / "rehearsal" / "hf"
    env = environ(data_dir, HF_HOME=str(hf_home))
    for command in (
        ["rehearsal", "cache", "--hf-home", str(hf_home)],
        ["rehearsal", "data", "--out", str(work / "results" / "rehearsal" / "data")],
    ):
        subprocess.run([str(BIN / "setdlm"), *command], check=True, env=env, cwd=REPO)
    done = subprocess.run(
        [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(work)]
        + ["--profile", str(REPO / "workflows" / "profiles" / "local"), "all_tables"]
        + ["--configfile", str(CONFIG / "paper.yaml"), str(CONFIG / "paper-rehearsal.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=3 * 3600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return work


def test_make_rehearsal_runs_every_rule_of_the_paper_with_stand_ins(tmp_path, data_dir):
    import yaml

    work = _rehearsal(tmp_path, data_dir)
    hf_home = work / "results" / "rehearsal" / "hf"
    overlay = yaml.safe_load((CONFIG / "paper-rehearsal.yaml").read_text())
    for table in TABLES:
        text = (work / "results" / "tables" / NAME / f"{table}.md").read_text()
        assert text.count("SUBSTITUTED in this run") == len(overlay["substitutions"]), table
        assert "(unpinned)" in text or table == "gsm8k_pareto", table
    gsm8k = (work / "results" / "tables" / NAME / "gsm8k_pareto.md").read_text()
    assert "(pinned)" in gsm8k and "(unpinned)" not in gsm8k  # every GSM8K key is pinned
    for task in FIGURES:
        assert (work / "results" / "figures" / NAME / f"{task}_pareto.png").stat().st_size > 0
    pins = json.loads((hf_home / "revisions.json").read_text())
    metrics = json.loads(
        (work / "results/runs" / NAME / "infill-1/setdlm-smax32/tau-1e+06/metrics.json").read_text()
    )
    assert metrics["config"]["model_revision"] == {
        "commit": pins["owt:setdlm-smax32"],
        "pinned": True,
    }
    with sqlite3.connect(work / "results" / "rehearsal" / "mlflow.db") as store:
        sources = store.execute(
            "SELECT params.value FROM params JOIN tags ON params.run_uuid = tags.run_uuid "
            "WHERE params.key = 'checkpoint' AND params.value LIKE '%@%' "
            "AND tags.key = 'setdlm.level' AND tags.value = 'point'"
        ).fetchall()
    assert len(sources) == 102  # every point, each from a Hub snapshot (key@commit)
    assert sum(value.startswith(("owt:ar@", "owt:mdlm@")) for (value,) in sources) == 8
    # infill-1's AR point in 2 shards, merged: every example once, each shard's job named; the
    # other models' infill-1 points in one job each
    infill = work / "results/runs" / NAME / "infill-1"
    assert not (infill / "mdlm/tau-1e+06/shards").exists()
    shards = sorted((infill / "ar/tau-1e+06/shards").iterdir())
    assert [shard.name for shard in shards] == ["0-of-2", "1-of-2"]
    lines = (work / "results/runs" / NAME / "infill-1/ar/tau-1e+06/samples.jsonl").read_text()
    assert len(lines.splitlines()) == sum(
        len(json.loads((shard / "shard.json").read_text())["examples"]) for shard in shards
    )
