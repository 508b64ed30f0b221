"""The packaging files agree with each other and the data directory setting works."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from setdlm.util import paths

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_dependency_is_pinned_exactly():
    for requirement in _pyproject()["project"]["dependencies"]:
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[0-9][0-9A-Za-z.+]*", requirement), (
            f"pyproject.toml dependency {requirement!r} is not pinned with =="
        )


def test_environment_yml_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    python = next(d for d in deps if isinstance(d, str) and d.startswith("python="))
    major_minor = python.split("=", 1)[1]
    requires = _pyproject()["project"]["requires-python"]
    low, high = re.fullmatch(r">=(\d+\.\d+),<(\d+\.\d+)", requires).groups()
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(low) <= as_tuple(major_minor) < as_tuple(high), (
        f"environment.yml python={major_minor} is outside pyproject's {requires}"
    )
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    assert "-e ." in pip_section, "environment.yml must pip-install the project itself"
    pinned = {d for d in pip_section if d != "-e ."}
    project_deps = set(_pyproject()["project"]["dependencies"])
    assert pinned <= project_deps, (
        f"environment.yml pins {sorted(pinned - project_deps)} that pyproject.toml does not"
    )


def test_data_path_names_the_missing_file(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(paths.DataNotFoundError, match="gsm8k/test.jsonl"):
        paths.data_path("gsm8k", "test.jsonl")
    monkeypatch.delenv(paths.DATA_DIR_ENV)
    with pytest.raises(paths.DataNotFoundError, match=paths.DATA_DIR_ENV):
        paths.data_path("gsm8k", "test.jsonl")


def test_data_path_finds_the_mirror(data_dir):
    assert paths.data_path("wikitext2", "wiki.test.raw").stat().st_size > 0
