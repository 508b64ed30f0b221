"""What a result records about the job that ran it, and `setdlm compare` between two runs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from setdlm.eval.fingerprint import run_provenance, sample_provenance
from setdlm.report.compare import compare_runs, main
from setdlm.util.scheduler import current_job

SLURM_STEP = {
    "SLURM_JOB_ID": "417",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURMD_NODENAME": "node07",
    "SLURM_RESTART_COUNT": "1",
    "SLURM_CLUSTER_NAME": "localci",
}


def test_current_job_reads_the_slurm_variables_and_is_none_elsewhere(monkeypatch):
    assert current_job({"HOME": "/root"}) is None
    job = current_job(SLURM_STEP)
    assert job == {
        "scheduler": "slurm",
        "job_id": "417",
        "step_id": "0",
        "restart_count": "1",
        "cluster": "localci",
        "partition": "gpu",
        "node": "node07",
    }
    assert current_job({"SLURM_JOBID": "9"})["job_id"] == "9"  # the older spelling

    for name in list(SLURM_STEP) + ["SLURM_JOBID"]:
        monkeypatch.delenv(name, raising=False)
    assert sample_provenance()["job_id"] is None
    monkeypatch.setenv("SLURM_JOB_ID", "418")
    records = [{"code_version": "abc", "job_id": "9"}, {"code_version": "abc", "job_id": "10"}]
    provenance = run_provenance(records + [sample_provenance() | {"code_version": "abc"}])
    assert provenance["jobs"] == ["9", "10", "418"]  # numeric order, each once
    assert provenance["scheduler"]["job_id"] == "418"
    assert provenance["code_versions"] == ["abc"]


def _write_point(run: Path, outputs: list[list[int]], seconds: float, job: str) -> Path:
    folder = run / "gsm8k" / "ar" / "tau-1e+06"
    folder.mkdir(parents=True)
    lines = [
        {
            "id": i,
            "output_ids": ids,
            "scores": {"em": 1.0},
            "seconds": seconds * (i + 1),
            "warmup": i == 0,
            "code_version": job,
            "job_id": job,
            "attempts": [{"nfe": 3, "latency_seconds": seconds}],
        }
        for i, ids in enumerate(outputs)
    ]
    (folder / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    metrics = {
        "config_hash": "h1",
        "examples": len(lines),
        "quality": {"em": 1.0},
        "speed": {"tokens_per_second": 100 / seconds},
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    models = run / "models" / "ar"
    models.mkdir(parents=True)
    _write_weights(models, b"the same weights")
    return folder


def _write_weights(models: Path, data: bytes) -> None:
    """A model file and the marker that records its sha256, as setdlm train writes them."""
    (models / "model.safetensors").write_bytes(data)
    recorded = {"model.safetensors": hashlib.sha256(data).hexdigest()}
    (models / "checkpoint.json").write_text(json.dumps({"files": recorded}))


def test_compare_ignores_how_a_run_went_and_reports_what_it_computed(tmp_path, capsys):
    local, cluster = tmp_path / "local", tmp_path / "cluster"
    _write_point(local, [[1, 2], [3]], seconds=0.5, job="local")
    folder = _write_point(cluster, [[1, 2], [3]], seconds=2.0, job="417")
    assert compare_runs(local, cluster) == (1, [])
    assert main([str(local), str(cluster)]) == 0
    assert "1 result points compared: identical results" in capsys.readouterr().out

    lines = (folder / "samples.jsonl").read_text().splitlines()
    changed = json.loads(lines[1]) | {"output_ids": [4]}
    (folder / "samples.jsonl").write_text(lines[0] + "\n" + json.dumps(changed) + "\n")
    _write_weights(cluster / "models" / "ar", b"other weights")
    compared, differences = compare_runs(local, cluster)
    assert differences == [
        "gsm8k/ar/tau-1e+06: sample 1 differs in ['output_ids']",
        "models/ar: files differ: ['model.safetensors']",
    ]
    assert main([str(local), str(cluster)]) == 1
    # a file truncated after its marker was written is not "identical", even to a twin marker
    _write_weights(cluster / "models" / "ar", b"the same weights")
    (cluster / "models" / "ar" / "model.safetensors").write_bytes(b"the same")
    model_lines = [d for d in compare_runs(local, cluster)[1] if d.startswith("models/")]
    assert "no longer match the sha256 in checkpoint.json" in model_lines[0]
    assert model_lines[1] == "models/ar: files differ: ['model.safetensors']"

    # compare holds what `setdlm check` holds: a resumed run's NFE or timed count must agree
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["speed"] |= {"nfe_mean": 12.0, "timed_examples": 1}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    speed_lines = [d for d in compare_runs(local, cluster)[1] if "speed." in d]
    assert speed_lines == [
        "gsm8k/ar/tau-1e+06: metrics.json speed.nfe_mean differs: None vs 12.0",
        "gsm8k/ar/tau-1e+06: metrics.json speed.timed_examples differs: None vs 1",
    ]

    shutil.rmtree(folder)
    assert compare_runs(local, cluster)[1][0] == f"gsm8k/ar/tau-1e+06: only in {local}"
