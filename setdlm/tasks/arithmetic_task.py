"""The synthetic arithmetic task (setdlm/tasks/arithmetic.py) as evaluations of ``run_evaluation``.

- ``solve``: BOS + question + newline, then the worked solution is decoded up to EOS (or the
  budget) and scored by the GSM8K answer extraction, unchanged (strict and flexible match).
- ``infill``: one middle solution step is masked. The diffusion families decode it in place
  between both contexts (BOS + question and earlier steps + MASK * m + later steps and the
  ``#### N`` line + EOS, m = the step's token count: the oracle length, as in ROCStories
  infilling); AR sees only the left context and generates exactly m tokens. Scored by whether
  the step is correct as the generator writes it (``step_correct``: arithmetic-3 and -4 write a
  ``+`` or ``*`` step with its operands in either order, a fair coin, so "2 * 18 = 36" for the
  masked "18 * 2 = 36" is right, and exact match alone caps a perfect model at about 74 % on
  arithmetic-3), by exact match, and by its result (the number after ``=``, which every later
  step and the final answer build on).

Every quality number carries a seeded 95 % bootstrap interval over the test problems.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from setdlm.core.decoding import DecodeConfig
from setdlm.eval.generated_text import text_before_eos
from setdlm.eval.intervals import scored_means
from setdlm.eval.paper_decoding import paper_decode_config
from setdlm.eval.runner import Example, Task
from setdlm.families import family as family_info
from setdlm.results.layout import TRAINED_MARKER
from setdlm.tasks import arithmetic
from setdlm.tasks.gsm8k import METRIC_DEFINITIONS as GSM8K_METRICS
from setdlm.tasks.gsm8k import score_output
from setdlm.tasks.infill import Segments, build_infill_input
from setdlm.util.files import read_json
from setdlm.util.validation import SettingError

VARIANTS = ("solve", "infill")
# The GSM8K extraction's two filters; the paper's boxed-answer metrics do not apply here.
SOLVE_METRICS = {name: GSM8K_METRICS[name] for name in ("strict_match", "flexible_extract")}
INFILL_METRICS = {
    "step_correct": (
        "the decoded step is the masked step as the generator may write it (whitespace "
        "stripped; a + or * step in either operand order where the version writes both)"
    ),
    "step_exact": "the decoded step equals the masked step exactly (whitespace stripped)",
    "result_exact": "the number after '=' in the decoded step equals the step's true result",
}
_RESULT = re.compile(r"=\s*(-?\d+)\s*$")


# MDLM decodes semi-autoregressively in blocks of 8 here: the paper's GSM8K block of 32 is an
# eighth of its 256-token budget, and a solution here is about 20 tokens.
MDLM_BLOCK = 8


def arithmetic_decode_config(model, base: DecodeConfig) -> DecodeConfig:
    """The GSM8K family knobs (BD3LM blocks of S, SetDLM W = d, first-hitting cache order)
    with MDLM's block scaled to these short solutions."""
    return paper_decode_config("gsm8k", model, base, mdlm_block=MDLM_BLOCK)


@dataclass(frozen=True)
class ArithmeticSettings:
    variant: str = "solve"
    limit: int = 300  # test problems
    problem_seed: int = 0  # which test problems are drawn (the generator's seed)
    generator: str = arithmetic.GENERATOR_VERSION  # the problems' grammar (arithmetic.GRAMMARS)
    max_new_tokens: int = 21  # solve: the budget after the prompt (the longest solution + EOS)
    # The training problems (an arithmetic.identity) whose near-duplicates are left out of the
    # test problems (arithmetic.generate); None: none are (a model not trained here).
    excluding: dict | None = None

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        arithmetic.grammar(self.generator)


