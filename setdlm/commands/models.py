"""Model commands: ``setdlm parity``, ``import-legacy``, ``models`` and ``generate``."""

from __future__ import annotations

import sys
from pathlib import Path

from setdlm.checkpoints.zoo import LEGACY_FAMILIES
from setdlm.commands.command import Command
from setdlm.families import policy_names
from setdlm.util.paths import DataNotFoundError
from setdlm.util.validation import (
    BLOCK_SIZE,
    HEADS,
    LENGTH,
    NEW_TOKENS,
    SEED,
    THRESHOLD,
    WINDOW,
    SettingError,
    budget_errors,
    option,
    output_path,
    raise_for,
)


def _add_parity_arguments(parser) -> None:
    parser.add_argument("folder", type=Path, help="folder of fixture folders (or one of them)")
    parser.add_argument(
        "--strict", action="store_true", help="nominal tolerances only (no float32 noise allowance)"
    )


def _parity(args) -> int:
    from setdlm.checkpoints.parity import check_case, check_schedules, fixture_cases

    folder = args.folder
    if not folder.is_dir():
        raise DataNotFoundError(f"{folder} is not a folder (expected official-parity fixtures)")
    cases = [folder] if (folder / "reference.json").exists() else fixture_cases(folder)
    schedules = folder / "noise_schedules.json"
    if not cases and not schedules.exists():
        print(f"no fixture folders (with reference.json) under {folder}", file=sys.stderr)
        return 2
    groups = [lambda: check_schedules(schedules)] if schedules.exists() else []
    groups += [lambda case=case: check_case(case, strict=args.strict) for case in cases]
    failures = total = 0
    for group in groups:
        for check in group():
            print(check.line(), flush=True)
            failures += not check.passed
            total += 1
    print(
        f"{'FAILED' if failures else 'PASSED'}: {failures} failing of {total} checks "
        f"over {len(cases)} model case(s)"
    )
    return 1 if failures else 0


PARITY = Command(
    "parity",
    "check exact parity with the official code on fixture folders",
    _add_parity_arguments,
    _parity,
)


def _add_import_legacy_arguments(parser) -> None:
    parser.add_argument("checkpoint", type=Path, help="the .ckpt file")
    parser.add_argument("--family", choices=LEGACY_FAMILIES, required=True)
    parser.add_argument("--out", type=output_path, required=True, help="model folder to write")
    parser.add_argument(
        "--force", action="store_true", help="replace the model folder --out if there is one"
    )
    parser.add_argument("--heads", type=HEADS, default=None, help="attention heads (default 12)")
    parser.add_argument("--length", type=LENGTH, default=None, help="model length (default 1024)")
    parser.add_argument(
        "--raw-weights", action="store_true", help="the training weights, not the EMA ones"
    )


def _import_legacy(args) -> int:
    from setdlm.checkpoints.folders import save_model
    from setdlm.checkpoints.legacy import load_lightning

    _refuse_to_replace(args.out, args.force)
    model = load_lightning(
        args.checkpoint,
        args.family,
        use_ema=not args.raw_weights,
        n_heads=args.heads,
        length=args.length,
    )
    folder = save_model(model, args.out)
    parameters = sum(p.numel() for p in model.parameters())
    weights = "raw" if args.raw_weights else "EMA"
    print(f"{folder}: {args.family} DiT, {parameters:,} parameters ({weights} weights)")
    return 0


