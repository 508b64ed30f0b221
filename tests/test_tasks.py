"""The task table (setdlm/tasks/__init__.py) against everything that names tasks: the workflow
schema, the ``setdlm eval`` commands, the layout, the tables, the figures, the checks and MLflow."""

from __future__ import annotations

import pytest
from configs import tiny_with_paper_tasks

from setdlm import tasks
from setdlm.results import layout
from setdlm.tasks import PAPER_TABLES, TASKS, UnknownTaskError, task
from setdlm.util import validation
from setdlm.util.errors import UserError

ROWS = list(TASKS.values())


def _schema_tasks() -> dict:
    return validation.schema()["properties"]["tasks"]["properties"]


def _eval_parsers() -> dict:
    """`setdlm eval`'s subcommand parsers, by command."""
    from setdlm.cli import build_parser

    evaluate = build_parser(only="eval")._subparsers._group_actions[0].choices["eval"]
    return evaluate._subparsers._group_actions[0].choices


def _choices(parser, flag: str) -> tuple:
    return next(a.choices for a in parser._actions if flag in a.option_strings)


# ------------------------------------------------------------------------------ the lookup
def test_an_unknown_task_is_an_error_naming_the_known_ones():
    with pytest.raises(UnknownTaskError) as caught:
        task("arithmetic-sovle")
    message = str(caught.value)
    assert "'arithmetic-sovle'" in message and "setdlm/tasks/__init__.py" in message
    assert all(name in message for name in TASKS)
    assert isinstance(caught.value, UserError) and isinstance(caught.value, ValueError)
    with pytest.raises(UnknownTaskError, match="table 'pareto' is not one of gsm8k, cnndm"):
        tasks.paper_table("pareto")
    with pytest.raises(UnknownTaskError):
        tasks.table_tasks("pareto")
    assert task("infill-3") is TASKS["infill-3"]


# ----------------------------------------------------------------------- the workflow schema
def test_every_row_is_a_task_of_the_schema_with_its_node():
    schema_tasks = _schema_tasks()
    assert tuple(TASKS) == tasks.TASK_NAMES
    assert set(TASKS) == set(schema_tasks)  # no row without a node, no node without a row
    defs = validation.schema()["$defs"]
    for info in ROWS:
        assert validation.schema_task(info.name) == info.schema_node, info.name
        properties = defs[info.schema_node]["properties"]
        assert set(info.unread) <= set(properties), info.name
        if info.dataset_setting is not None:
            assert info.dataset_setting in properties, info.name
        if info.decoding_check:  # the check decodes the first --limit examples
            assert "limit" in properties, info.name
        assert info.command in tasks.COMMAND_NODES, info.name
        assert info.command_node in defs, info.name
        # the task's settings are a subset of its command's options (the workflow writes them
        # as the command reads them)
        command_options = set(defs[info.command_node]["properties"])
        assert set(properties) - set(info.unread) <= command_options | {"models"}, info.name


def test_every_command_is_a_subcommand_and_every_row_picks_its_task_of_it():
    parsers = _eval_parsers()
    assert set(parsers) == set(tasks.COMMAND_NODES)
    for command, parser in parsers.items():
        rows = [info for info in ROWS if info.command == command]
        assert rows, f"setdlm eval {command} runs no task"
        picked = {info.command_args for info in rows}
        if len(rows) > 1 and command != "unconditional":  # a variant or data set each
            assert len(picked) == len(rows), command
        for info in rows:
            if info.variant is not None:
                assert info.variant in _choices(parser, "--variant"), info.name
            if info.data is not None:
                assert info.data in _choices(parser, "--data"), info.name
    assert _choices(parsers["likelihood"], "--data") == tasks.likelihood_data()
    assert _choices(parsers["infill"], "--variant") == tasks.variants("infill")


def test_every_decoding_command_runs_its_points_in_its_task_module():
    import importlib
    import inspect

    from setdlm.tasks import COMMAND_MODULES

    assert set(COMMAND_MODULES) == set(tasks.COMMAND_NODES) - {"likelihood"}
    for command, module in COMMAND_MODULES.items():
        run_point = importlib.import_module(f"setdlm.tasks.{module}").run_point
        parameters = list(inspect.signature(run_point).parameters)
        assert parameters == ["args", "loaded", "tokenizer", "base", "out", "settings"], command


