"""Evaluation commands: ``setdlm eval TASK`` (setdlm/eval/commands.py), ``lm-eval`` (lm-eval's
command line with the ``setdlm`` model, setdlm/eval/harness.py) and ``lm-eval-tasks``."""

from __future__ import annotations

from setdlm.commands.command import Command, forwarded
from setdlm.util.validation import output_path


def _add_eval_arguments(parser) -> None:
    from setdlm.eval.commands import add_arguments  # imports torch: only when `eval` is parsed

    add_arguments(parser)


def _eval(args) -> int:
    from setdlm.eval.commands import run

    return run(args)


EVAL = Command("eval", "evaluation runs (quality and speed)", _add_eval_arguments, _eval)


def lm_eval(argv: list[str]) -> int:
    """``lm-eval ARGS`` with the ``setdlm`` model registered. The model it names is checked
    first: lm-eval imports and indexes its thousands of task files before it builds the model
    (about 10 s on an AMD EPYC core), which a mistyped folder should not cost."""
    from setdlm.checkpoints.zoo import check_model_name

    pretrained = _setdlm_pretrained(argv)
    if pretrained is not None:
        check_model_name(pretrained)
    from setdlm.eval.harness import lm_eval_main

    return lm_eval_main(argv)


def _setdlm_pretrained(argv: list[str]) -> str | None:
    """The ``pretrained`` of ``--model setdlm --model_args pretrained=X,...`` (lm-eval's
    key=value form), or None where the arguments name another model or another form: lm-eval
    then reads them itself, as it always does."""
    options: dict[str, str] = {}
    for index, argument in enumerate(argv):
        for name in ("--model", "--model_args"):
            if argument == name and index + 1 < len(argv):
                options[name] = argv[index + 1]
            elif argument.startswith(name + "="):
                options[name] = argument.split("=", 1)[1]
    if options.get("--model") != "setdlm":
        return None
    for pair in options.get("--model_args", "").split(","):
        key, equals, value = pair.partition("=")
        if equals and key.strip() == "pretrained" and value.strip():
            return value.strip()
    return None


LM_EVAL = forwarded(
    "lm-eval",
    "setdlm.commands.evaluation:lm_eval",
    "lm-eval's command line with the `setdlm` model registered (arguments pass through)",
)


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
