"""The ``setdlm eval TASK`` command line: one result folder per decoding point.

Every task takes the model (folder, key or Hub id), the output folder, the decoding policy
(``--policy``, default the family's own) and its knobs. Several ``--threshold`` values make a
confidence-threshold sweep: each τ is a result of its own, in ``OUT/tau-<τ>/`` (with another
policy than the family's own, ``OUT/<policy>-tau-<τ>/``). The paper's per-family settings (MDLM
block, BD3LM S, SetDLM W) are the defaults for each task; ``--window`` / ``--block-size``
override them.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from setdlm.core.decoding import DecodeConfig
from setdlm.eval.point import knobs
from setdlm.eval.runner import resolve_batching
from setdlm.families import policy_names
from setdlm.results.layout import point_name
from setdlm.tasks import COMMAND_MODULES, COMMAND_NODES, likelihood_data, variants
from setdlm.util.validation import (
    BLOCK_SIZE,
    THRESHOLD,
    WINDOW,
    block_errors,
    budget_errors,
    knob_errors,
    output_path,
    raise_for,
    task_settings,
    tokenizer_errors,
    torch_device,
    warmup_errors,
)


def add_arguments(evaluate) -> None:
    """``setdlm eval``'s arguments: one subcommand per evaluation command, its options from
    its schema node (setdlm/tasks/__init__.py COMMAND_NODES)."""
    tasks = evaluate.add_subparsers(dest="task", required=True)
    parsers = {
        name: tasks.add_parser(name, help=help_text)
        for name, help_text in [
            ("gsm8k", "GSM8K with the paper's prompt, stop and answer extraction"),
            ("cnndm", "CNN/DailyMail summarization, ROUGE-1/2/L/Lsum"),
            ("infill", "ROCStories infilling (infill-1 / infill-3), ROUGE-1/2/L"),
            ("unconditional", "samples from BOS: MAUVE (bootstrap), gen-PPL, unigram entropy"),
            ("likelihood", "held-out NLL / PPL / bits per token and byte"),
            ("arithmetic", "the synthetic arithmetic problems: solve (GSM8K extraction) or infill"),
        ]
    }
    for name, parser in parsers.items():
        parser.add_argument("--model", required=True, help="folder, key or Hub id")
        parser.add_argument("--out", type=output_path, required=True)
        parser.add_argument("--tokenizer", default=None, help="default: the model's own")
        parser.add_argument(
            "--device", default="auto", help="cpu, cuda, cuda:N, or auto (a GPU when there is one)"
        )
        for setting in task_settings(COMMAND_NODES[name]):  # setdlm/tasks/__init__.py
            setting.add_to(parser)
        if name != "likelihood":
            _add_decoding_options(parser)
    parsers["infill"].add_argument("--variant", choices=variants("infill"), default="infill-1")
    parsers["infill"].add_argument(
        "--infill-cache",
        choices=("full", "prefix"),
        default="full",
        help="SetDLM: cache both contexts first (the paper's setting) or the left one only, "
        "gaps between spans promoted as decoding passes them (the official default)",
    )
    parsers["unconditional"].add_argument(
        "--no-mauve",
        dest="mauve",
        action="store_false",
        help="judge and score the samples (gen-PPL, entropy) but compute no MAUVE: no "
        "featurizer pass (the workflow's mauve_thresholds)",
    )
    parsers["arithmetic"].add_argument("--variant", choices=variants("arithmetic"), default="solve")
    parsers["likelihood"].add_argument(
        "--data",
        choices=likelihood_data(),
        default="wikitext2",
        help="a held-out text set, or arithmetic: the synthetic test problems one per row "
        "(--limit of them, default 300, from --generator and --problem-seed)",
    )


def _add_decoding_options(parser) -> None:
    """τ, the decoding policy and its knobs: what a decoding point is (the workflow's
    thresholds, policies and per-model overrides)."""
    parser.add_argument(
        "--threshold",
        type=THRESHOLD,
        nargs="+",
        default=[1e6],
        help="confidence τ; several values make a sweep",
    )
    parser.add_argument(
        "--policy",
        choices=policy_names(),
        default=None,
        help="decoding policy (setdlm/families.py); default: the family's own",
    )
    parser.add_argument("--window", type=WINDOW, default=None, help="SetDLM W")
    parser.add_argument("--block-size", type=BLOCK_SIZE, default=None, help="decoding block")
    parser.add_argument(
        "--shard",
        type=shard_option,
        default=None,
        metavar="I/N",
        help="decode only the I-th (from 0) of N contiguous slices of the examples, into a "
        "shard folder (shard.json, no metrics); the workflow merges the N shards of a point "
        "into its samples and metrics",
    )
    parser.add_argument(
        "--stop-cadence",
        choices=("exact", "official"),
        default=None,
        help="when stops are looked for: exact (after every forward, the output ends at "
        "the stop) or official (when the official sampler checks, keeping what it keeps); "
        "default: official for a published checkpoint, else exact",
    )


def shard_option(text: str) -> tuple[int, int]:
    """``--shard I/N``: the I-th (from 0) of N slices."""
    index, _, count = text.partition("/")
    try:
        shard = (int(index), int(count))
    except ValueError:
        shard = None
    if shard is None or not 0 <= shard[0] < shard[1]:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected I/N with N at least 1 and 0 <= I < N (e.g. 0/4)"
        )
    return shard


def decoding_option_errors(model, source: str, knobs: dict, policy: str | None = None):
    """``--policy``, ``--window`` and ``--block-size`` against the model: its family must
    decode with the policy, the policy must have the knobs, and a block must tile its length
    (the rules a workflow configuration is checked by)."""
    family, length = model.config.family, model.config.length
    window = knobs.get("window")
    too_wide = (
        []
        if window is None or window <= length
        else [f"--window {window}: wider than the model length {length}; expected at most {length}"]
    )
    return (
        knob_errors(family, knobs, "--{flag}", source, policy)
        + block_errors(knobs.get("block_size"), length, "--block-size")
        + too_wide
    )


def generator_errors(args: argparse.Namespace) -> list[str]:
    """An arithmetic evaluation of a model trained here on another generator's problems (an
    arithmetic-4 model scored on arithmetic-2): the workflow refuses it by its configuration,
    and the command by the model's own record (checkpoint.json's training data)."""
    from setdlm.tasks.arithmetic import GRAMMARS
    from setdlm.tasks.arithmetic_task import training_problems

    if args.task == "unconditional":
        option, asked = "--references", getattr(args, "references", None)
    elif args.task == "arithmetic" or getattr(args, "data", None) == "arithmetic":
        option, asked = "--generator", getattr(args, "generator", None)
    else:
        return []
    if asked not in GRAMMARS:
        return []
    trained = training_problems(args.model)
    if trained is None or trained["generator"] == asked:
        return []
    return [
        f"{option} {asked}: {args.model} was trained on {trained['generator']} problems (its "
        f"checkpoint.json); an arithmetic evaluation judges a model with its own generator: "
        f"expected {option} {trained['generator']}"
    ]


def tokenizer_option_errors(tokenizer, model) -> list[str]:
    """A tokenizer with ids the model's backbone has no embedding for."""
    return tokenizer_errors(len(tokenizer), model.backbone.vocab_size, "--tokenizer")


