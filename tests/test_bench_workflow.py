"""`setdlm bench workflow`: a run's time per stage, job and point, from the benchmark files the
workflow's rules write and the points' own times (a real workflow's: tests/test_shards.py)."""

from __future__ import annotations

import json

import pytest

from setdlm.recipes.bench_workflow import BenchWorkflowError, job_times, summary

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _benchmark(run, name, seconds, cpu):
    folder = run / "benchmarks"
    folder.mkdir(parents=True, exist_ok=True)
    row = f"{seconds}\t0:00:{int(seconds):02d}\t100\t200\t90\t95\t0.1\t0.2\t50\t{cpu}\n"
    (folder / f"{name}.tsv").write_text(HEADER + row)


def _point(run, key, started, finished):
    folder = run / key
    folder.mkdir(parents=True)
    times = {"started_at": started, "finished_at": finished}
    (folder / "metrics.json").write_text(json.dumps({"examples": 3, "times": times}))


def test_the_summary_adds_jobs_per_stage_and_points_per_task(tmp_path):
    run = tmp_path / "runs" / "tiny"
    _benchmark(run, "train_ar-arith_seed-0", 2.0, 1.5)
    _benchmark(run, "train_ar-arith_seed-1", 4.0, 3.5)
    _benchmark(run, "evaluate_ar-arith_seed-0", 30.0, 28.0)
    _benchmark(run, "aggregate_arithmetic-solve_ar-arith", 1.0, 0.9)
    _benchmark(run, "table_arithmetic", 3.0, 2.5)
    _benchmark(run, "mlflow-sync", 5.0, 4.0)
    _point(run, "arithmetic-solve/ar-arith/tau-1e+06/seed-0", "2026-12-06T10:00:00+00:00",
           "2026-12-06T10:00:10+00:00")  # fmt: skip
    _point(run, "arithmetic-infill/ar-arith/tau-1e+06/seed-0", "2026-12-06T10:00:10+00:00",
           "2026-12-06T10:00:16+00:00")  # fmt: skip
    text = summary(run)
    assert "| train / reference copy | 2 | 6.0 | 5.0 | 3.00 |" in text
    assert "| evaluate | 1 | 30.0 | 28.0 | 30.00 |" in text
    assert "| MLflow sync | 1 | 5.0 | 4.0 | 5.00 |" in text
    assert "| all | 6 | 45.0 | 40.4 | 7.50 |" in text
    assert "| arithmetic-solve | 1 | 10.0 | 10.00 |" in text
    assert "16.0 s inside their points, 14.0 s outside them" in text
    assert "CPU: " in text


def test_a_run_without_benchmarks_or_with_a_broken_one_is_named(tmp_path):
    with pytest.raises(BenchWorkflowError, match="no benchmark files"):
        job_times(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "figures.tsv").write_text("seconds\n1\n")
    with pytest.raises(BenchWorkflowError, match=r"figures\.tsv: not a Snakemake benchmark"):
        job_times(tmp_path)