def test_likelihood_rows_are_likelihood_of_their_data_and_the_rest_decode():
    for info in ROWS:
        likelihood = info.name.startswith(tasks.LIKELIHOOD_PREFIX)
        assert (info.kind == "likelihood") == likelihood == (not info.decoding), info.name
        assert (info.command == "likelihood") == likelihood, info.name
        assert (info.data is not None) == likelihood, info.name
        assert (info.figure is not None) == info.decoding, info.name
        if likelihood:
            assert info.name == tasks.LIKELIHOOD_PREFIX + info.data
            assert (info.field, info.headline, info.higher_is_better) == (
                "likelihood",
                "nll",
                False,
            )
            assert info.command_args == ("--data", info.data)
        else:
            assert info.higher_is_better, info.name


def test_domains_and_datasets_are_known():
    from setdlm.checkpoints.zoo import TASKS as PUBLISHED_DOMAINS
    from setdlm.workflow.datasets import DATASETS

    for info in ROWS:
        assert info.domain in (*layout.DOMAINS, tasks.ARITHMETIC), info.name
        assert info.trained_here == (info.domain == tasks.ARITHMETIC)
        if info.trained_here:  # generated by code: nothing to prepare
            assert info.dataset is None and info.dataset_setting is None, info.name
        else:
            assert (info.dataset is None) != (info.dataset_setting is None), info.name
            assert info.dataset is None or info.dataset in DATASETS, info.name
    assert set(layout.DOMAINS) == set(PUBLISHED_DOMAINS)


# ------------------------------------------------------------------- layout, tables, figures
def test_the_layouts_names_are_the_tables_queries():
    assert layout.TASKS == tasks.TASK_NAMES
    assert {name: tasks.table_tasks(name) for name in PAPER_TABLES} == layout.TABLES
    in_tables = [name for table in layout.TABLES.values() for name in table]
    assert sorted(in_tables) == sorted(TASKS)  # every task in one table, and once
    assert layout.table_files("t", "cnndm") == ["t/cnndm.md", "t/cnndm.csv", "t/cnndm.tex"]
    assert layout.table_files("t", "arithmetic", seeded=True) == [
        f"t/{stem}.{fmt}"
        for stem in ("arithmetic_pareto", "arithmetic_pareto_seeds", "claims")
        for fmt in ("md", "csv", "tex")
    ]
    for info in ROWS:
        if info.figure:
            assert layout.figure_files("f", info.name) == [
                f"f/{info.name}_pareto.png",
                f"f/{info.name}_pareto.pdf",
            ]


def test_every_paper_table_is_built_from_its_rows():
    from setdlm.report import tables

    assert tuple(PAPER_TABLES) == tables.TABLES
    specs = {**tables.SPECS, "likelihood": tables.LIKELIHOOD}
    assert set(specs) == set(PAPER_TABLES)
    for name, spec in specs.items():
        assert spec.table == name
        assert spec.key == PAPER_TABLES[name].stem
        assert spec.tasks == tuple(t for t, info in TASKS.items() if info.table == name)
        assert spec.tasks, f"table {name} has no task"
    claims = [name for name, table in PAPER_TABLES.items() if table.claims]
    assert claims == ["arithmetic"]
    # its claims compare the unconditional samples too: the table's job waits for them
    assert PAPER_TABLES["arithmetic"].claims_also == ("arithmetic-unconditional",)
    for table in PAPER_TABLES.values():
        assert all(task(name).table != table.name for name in table.claims_also)
    # each task's headline is one of its own columns; a table's columns are its tasks', each
    # metric once (two tasks of a table that show a metric show it the same way)
    for info in ROWS:
        assert info.headline in [q.name for q in info.columns], info.name
    for name, spec in specs.items():
        shown = [m.name for m in spec.metrics]
        assert len(shown) == len(set(shown)), name
        assert shown == [q.name for q in tables.table_columns(name)]
        assert spec.title == PAPER_TABLES[name].title and spec.units.startswith("Units: ")


