"""The package installs like one: a wheel (not editable) in a scratch environment, used from an
unrelated folder, finds its schema and checkpoint table as package data and installs the
baselines under ``setdlm.baselines``, never as a top-level ``baselines`` package."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "results" / "reference" / "models" / "setdlm-smax8-arith" / "seed-0"


def _source_copy(into: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore; links kept as links)
    copied to ``into``: building there leaves no build/ in the checkout, and no stale module of
    an earlier build (setuptools reuses build/lib) can slip into the wheel."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], REPO)
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, into / name
        if source.is_symlink() or source.is_file():  # a deleted, still-tracked file is skipped
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return into


def _run(args, cwd, timeout=300) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.e2e
def test_the_wheel_works_from_an_unrelated_folder(tmp_path):
    wheels = tmp_path / "wheels"
    # no build isolation: the build needs setuptools and wheel, which this environment has
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
        ],
        cwd=_source_copy(tmp_path / "source"),
    )
    (wheel,) = wheels.glob("setdlm-*.whl")
    scratch = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(scratch)], cwd=tmp_path)
    python = scratch / "bin" / "python"
    site = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=tmp_path,
    ).strip()
    # The dependencies come from this environment (a path line, so its .pth files, the
    # editable install of the checkout among them, are not run); the project from the wheel.
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        cwd=tmp_path,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    setdlm = str(scratch / "bin" / "setdlm")

    where = _run(
        [str(python), "-c", "import setdlm.baselines.ar as m; print(m.__file__)"], cwd=elsewhere
    )
    assert where.startswith(site)
    top_level = subprocess.run(
        [str(python), "-c", "import baselines"], cwd=elsewhere, capture_output=True, text=True
    )
    assert "No module named 'baselines'" in top_level.stderr

    assert "check-decoding" in _run([setdlm, "--help"], cwd=elsewhere)
    assert "--problem-seed" in _run([setdlm, "eval", "arithmetic", "--help"], cwd=elsewhere)
    assert "kuleshov-group/gsm8k-bd3lm-s4" in _run([setdlm, "models"], cwd=elsewhere)
    out = elsewhere / "eval"
    _run(
        [setdlm, "eval", "arithmetic", "--model", str(MODEL), "--out", str(out), "--limit", "4"]
        # the model's generator, and its solve budget (tiny.yaml's: the longest solution + EOS)
        + ["--generator", "arithmetic-4", "--max-new-tokens", "26"],
        cwd=elsewhere,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 4 and metrics["code_versions"] == ["0.1.0"]
    assert metrics["quality"]["strict_match"]["count"] == 4  # the 4 problems scored
