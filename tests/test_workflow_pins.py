"""A run's revisions table (the configuration's `revisions`), and pins checked against the
offline cache before any job is queued."""

from __future__ import annotations

import json

import pytest
from test_standins import use_cache

from setdlm.checkpoints import standins
from setdlm.checkpoints.zoo import REVISIONS_ENV
from setdlm.util.paths import data_path
from setdlm.workflow import plan as workflow_plan
from setdlm.workflow.config import ConfigError

KEYS = ("lm1b:ar", "lm1b:setdlm-smax8")


def _likelihood_config(revisions=None) -> dict:
    config = {
        "name": "pins",
        "models": {
            "ar": {"family": "ar", "checkpoint": {"lm1b": "lm1b:ar"}},
            "setdlm-smax8": {
                "family": "setdlm",
                "d": 4,
                "window": 4,
                "checkpoint": {"lm1b": "lm1b:setdlm-smax8"},
            },
        },
        "tasks": {"likelihood-lm1b": {"models": ["ar", "setdlm-smax8"], "limit": 2}},
        "data": {"sources": {"lm1b": "hub"}},
    }
    if revisions is not None:
        config["revisions"] = str(revisions)
    return config


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    hf_home = tmp_path_factory.mktemp("hf")
    entries = standins.build_cache(hf_home, data_path("tokenizers"), KEYS, log=lambda _: None)
    return hf_home, {entry.key: entry.commits[-1] for entry in entries if entry.key}


def test_a_pinned_revision_enters_the_identity_and_an_uncached_one_stops_the_plan(
    cache, monkeypatch, tmp_path
):
    hf_home, commits = cache
    use_cache(monkeypatch, hf_home)
    monkeypatch.delenv(REVISIONS_ENV, raising=False)
    environ = {}
    unpinned = workflow_plan.build(_likelihood_config(), environ)
    workflow_plan.check_pins_cached(unpinned)  # nothing pinned: nothing to check
    table = tmp_path / "revisions.json"
    table.write_text(json.dumps({"lm1b:ar": commits["lm1b:ar"]}))
    config = _likelihood_config(table)
    workflow_plan.use_revisions(config, environ)
    monkeypatch.setenv(REVISIONS_ENV, environ[REVISIONS_ENV])  # what the Snakefile's process has
    pinned = workflow_plan.build(config, environ)
    workflow_plan.check_pins_cached(pinned)  # the cache holds it
    key = ("likelihood-lm1b", "ar", "default")
    assert pinned.points[key].config_hash != unpinned.points[key].config_hash
    other = ("likelihood-lm1b", "setdlm-smax8", "default")
    assert pinned.points[other].config_hash == unpinned.points[other].config_hash
    # a commit the offline cache lacks: one error naming the key, the commit, the table and
    # the cache, before any job exists
    missing = "ab" * 20
    table.write_text(json.dumps({"lm1b:setdlm-smax8": missing}))
    with pytest.raises(ConfigError) as error:
        workflow_plan.check_pins_cached(workflow_plan.build(config, environ))
    message = str(error.value)
    assert "models.setdlm-smax8.checkpoint.lm1b: lm1b:setdlm-smax8" in message
    assert missing in message and str(table) in message and str(hf_home / "hub") in message
    assert commits["lm1b:setdlm-smax8"] in message  # what the cache holds instead
    # a table naming an unknown key, or missing: the `revisions` key is named
    table.write_text(json.dumps({"lm1b:nothing": missing}))
    with pytest.raises(ConfigError, match="revisions: .*unknown keys"):
        workflow_plan.use_revisions(config, environ)
    with pytest.raises(ConfigError, match="revisions: .*no such file"):
        workflow_plan.use_revisions(_likelihood_config(tmp_path / "none.json"), environ)


@pytest.mark.slow  # runs snakemake in a subprocess (about 10 s)
def test_snakemake_refuses_an_uncached_pin_before_queueing_jobs(cache, tmp_path, data_dir):
    """The real DAG build: a configuration whose revisions table pins a commit the offline
    cache lacks exits 2 with the message alone, and nothing is run or written."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from workflow_env import environ

    hf_home, _ = cache
    table = tmp_path / "revisions.json"
    table.write_text(json.dumps({"lm1b:ar": "ab" * 20}))
    config = tmp_path / "pinned.yaml"
    config.write_text(yaml.safe_dump(_likelihood_config(table)))
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "-s", str(repo / "Snakefile")]
        + ["-d", str(tmp_path / "work"), "-n", "all_tables", "--configfile", str(config)],
        capture_output=True,
        text=True,
        env=environ(data_dir, HF_HOME=str(hf_home)),
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert f"lm1b:ar (kuleshov-group/lm1b-ar) is pinned to {'ab' * 20} by {table}" in output
    assert "Traceback" not in output and not (tmp_path / "work" / "results").exists()
