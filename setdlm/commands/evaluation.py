"""Evaluation commands: ``setdlm eval TASK`` (setdlm/eval/commands.py) and ``lm-eval-tasks``."""

from __future__ import annotations

from setdlm.commands.command import Command
from setdlm.util.validation import output_path


def _add_eval_arguments(parser) -> None:
    from setdlm.eval.commands import add_arguments  # imports torch: only when `eval` is parsed

    add_arguments(parser)


def _eval(args) -> int:
    from setdlm.eval.commands import run

    return run(args)


EVAL = Command("eval", "evaluation runs (quality and speed)", _add_eval_arguments, _eval)


def _add_lm_eval_tasks_arguments(parser) -> None:
    parser.add_argument("folder", type=output_path)
    parser.add_argument("--source", choices=("auto", "local", "hub"), default="auto")


def _lm_eval_tasks(args) -> int:
    from setdlm.eval.harness import write_gsm8k_tasks

    print(write_gsm8k_tasks(args.folder, args.source))
    return 0


LM_EVAL_TASKS = Command(
    "lm-eval-tasks",
    "write offline lm-eval task files (GSM8K local and the paper protocol)",
    _add_lm_eval_tasks_arguments,
    _lm_eval_tasks,
)
