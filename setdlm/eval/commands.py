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
import json
from pathlib import Path

from setdlm.core.decoding import DecodeConfig
from setdlm.eval.runner import resolve_batching
from setdlm.families import policy_names, with_knobs
from setdlm.results.layout import point_name
from setdlm.tasks import COMMAND_NODES, likelihood_data, variants
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
        "--stop-cadence",
        choices=("exact", "official"),
        default=None,
        help="when stops are looked for: exact (after every forward, the output ends at "
        "the stop) or official (when the official sampler checks, keeping what it keeps); "
        "default: official for a published checkpoint, else exact",
    )


def decoding_option_errors(model, source: str, knobs: dict, policy: str | None = None):
    """``--policy``, ``--window`` and ``--block-size`` against the model: its family must
    decode with the policy, the policy must have the knobs, and a block must tile its length
    (the rules a workflow configuration is checked by)."""
    family, length = model.config.family, model.config.length
    return knob_errors(family, knobs, "--{flag}", source, policy) + block_errors(
        knobs.get("block_size"), length, "--block-size"
    )


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
    loaded = load_pretrained(args.model)
    model = loaded.model
    if args.task != "likelihood":
        raise_for(
            decoding_option_errors(model, args.model, _knobs(args), args.policy)
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
            generator=args.generator,  # both read only with --data arithmetic
            problem_seed=args.problem_seed,
        )
        print(json.dumps(metrics["quality"], indent=1))
        return 0
    batching = resolve_batching(getattr(args, "batching", "static"), model.device, args.batch_size)
    settings = RunSettings(
        seed=args.seed, batch_size=args.batch_size, warmup_examples=args.warmup, batching=batching
    )
    sweep = len(args.threshold) > 1
    # a policy other than the family's own names its points (the workflow's layout)
    named = None if args.policy == _own_policy(model.config.family) else args.policy
    for threshold in args.threshold:
        out = args.out / point_name(threshold, named) if sweep else args.out
        metrics = _run_point(args, loaded, tokenizer, threshold, out, settings)
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


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch_device(name, hint=" (use cpu or auto)")


def _own_policy(family: str) -> str:
    from setdlm.families import family as family_info

    return family_info(family).default_policy.name


def _knobs(args) -> dict:
    return {"window": args.window, "block_size": args.block_size}


def _with_options(decode: DecodeConfig, model, args) -> DecodeConfig:
    """``decode`` with ``--policy`` and the knob options on top of the task's defaults."""
    return with_knobs(decode, model.config.family, args.policy, **_knobs(args))


def _run_point(args, loaded, tokenizer, threshold: float, out: Path, settings) -> dict:
    from setdlm.eval.paper_decoding import default_stop_cadence, paper_decode_config
    from setdlm.eval.runner import run_evaluation

    model, source = loaded.model, loaded.spec or loaded.model
    base = DecodeConfig(
        confidence_threshold=threshold,
        stop_cadence=args.stop_cadence or default_stop_cadence(loaded.spec),
    )
    if args.task == "gsm8k":
        from setdlm.tasks.gsm8k import GSM8KTask

        task = GSM8KTask(
            protocol=args.protocol, limit=args.limit, max_new_tokens=args.max_new_tokens
        )
        decode = paper_decode_config("gsm8k", model, base)
    elif args.task == "cnndm":
        from setdlm.tasks.cnndm import CnnDmSettings, CnnDmTask, settings_for_model_length

        eos = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
        task_settings = CnnDmSettings(limit=args.limit, stop=args.stop, eos_token=eos)
        if model.config.length < 768:
            task_settings = settings_for_model_length(model.config.length, tokenizer, task_settings)
        task, decode = CnnDmTask(task_settings), paper_decode_config("cnndm", source, base)
    elif args.task == "infill":
        from setdlm.tasks.infill import InfillSettings, InfillTask

        task = InfillTask(
            InfillSettings(
                variant=args.variant,
                repetition=args.repetition,
                limit=args.limit,
                too_long="skip" if args.skip_too_long else "error",
            )
        )
        decode = paper_decode_config("infill", source, base)
        if args.infill_cache != "full":  # the policies that infill from both contexts have it
            decode = with_knobs(decode, model.config.family, infill_cache=args.infill_cache)
    elif args.task == "arithmetic":
        from setdlm.tasks.arithmetic_task import (
            ArithmeticSettings,
            ArithmeticTask,
            arithmetic_decode_config,
        )

        task = ArithmeticTask(
            ArithmeticSettings(
                variant=args.variant,
                limit=args.limit,
                problem_seed=args.problem_seed,
                generator=args.generator,
                max_new_tokens=args.max_new_tokens,
            )
        )
        decode = arithmetic_decode_config(model, base)
    else:
        return _run_unconditional(args, loaded, tokenizer, base, out, settings)
    decode = _with_options(decode, model, args)
    metrics = run_evaluation(
        task, model, tokenizer, decode, out, settings, model_source=loaded.source(args.model)
    )
    if getattr(args, "paper_throughput", 0):  # the tasks with a paper speed protocol
        from setdlm.eval.throughput import paper_throughput

        paper_throughput(
            task,
            model,
            tokenizer,
            decode,
            out,
            measured=args.paper_throughput,
            warmup=args.paper_warmup,
            seed=args.seed,
        )
    return metrics


def _run_unconditional(args, loaded, tokenizer, base: DecodeConfig, out: Path, settings) -> dict:
    from setdlm.tasks import arithmetic
    from setdlm.tasks.arithmetic_task import training_problems
    from setdlm.tasks.sample_rules import Rejection
    from setdlm.tasks.unconditional import (
        GenerationSettings,
        ScoringSettings,
        UnconditionalTask,
        run_unconditional,
    )

    family = loaded.model.config.family
    changes = {
        "num_samples": args.samples,
        "max_new_tokens": args.max_new_tokens or loaded.model.config.length - 1,
        "rejection": Rejection(*args.reject),  # ENTROPY,LENGTH,ATTEMPTS, by the schema's rules
    }
    if args.references in arithmetic.GRAMMARS:  # samples judged as problems of that generator
        changes["grammar"] = args.references
        changes["training_problems"] = training_problems(args.model)
    if args.top_p is not None:
        changes["top_p"] = args.top_p
    if args.repetition_penalty is not None:
        changes["repetition_penalty"] = args.repetition_penalty
    if not args.confidence_stop:
        changes["low_confidence_stop"] = None
    if not args.entropy_stop:
        changes["entropy_stop"] = None
    generation = (
        GenerationSettings.table4(family, **changes)
        if args.table4
        else GenerationSettings(**changes)
    )
    scoring = ScoringSettings(
        references=args.references,
        num_references=args.num_references,
        text_protocol=args.text_protocol,
        featurizer=args.featurizer,
        evaluator=None if args.evaluator == "none" else args.evaluator,
        bootstrap_subsets=args.bootstrap_subsets,
    )
    decode = _with_options(base, loaded.model, args)
    return run_unconditional(
        UnconditionalTask(generation, scoring),
        loaded.model,
        tokenizer,
        decode,
        out,
        settings,
        model_source=loaded.source(args.model),
    )
