"""What every decoding task's point shares once the task has built itself from the command
line: the command's decoding policy and knobs on top of the task's own decoding defaults, the
runner (decode, score, time, write the result folder), and the paper's throughput protocol
where the command asks for it.

Each task module's ``run_point(args, loaded, tokenizer, base, out, settings)`` (setdlm/tasks/)
builds its task and decoding config from ``args`` and ends here; ``setdlm eval`` calls it
through the command's module (setdlm/tasks/__init__.py COMMAND_MODULES).
"""

from __future__ import annotations

from pathlib import Path

from setdlm.core.decoding import DecodeConfig
from setdlm.families import with_knobs


def knobs(args) -> dict:
    """The decoding knobs the command line sets (None: the task's default)."""
    return {"window": args.window, "block_size": args.block_size}


def with_options(decode: DecodeConfig, model, args) -> DecodeConfig:
    """``decode`` with ``--policy`` and the knob options (``--window``, ``--block-size``) on top
    of the task's defaults."""
    return with_knobs(decode, model.config.family, args.policy, **knobs(args))


def evaluate(task, decode: DecodeConfig, args, loaded, tokenizer, out: Path, settings) -> dict:
    """Run ``task`` at one point: its metrics (and the paper throughput's, where asked)."""
    from setdlm.eval.runner import run_evaluation

    model = loaded.model
    decode = with_options(decode, model, args)
    metrics = run_evaluation(
        task,
        model,
        tokenizer,
        decode,
        out,
        settings,
        model_source=loaded.source(args.model),
        model_revision=loaded.revision_record(),
    )
    # the tasks with a paper speed protocol; a shard's point times it once merged
    if getattr(args, "paper_throughput", 0) and settings.shard is None:
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