def test_every_decoding_task_has_its_figure_of_its_headline():
    from setdlm.report import figures
    from setdlm.report.cli import FIGURE_TASKS

    assert tuple(figures.FIGURES) == tasks.decoding_tasks() == tasks.figure_tasks() == FIGURE_TASKS
    for name, spec in figures.FIGURES.items():
        info = task(name)
        assert (spec.task, spec.metric) == (name, info.headline)
        assert (spec.title, spec.label, spec.scale, spec.more) == (
            info.figure.title,
            info.figure.label,
            info.figure.scale,
            info.figure.more,
        )


# -------------------------------------------------------------------- checks, MLflow, reader
def test_checks_mlflow_and_the_reader_ask_the_table():
    from setdlm.report.decoding_check import CHECKED_TASKS
    from setdlm.tracking import record

    assert CHECKED_TASKS == ("arithmetic-solve", "arithmetic-infill")
    for info in ROWS:
        assert record.headline_of(info.name) == info.headline
        assert record.higher_is_better(info.name) == info.higher_is_better
        assert record.is_accuracy(info.name) == info.accuracy
    assert [info.name for info in ROWS if info.accuracy] == ["gsm8k", "arithmetic-solve"]
    assert record.headline_of("not-a-task") is None and not record.is_accuracy("not-a-task")


def test_the_reader_refuses_a_folder_of_no_task_and_a_task_of_another(tmp_path):
    from setdlm.results.reader import ResultError, _check_task

    _check_task(tmp_path, "infill-1", {"task": "rocstories-infill-1"})
    _check_task(tmp_path, "arithmetic-unconditional", {"task": "unconditional"})
    _check_task(tmp_path, "likelihood-lm1b", {"task": "likelihood", "config": {"data": "lm1b"}})
    with pytest.raises(ResultError, match="'infill-2' is not one of gsm8k, cnndm"):
        _check_task(tmp_path, "infill-2", {"task": "rocstories-infill-2"})
    with pytest.raises(ResultError, match="holds task 'cnndm'"):
        _check_task(tmp_path, "gsm8k", {"task": "cnndm"})
    with pytest.raises(ResultError, match="on data 'owt'"):
        _check_task(tmp_path, "likelihood-lm1b", {"task": "likelihood", "config": {"data": "owt"}})


# ----------------------------------------------------------------------------- the workflow
def test_each_planned_point_runs_its_rows_command(data_dir):
    from setdlm.workflow.config import reads_arithmetic, task_dataset
    from setdlm.workflow.plan import build

    plan = build(tiny_with_paper_tasks(), {"SETDLM_DATA_DIR": str(data_dir)})
    configured = plan.config["tasks"]
    assert {task for task, _, _ in plan.points} == set(configured)
    for (name, _, point), planned in plan.points.items():
        info = task(name)
        if planned.seeds:  # the aggregate over seeds: each seed's job runs the command
            planned = plan.seed_point(name, planned.model, point, planned.seeds[0])
        args = planned.args
        assert args[0] == info.command, name
        start = args.index(info.command_args[0]) if info.command_args else None
        if start is not None:
            assert args[start : start + 2] == info.command_args, name
        assert ("--threshold" in args) == info.decoding, name
        assert not set(info.unread) & {a.removeprefix("--").replace("-", "_") for a in args}
        assert (point == layout.LIKELIHOOD_POINT) == (not info.decoding)
    for name, settings in configured.items():
        info = task(name)
        assert reads_arithmetic(name) == info.trained_here
        expected = info.dataset if info.dataset_setting is None else "wikitext2"
        if info.dataset_setting is not None:
            assert settings[info.dataset_setting] == "wikitext2"
        assert task_dataset(name, settings) == expected
    assert plan.figure_tasks() == [t for t in configured if task(t).decoding]
    assert plan.tables() == {
        table: tuple(t for t in tasks.table_tasks(table) if t in configured)
        for table in PAPER_TABLES
        if any(t in configured for t in tasks.table_tasks(table))
    }
