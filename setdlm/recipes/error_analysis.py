"""Where an arithmetic model goes wrong: errors by the role of the token in the solution.

Each token of a reference solution ``a op b = c`` has a role: the first operand (copied from
the question's count or the previous line's result), the operator (read from the question's
sentence), the second operand (an amount looked up in the question), ``=``, the result (the
arithmetic itself), a line break, the ``####`` marker and the final answer. Two measurements:

- free decoding (the arithmetic-solve task's own decoding, τ = 1e6): the role of the first
  generated token that differs from the reference, per problem;
- teacher-forced next token: given the reference up to a token (the prompt and the true
  solution so far), is the model's first decoded token the reference one? Decoded with a
  window (SetDLM) or block (MDLM, BD3LM) of one position, so the token decided is the next one
  in order, whatever the family: the model's conditional at that position, with no sampler in
  between.

If a family fails in free decoding but its teacher-forced accuracy at the same roles is also
low, its conditionals are wrong (what it learned), not the order its sampler commits in.

    setdlm analyze-errors results/reference/models/mdlm-arith/seed-0 --problems 100
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROLES = (
    "operand 1",
    "operator",
    "operand 2",
    "equals",
    "result",
    "line break",
    "marker",
    "final answer",
    "end",
)


def token_roles(answer: str, tokenizer) -> tuple[list[int], list[str]]:
    """The reference solution's token ids (as they follow the prompt) and each one's role."""
    encoded = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
    char_roles = []
    for number, line in enumerate(answer.split("\n")):
        if number:
            char_roles.append("line break")
        if line.startswith("####"):
            char_roles += ["marker"] * 4 + ["final answer"] * (len(line) - 4)
            continue
        parts = line.split(" ")  # a op b = c
        names = ["operand 1", "operator", "operand 2", "equals", "result"]
        for index, (part, role) in enumerate(zip(parts, names, strict=False)):
            if index:
                char_roles.append(role)  # the space belongs to the token that follows it
            char_roles += [role] * len(part)
    offsets = encoded["offset_mapping"]
    roles = [char_roles[start] if start < len(char_roles) else "end" for start, _ in offsets]
    return list(encoded["input_ids"]), roles


def analyze(model_dir: Path, problems: int, generator: str | None = None) -> dict:
    import torch

    from setdlm.checkpoints.folders import load_model
    from setdlm.core.decoding import DecodeConfig
    from setdlm.data.tokenizers import load_tokenizer
    from setdlm.families import family as family_info
    from setdlm.families import with_knobs
    from setdlm.tasks import arithmetic
    from setdlm.tasks.arithmetic_task import (
        ArithmeticSettings,
        ArithmeticTask,
        arithmetic_decode_config,
    )

    model = load_model(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    version = generator or _trained_generator(model_dir)
    task = ArithmeticTask(ArithmeticSettings(limit=problems, generator=version))
    examples = task.examples(tokenizer, model)
    references = arithmetic.generate("test", problems, 0, version)
    eos = tokenizer.eos_token_id
    free = task.decode_config(arithmetic_decode_config(model, DecodeConfig()), tokenizer)
    family = model.config.family
    one_at_a_time = free
    if not family_info(family).left_to_right:
        knob = "window" if family == "setdlm" else "block_size"
        one_at_a_time = with_knobs(free, family, **{knob: 1})
    first_errors, solved = Counter(), 0
    forced_right, forced_all = Counter(), Counter()
    with torch.no_grad():
        output = model.generate([e.input_ids for e in examples], free)
        for example, problem, ids in zip(examples, references, output.new_token_ids, strict=True):
            reference, roles = token_roles(problem.answer, tokenizer)
            reference, roles = [*reference, eos], [*roles, "end"]
            wrong = next(
                (i for i, (a, b) in enumerate(zip(ids, reference, strict=False)) if a != b), None
            )
            if wrong is None and len(ids) < len(reference):
                wrong = len(ids)
            if wrong is None:
                solved += 1
            else:
                first_errors[roles[wrong]] += 1
            prefixes = [example.input_ids + reference[:i] for i in range(len(reference))]
            budgets = [free.max_new_tokens - i for i in range(len(reference))]
            for prefix, budget, expected, role in zip(
                prefixes, budgets, reference, roles, strict=True
            ):
                if budget < 1:
                    continue
                step = one_at_a_time.replace(max_new_tokens=budget)
                first = model.generate([prefix], step, stop_after=[1]).new_token_ids[0][:1]
                forced_all[role] += 1
                forced_right[role] += int(first == [expected])
    return {
        "model": str(model_dir),
        "family": family,
        "generator": version,
        "problems": problems,
        "solved_exactly": solved,
        "first_error_role": {role: first_errors[role] for role in ROLES if first_errors[role]},
        "teacher_forced_accuracy": {
            role: round(forced_right[role] / forced_all[role], 4)
            for role in ROLES
            if forced_all[role]
        },
    }


def _trained_generator(model_dir: Path) -> str:
    from setdlm.tasks import arithmetic
    from setdlm.tasks.arithmetic_task import training_problems

    data = training_problems(str(model_dir))
    return data["generator"] if data else arithmetic.GENERATOR_VERSION


def main(argv: list[str]) -> int:
    from setdlm.util.errors import ArgumentParser
    from setdlm.util.validation import EXAMPLES, output_path

    parser = ArgumentParser(prog="setdlm analyze-errors", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", type=Path, nargs="+", help="arithmetic model folders")
    parser.add_argument(
        "--problems", type=EXAMPLES, default=100, help="test problems (default 100)"
    )
    parser.add_argument("--generator", default=None, help="default: the model's training one")
    parser.add_argument(
        "--out", type=output_path, default=None, help="also write the results as JSON"
    )
    args = parser.parse_args(argv)
    results = []
    for folder in args.models:
        if not (folder / "config.json").is_file():
            parser.error(f"{folder}: not a model folder (no config.json)")
        result = analyze(folder, args.problems, args.generator)
        results.append(result)
        json.dump(result, sys.stdout, indent=1)
        print()
    if args.out is not None:
        from setdlm.util.files import atomic_write_json

        atomic_write_json(args.out, results)
    return 0