def _refuse_to_replace(out: Path, force: bool) -> None:
    """``save_model`` puts the new folder in the place of ``out``, removing what was there:
    an existing model folder only with ``--force``, and never anything else."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not ((out / "config.json").is_file() and (out / "model.safetensors").is_file()):
        raise SettingError(
            f"--out {out}: exists and is not a model folder (no config.json and "
            "model.safetensors), so it is not replaced; expected a new folder"
        )
    if not force:
        raise SettingError(
            f"--out {out}: a model folder is already there; expected a new folder, or --force "
            "to replace this one"
        )


IMPORT_LEGACY = Command(
    "import-legacy",
    "turn an OWT AR/MDLM Lightning .ckpt (mdlm/bd3lms codebase) into a model folder, "
    "running none of the code its pickle names",
    _add_import_legacy_arguments,
    _import_legacy,
)


def _add_models_arguments(parser) -> None:
    parser.add_argument(
        "--pin",
        nargs="+",
        metavar="KEY",
        default=None,
        help="pin these keys (or 'all') to their Hub repositories' current commits (needs the Hub)",
    )


def _models(args) -> int:
    from setdlm.checkpoints.zoo import PUBLISHED, pin_revisions, revisions_file

    if args.pin:
        keys = list(PUBLISHED) if args.pin == ["all"] else args.pin
        for key, commit in pin_revisions(keys).items():
            print(f"{key:22s} pinned to {commit}")
        print(f"wrote {revisions_file()}; commit it so that every run loads these weights")
        return 0
    for spec in PUBLISHED.values():
        extra = f"  ({spec.note})" if spec.note else ""
        revision = spec.revision[:12] if spec.revision else "unpinned"
        print(
            f"{spec.key:22s} {spec.hub_id:42s} {spec.family:7s} L={spec.length:<5d} "
            f"{revision}{extra}"
        )
    return 0


MODELS = Command("models", "list the published checkpoints by key", _add_models_arguments, _models)


def _add_generate_arguments(parser) -> None:
    parser.add_argument("model", help="folder, key (gsm8k:setdlm-smax8) or Hub id")
    parser.add_argument("--prompt", required=True)
    parser.add_argument(
        "--max-new-tokens", type=NEW_TOKENS, default=None, help="default: 64, or what fits"
    )
    parser.add_argument("--threshold", type=THRESHOLD, default=1e6, help="confidence τ")
    parser.add_argument(
        "--policy", choices=policy_names(), default=None, help="default: the family's own"
    )
    parser.add_argument("--window", type=WINDOW, default=None, help="SetDLM W")
    parser.add_argument("--block-size", type=BLOCK_SIZE, default=None, help="MDLM/BD3LM block")
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--top-p", type=option("$defs/unconditional/properties/top_p"), default=1.0)
    parser.add_argument(
        "--repetition-penalty",
        type=option("$defs/unconditional/properties/repetition_penalty"),
        default=1.0,
    )
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--no-bos", action="store_true", help="do not prepend BOS")
    parser.add_argument(
        "--tokenizer", default=None, help="tokenizer folder or Hub id (default: the model's own)"
    )


def _generate(args) -> int:
    from setdlm.checkpoints.zoo import load_pretrained, load_tokenizer_for
    from setdlm.core.decoding import DecodeConfig
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.eval.commands import decoding_option_errors, tokenizer_option_errors
    from setdlm.families import with_knobs

    if not args.prompt.strip():
        raise SettingError(
            "--prompt is empty: expected text to continue (samples from BOS alone are "
            "`setdlm eval unconditional`)"
        )
    loaded = load_pretrained(args.model)
    length = loaded.model.config.length
    knobs = {"window": args.window, "block_size": args.block_size}
    raise_for(decoding_option_errors(loaded.model, args.model, knobs, args.policy))
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else load_tokenizer_for(loaded)
    raise_for(tokenizer_option_errors(tokenizer, loaded.model))
    spec = loaded.spec
    prompt = tokenizer.encode(args.prompt, add_special_tokens=False)
    if not args.no_bos and tokenizer.bos_token_id is not None:
        prompt = [tokenizer.bos_token_id, *prompt]
    if len(prompt) >= length:
        raise SettingError(
            f"--prompt: {len(prompt)} tokens leave no room in a model of length {length}; "
            f"expected at most {length - 1}"
        )
    # By default as many new tokens as fit, at most 64.
    budget = args.max_new_tokens or min(64, length - len(prompt))
    raise_for(budget_errors(budget, length, "--max-new-tokens", len(prompt)))
    config = DecodeConfig(
        max_new_tokens=budget,
        confidence_threshold=args.threshold,
        do_sample=args.sample,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        eos_token_ids=(tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else (),
    )
    family = loaded.model.config.family
    # A published checkpoint decodes with its paper knobs unless an option says otherwise.
    config = with_knobs(config, family, **(spec.decode_knobs() if spec is not None else {}))
    config = with_knobs(config, family, args.policy, **knobs)
    output = loaded.model.generate([prompt], config, seeds=[args.seed])
    print(tokenizer.decode(output.new_token_ids[0]))
    print(
        f"[{output.num_generated[0]} tokens, {output.nfe} backbone forwards, "
        f"parallelism {output.parallelism[0]:.2f}, {output.wall_seconds:.2f} s]",
        file=sys.stderr,
    )
    return 0


GENERATE = Command(
    "generate",
    "decode a prompt with a model folder, a published key or a Hub id",
    _add_generate_arguments,
    _generate,
)
