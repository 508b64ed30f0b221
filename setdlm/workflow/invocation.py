"""Whether this Snakemake process is about to run jobs, asked while the Snakefile is parsed.

The Snakefile repairs the results folder before the DAG is built (it moves unreadable results
aside and removes tables built from lost results, so that the jobs writing them run again). Those
repairs change files, so they may only happen in the main process of a run that executes jobs:
never in a dry run (``-n``), a ``--touch``, or any command that only reads the workflow
(``--dag``, ``--summary``, ``--list-changes``, ``--unlock``, ``--lint``, ...).

At parse time Snakemake 9.27.1 does not know its executor yet, so ``workflow.dryrun`` reads False
even under ``-n``. Two signals are reliable then: ``workflow.output_settings.dryrun``, set from
the command line before the Snakefile is read, and the command line itself, read with
Snakemake's own argument parser (profiles included). Anything that cannot be read as a plain
run counts as not executing: skipping a repair is safe, a wrong one deletes results.
"""

from __future__ import annotations

import contextlib
import io
import sys

# Options of `snakemake` that select something other than running jobs (snakemake/cli.py,
# args_to_api): with any of them set, the Snakefile is parsed but no job runs.
NON_EXECUTING_OPTIONS = (
    "dryrun",
    "touch",
    "lint",
    "list_target_rules",
    "list_rules",
    "print_compilation",
    "dag",
    "rulegraph",
    "filegraph",
    "d3dag",
    "unlock",
    "cleanup_metadata",
    "conda_cleanup_envs",
    "conda_create_envs_only",
    "list_conda_envs",
    "cleanup_shadow",
    "container_cleanup_images",
    "list_changes",
    "list_input_changes",
    "list_params_changes",
    "list_untracked",
    "summary",
    "detailed_summary",
    "archive",
    "delete_all_output",
    "delete_temp_output",
    "containerize",
    "generate_unit_tests",
)


def executes(workflow, argv: list[str] | None = None) -> bool:
    """True only in the main process of a Snakemake command that runs jobs."""
    if not workflow.is_main_process:
        return False  # a job's own process (a cluster job re-reads the Snakefile)
    if workflow.dryrun or workflow.output_settings.dryrun:
        return False
    return command_line_executes(sys.argv[1:] if argv is None else argv)


def parsed_command_line(argv: list[str]):
    """Snakemake's own parse of ``snakemake ARGV`` (profiles included); None when ARGV is not a
    Snakemake command line."""
    from snakemake.cli import parse_args

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            _, args = parse_args(argv)
    except (SystemExit, Exception):
        return None
    return args


def command_line_executes(argv: list[str]) -> bool:
    """Whether ``snakemake ARGV`` runs jobs; False when ARGV is not a Snakemake command line."""
    args = parsed_command_line(argv)
    if args is None:  # not a Snakemake command line: do not repair
        return False
    if any(getattr(args, option, None) for option in NON_EXECUTING_OPTIONS):
        return False
    # --report alone writes a report of an earlier run; with --report-after-run it runs first
    return not args.report or bool(args.report_after_run)


def command_line_skips_the_lock(argv: list[str] | None = None) -> bool:
    """Whether ``snakemake ARGV`` runs with ``--nolock`` (beside whatever holds the lock)."""
    args = parsed_command_line(sys.argv[1:] if argv is None else argv)
    return bool(args is not None and getattr(args, "nolock", False))