class ArithmeticTask(Task):
    def __init__(self, settings: ArithmeticSettings = ArithmeticSettings()):
        self.config = settings
        self.name = f"arithmetic-{settings.variant}"

    def settings(self) -> dict:
        config = self.config
        problems = arithmetic.identity(
            "test", config.limit, config.problem_seed, config.generator, config.excluding
        )
        return asdict(config) | {"problems": problems}

    def examples(self, tokenizer, model) -> list[Example]:
        config = self.config
        problems = arithmetic.generate(
            "test", config.limit, config.problem_seed, config.generator, config.excluding
        )
        bos, eos = model.config.bos_token_id, model.config.eos_token_id
        if bos is None or eos is None:
            raise SettingError(
                f"arithmetic needs a model with BOS and EOS ids (bos={bos}, eos={eos})"
            )
        make = self._solve_example if self.config.variant == "solve" else self._infill_example
        examples = [make(problem, tokenizer, model) for problem in problems]
        if self.config.variant == "solve":
            self._check_budget(examples)
        longest = max(len(e.input_ids) + (e.max_new_tokens or 0) for e in examples)
        if longest > model.config.length:
            raise SettingError(
                f"arithmetic-{self.config.variant}: an input with its budget takes {longest} "
                f"positions, more than the model's length {model.config.length} (lower "
                "--max-new-tokens, or train a longer model)"
            )
        return examples

    def _solve_example(self, problem, tokenizer, model) -> Example:
        text = problem.question + "\n"
        prompt = tokenizer.encode(text, add_special_tokens=False)
        ids = [model.config.bos_token_id, *prompt]
        # what the reference solution takes after the prompt, its EOS included, as the model
        # saw it in training (one row: the question, a newline, the solution, EOS)
        whole = tokenizer.encode(problem.text, add_special_tokens=False)
        meta = {
            "eos_token_id": model.config.eos_token_id,
            "solution_tokens": len(whole) - len(prompt) + 1,
        }
        return Example(problem.id, ids, text, problem.answer, meta)

    def _check_budget(self, examples: list[Example]) -> None:
        """Every reference solution fits the budget: a shorter budget cuts the answers it
        cannot hold, so accuracy would measure the budget, not the model (issue 24: a harder
        generator's learning curves plateaued at 80 % under a 21-token budget its longer
        solutions did not fit, and reached 99 % with 24)."""
        budget = self.config.max_new_tokens
        cut = [e for e in examples if e.meta["solution_tokens"] > budget]
        if cut:
            longest = max(cut, key=lambda e: e.meta["solution_tokens"])
            raise SettingError(
                f"arithmetic-solve ({self.config.generator}): max_new_tokens = {budget} is too "
                f"short for {len(cut)} of {len(examples)} test problems under this model's "
                f"tokenizer; the longest, {longest.id}, takes "
                f"{longest.meta['solution_tokens']} tokens with its EOS. Set max_new_tokens "
                f"to at least {longest.meta['solution_tokens']} (the task's max_new_tokens, or "
                "train.curve.max_new_tokens for a learning curve)"
            )

    def _infill_example(self, problem, tokenizer, model) -> Example:
        before, step, after = arithmetic.split_for_infilling(problem)
        full = build_infill_input(
            Segments(before, step, after),
            tokenizer,
            bos_token_id=model.config.bos_token_id,
            eos_token_id=model.config.eos_token_id,
            mask_token_id=model.config.mask_token_id,
        )
        meta = {"eos_token_id": model.config.eos_token_id, "span_length": full.span_length}
        if family_info(model.config.family).left_to_right:  # the left context, then m tokens
            ids = full.input_ids[: full.span_start]
            return Example(problem.id, ids, before, step, meta, max_new_tokens=full.span_length)
        prompt = f"{before}[{full.span_length} masks]{after}"
        return Example(problem.id, full.input_ids, prompt, step, meta)

    def decode_config(self, base: DecodeConfig, tokenizer) -> DecodeConfig:
        if self.config.variant == "solve":
            eos = tokenizer.eos_token_id
            return base.replace(max_new_tokens=self.config.max_new_tokens, eos_token_ids=(eos,))
        return base.replace(
            max_new_tokens=0,  # the budget is per example: the step's length (AR) or its masks
            eos_token_ids=(),  # no stop rule: the span is filled to its oracle length
        )

    def output_text(self, example: Example, new_ids: list[int], tokenizer) -> str:
        return text_before_eos(new_ids, tokenizer, example.meta["eos_token_id"])

    def score(self, example: Example, text: str) -> dict[str, float]:
        if self.config.variant == "solve":
            scores = score_output(text, example.reference)
            return {name: scores[name] for name in SOLVE_METRICS}
        decoded, wanted = _RESULT.search(text.strip()), _RESULT.search(example.reference)
        correct = arithmetic.correct_forms_of(example.reference, self.config.generator)
        return {
            "step_correct": float(text.strip() in correct),
            "step_exact": float(text.strip() == example.reference.strip()),
            "result_exact": float(decoded is not None and decoded[1] == wanted[1]),
        }

    def aggregate(self, records: list[dict]) -> dict[str, dict]:
        definitions = SOLVE_METRICS if self.config.variant == "solve" else INFILL_METRICS
        quality = scored_means(records, definitions)
        problems = problems_words(len(records), self.config)
        for name, definition in definitions.items():
            quality[name]["definition"] = f"{definition}; mean over {problems}"
        return quality


def problems_words(count: int, config: ArithmeticSettings) -> str:
    """The test problems in words: how many, and how many near-duplicates of the model's
    training problems were left out to keep them held out."""
    if config.excluding is None:
        return f"{count} test problems"
    found = arithmetic.near_duplicates(
        config.limit, config.problem_seed, config.generator, config.excluding
    )
    return (
        f"{count} test problems, none a near-duplicate of a training problem (of the first "
        f"{found['first_drawn']} drawn, {found['dropped']} were left out: "
        f"{found['dropped_solution']} with a training problem's worked solution, "
        f"{found['dropped_question_up_to_names']} with its question up to the names; "
        f"{found['kept'] - found['kept_of_first']} others in their place, from the next "
        f"{found['drawn'] - found['first_drawn']} drawn)"
    )


def training_problems(model: str) -> dict | None:
    """The ``arithmetic.identity`` of the problems a model folder was trained on (its
    checkpoint.json's ``data``), or None: not a folder trained here on arithmetic problems."""
    marker = Path(model) / TRAINED_MARKER
    if not marker.is_file():
        return None
    data = read_json(marker, SettingError).get("data")
    if not isinstance(data, dict) or data.get("split") != "train" or "generator" not in data:
        return None
    return data


# ---------------------------------------------- `setdlm eval arithmetic`, one point
def run_point(args, loaded, tokenizer, base: DecodeConfig, out: Path, settings) -> dict:
    """One point of `setdlm eval arithmetic` (solve or infill, by ``--variant``; setdlm/eval/
    point.py runs it)."""
    from setdlm.eval.point import evaluate

    task = ArithmeticTask(
        ArithmeticSettings(
            variant=args.variant,
            limit=args.limit,
            problem_seed=args.problem_seed,
            generator=args.generator,
            max_new_tokens=args.max_new_tokens,
            # held out from what this model learned: its own training problems, where known
            excluding=training_problems(args.model),
        )
    )
    decode = arithmetic_decode_config(loaded.model, base)
    return evaluate(task, decode, args, loaded, tokenizer, out, settings)