def run(args: argparse.Namespace) -> int:
    from setdlm.checkpoints.zoo import load_pretrained, load_tokenizer_for
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.eval.runner import RunSettings

    if args.task != "likelihood":  # before the model loads: the options alone are wrong
        limit = getattr(args, "limit", None)  # unconditional has no limit
        raise_for(warmup_errors(args.warmup, limit, "--warmup", "--limit"))
    raise_for(generator_errors(args))
    loaded = load_pretrained(args.model)
    model = loaded.model
    if args.task != "likelihood":
        raise_for(
            decoding_option_errors(model, args.model, knobs(args), args.policy)
            + budget_errors(
                getattr(args, "max_new_tokens", None), model.config.length, "--max-new-tokens"
            )
        )
    model.to(_device(args.device))
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer_for(loaded)
    raise_for(tokenizer_option_errors(tokenizer, model))
    if args.task == "likelihood":
        from setdlm.tasks.likelihood import run_likelihood

        metrics = run_likelihood(
            loaded.model,
            tokenizer,
            args.data,
            args.out,
            num_samples=args.samples,
            seed=args.seed,
            batch_size=args.batch_size,
            limit=args.limit,
            model_source=loaded.source(args.model),
            model_revision=loaded.revision_record(),
            generator=args.generator,  # these three read only with --data arithmetic
            problem_seed=args.problem_seed,
            excluding=_training_problems(args.model),
        )
        print(json.dumps(metrics["quality"], indent=1))
        return 0
    batching = resolve_batching(getattr(args, "batching", "static"), model.device, args.batch_size)
    settings = RunSettings(
        seed=args.seed,
        batch_size=args.batch_size,
        warmup_examples=args.warmup,
        batching=batching,
        timed_examples=args.timed_examples,
        shard=args.shard,
    )
    sweep = len(args.threshold) > 1
    # a policy other than the family's own names its points (the workflow's layout)
    named = None if args.policy == _own_policy(model.config.family) else args.policy
    for threshold in args.threshold:
        out = args.out / point_name(threshold, named) if sweep else args.out
        metrics = _run_point(args, loaded, tokenizer, threshold, out, settings)
        if settings.shard is not None:  # a slice of the examples: no quality of its own
            index, count = settings.shard
            print(f"{out}: shard {index}/{count}, {len(metrics['examples'])} examples")
            continue
        print(
            json.dumps(
                {
                    "confidence_threshold": threshold,
                    "out": str(out),
                    "quality": metrics["quality"],
                    "speed": metrics["speed"],
                },
                indent=1,
            )
        )
    return 0


def _training_problems(model: str) -> dict | None:
    """The arithmetic problems a model folder was trained on (None: not trained here on
    them): an arithmetic evaluation leaves their near-duplicates out of its test problems."""
    from setdlm.tasks.arithmetic_task import training_problems

    return training_problems(model)


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch_device(name, hint=" (use cpu or auto)")


def _own_policy(family: str) -> str:
    from setdlm.families import family as family_info

    return family_info(family).default_policy.name


def _run_point(args, loaded, tokenizer, threshold: float, out: Path, settings) -> dict:
    """One τ point, run by the command's task module (setdlm/tasks/__init__.py
    COMMAND_MODULES; what every task's point shares: setdlm/eval/point.py)."""
    from setdlm.eval.paper_decoding import default_stop_cadence

    base = DecodeConfig(
        confidence_threshold=threshold,
        stop_cadence=args.stop_cadence or default_stop_cadence(loaded.spec),
    )
    module = importlib.import_module(f"setdlm.tasks.{COMMAND_MODULES[args.task]}")
    return module.run_point(args, loaded, tokenizer, base, out, settings)
