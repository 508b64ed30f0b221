"""``setdlm report`` and ``setdlm check``: argument parsing and exit codes.

Exit codes: 0 done (or the check passed), 1 the check found differences, 2 bad input (a
missing folder or baseline, a result folder that breaks the layout).
"""

from __future__ import annotations

import sys
from pathlib import Path

from setdlm.report.tables import TABLES
from setdlm.results.reader import ResultError, load_results
from setdlm.tasks import figure_tasks
from setdlm.util.errors import ArgumentParser
from setdlm.util.validation import output_path

FIGURE_TASKS = figure_tasks()  # every decoding task; likelihood has no speed to plot


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="setdlm report", description="tables and Pareto figures from the result files"
    )
    commands = parser.add_subparsers(dest="what", required=True)
    tables = commands.add_parser("tables", help="the paper's tables as Markdown, CSV and LaTeX")
    tables.add_argument("run_dir", type=Path, help="results/runs/<config name>")
    tables.add_argument("--out", type=output_path, help="default: results/tables/<run name>")
    tables.add_argument(
        "--only",
        nargs="+",
        choices=TABLES,
        default=None,
        help="these tables only (default: those the run has results for)",
    )
    figures = commands.add_parser("figures", help="speed-quality Pareto figures (PNG and PDF)")
    figures.add_argument("run_dir", type=Path, help="results/runs/<config name>")
    figures.add_argument("--out", type=output_path, help="default: results/figures/<run name>")
    figures.add_argument(
        "--only",
        nargs="+",
        choices=FIGURE_TASKS,
        default=None,
        help="these tasks only (default: those the run has results for)",
    )
    for command in (tables, figures):
        command.add_argument(
            "--allow-empty",
            action="store_true",
            help="write even when the run has no finished result (the published numbers only)",
        )
    curves = commands.add_parser(
        "curves", help="learning curves (accuracy and loss along training, a line per seed)"
    )
    curves.add_argument("models", type=Path, help="a models folder (results/runs/<name>/models)")
    curves.add_argument("--tables", type=output_path, required=True, help="folder of the tables")
    curves.add_argument("--figures", type=output_path, required=True, help="folder of the figure")
    args = parser.parse_args(argv)
    if args.what == "curves":
        from setdlm.report.curves import write_curves

        for path in write_curves(args.models, args.tables, args.figures):
            print(path)
        return 0
    try:
        results = load_results(args.run_dir)
    except (FileNotFoundError, ResultError) as error:
        print(f"setdlm report: {error}", file=sys.stderr)
        return 2
    # One folder per run, as the workflow keeps them: the tiny and paper runs never overwrite
    # each other's committed outputs.
    out = args.out or Path("results") / args.what / results.name
    if args.only is None:  # not a table or figure of published numbers alone over a user's file
        which = TABLES if args.what == "tables" else FIGURE_TASKS
        args.only = [name for name in which if _has_results(args.what, name, results)]
        if not args.only and args.allow_empty:
            args.only = list(which)
    if not results.points and not args.allow_empty:
        # Empty tables would replace the ones already there (committed ones included).
        pending = ""
        if results.unfinished:
            listed = ", ".join(results.unfinished[:5])
            pending = f" ({len(results.unfinished)} unfinished: {listed})"
        print(
            f"setdlm report: no finished results in {args.run_dir}{pending}; nothing "
            f"written, {out} is left as it is (--allow-empty writes the published numbers alone)",
            file=sys.stderr,
        )
        return 2
    # Only this command's own files are replaced (setdlm/util/owned_files.py); a folder of the
    # default place that predates the manifest holds this run's own earlier outputs.
    owner = f"run {results.name}"
    adopt = args.out is None
    if args.what == "tables":
        from setdlm.report.tables import write_tables

        written = write_tables(results, out, args.only, owner=owner, adopt=adopt)
    else:
        from setdlm.report.figures import write_figures

        written = write_figures(results, out, args.only, owner=owner, adopt=adopt)
    for path in written:
        print(path)
    if results.unfinished:
        print(
            f"setdlm report: left out {len(results.unfinished)} unfinished point(s): "
            + ", ".join(results.unfinished),
            file=sys.stderr,
        )
    return 0


def _has_results(what: str, name: str, results) -> bool:
    """Whether the run has finished points for a table (its tasks) or a figure (its task)."""
    from setdlm.tasks import table_tasks

    tasks = table_tasks(name) if what == "tables" else (name,)
    return any(results.for_task(task) for task in tasks)


def check_main(argv: list[str] | None = None) -> int:
    from setdlm.report.check import (
        BaselineError,
        compare,
        failure_report,
        load_baseline,
        refuse_unbacked_results,
        write_baseline,
    )

    parser = ArgumentParser(
        prog="setdlm check", description="compare a finished run's metrics with a baseline"
    )
    parser.add_argument("--baseline", type=Path, required=True, help="baseline JSON file")
    parser.add_argument("run_dir", type=Path, help="results/runs/<config name>")
    parser.add_argument(
        "--write", action="store_true", help="create or update the baseline from the results"
    )
    args = parser.parse_args(argv)
    try:
        results = load_results(args.run_dir)
        refuse_unbacked_results(results)
        if args.write:
            return _write(results, args.baseline, write_baseline)
        baseline = load_baseline(args.baseline)
    except (FileNotFoundError, ResultError, BaselineError) as error:
        print(f"setdlm check: {error}", file=sys.stderr)
        return 2
    notes: list[str] = []
    differences, compared = compare(results, baseline, notes)
    for note in notes:
        print(note)
    if differences:
        print(failure_report(differences, results, baseline, args.baseline))
        return 1
    print(
        f"setdlm check: PASSED, {len(baseline['points'])} point(s), {compared} metric(s) "
        f"of {args.run_dir} within tolerance of {args.baseline}"
    )
    return 0


def _write(results, path: Path, write_baseline) -> int:
    if not results.points:
        print(f"setdlm check: no finished results in {results.run_dir}", file=sys.stderr)
        return 2
    if results.unfinished:
        print(
            "setdlm check: not recorded, unfinished (no metrics.json): "
            + ", ".join(results.unfinished),
            file=sys.stderr,
        )
    baseline, previous = write_baseline(results, path)
    now, before = set(baseline["points"]), set((previous or {}).get("points", {}))
    metrics = sum(len(p["metrics"]) for p in baseline["points"].values())
    print(f"setdlm check: wrote {path}: {len(now)} point(s), {metrics} metric(s)")
    for label, keys in (("added", now - before), ("removed", before - now)):
        if previous is not None and keys:
            print(f"  {label}: {', '.join(sorted(keys))}")
    return 0
