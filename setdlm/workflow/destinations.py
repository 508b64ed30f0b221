"""Where a configuration writes, checked before any job: the schema says ``results`` and
``report.tables`` are text, not that the text names a place the run may fill.

Refused, each naming the key, what it names and what was expected:

- an empty or blank folder: it would be the working directory (runs, tables and mlflow.db
  written among the user's own files);
- a file where a folder is expected (``results: README.md`` ended in a NotADirectoryError
  traceback while the DAG was built);
- a folder inside what the project commits or installs: the package (``setdlm/``), the
  workflow definitions (``workflows/``), the committed reference outputs, models and baselines
  (``results/reference/``, ``results/baselines/``): a run would overwrite them.
"""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
PACKAGE = Path(__file__).resolve().parents[1]
# Committed or installed, never a run's output: (folder, what it is)
PROTECTED = (
    (PACKAGE, "the installed setdlm package"),
    (CHECKOUT / "workflows", "the workflow definitions"),
    (CHECKOUT / "results" / "reference", "the committed reference outputs and models"),
    (CHECKOUT / "results" / "baselines", "the committed baselines"),
)


def destination_errors(config: dict, cwd: Path | None = None) -> list[str]:
    """What is wrong with the folders a configuration writes into."""
    cwd = cwd or Path.cwd()
    errors = []
    report = config.get("report") or {}
    keys = [("results", config.get("results"))]
    keys += [(f"report.{key}", report.get(key)) for key in ("tables", "figures")]
    for key, value in keys:
        if value is None and key != "results":
            continue  # the default: <results>/tables/<name>
        problem = folder_problem(value, cwd)
        if problem is not None:
            errors.append(f"{key}: {problem}")
    return errors


def folder_problem(value, cwd: Path) -> str | None:
    """Why ``value`` is not a folder a run may write into, or None."""
    if not isinstance(value, str) or not value.strip():
        return (
            f"{value!r} names no folder (it would be the working directory, among your own "
            "files); expected a folder such as results"
        )
    path = Path(value).expanduser()
    path = path if path.is_absolute() else cwd / path
    if path.exists() and not path.is_dir():
        return f"{value!r} is a file ({path}); expected a folder"
    resolved = path.resolve()
    for folder, what in PROTECTED:
        if resolved == folder or folder in resolved.parents:
            return (
                f"{value!r} is inside {what} ({folder}), which a run would overwrite; "
                "expected a folder of your own, such as results"
            )
    return None
