"""A synthetic, GSM8K-shaped task made by seeded code: short multi-step arithmetic word problems.

Each problem is a story over a name and an object with two or three operations (gets more,
gives away: one-digit amounts; doubles), every count between 1 and 49, a worked solution of
one line per operation (``15 + 3 = 18``) and a final ``#### <answer>`` line, so the GSM8K
answer extraction scores it unchanged. Small enough for a CPU-trained model to learn, with the
structure the paper's GSM8K points measure (a chain of steps, one final number).

Versions (``GRAMMARS``): arithmetic-2 writes each step as ``value op amount = result``;
arithmetic-3, the default's since issue 24, has the same numbers but writes a ``+`` or ``*``
step with its operands in either order (a fair coin), both correct. A converged model is then
unsure how such a line starts, which is what decoding several positions in one step can get
wrong: the kind of uncertainty the paper's speed-quality trade-off is about. A version's
problems never change: a new task is a new version.

The problems are a function of (generator version, split, seed, index) only. Each question
belongs to one split by a hash of its text, and each split draws from its own random stream,
so train and test are disjoint by construction for any counts and seeds (and checked to be).
``identity`` is what a result depends on (part of its configuration hash).

The infilling variant masks one middle solution step: the context before and after it is
given, the step is decoded in place and scored by exact match (``split_for_infilling``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from setdlm.eval.problem import Problem

SPLITS = ("train", "test")
NAMES = (
    "Ada", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
)  # fmt: skip
OBJECTS = (
    "apples", "books", "cards", "coins", "eggs", "marbles", "pens", "shells", "stamps",
    "stickers", "stones", "tickets",
)  # fmt: skip
MULTIPLIED = {2: "doubles", 3: "triples"}


@dataclass(frozen=True)
class Grammar:
    """One version of the generator: the problems' numbers, operations and number of steps.
    A version's problems never change; a harder task is a new version beside the old ones."""

    version: str
    start: tuple[int, int]  # the first count, inclusive bounds
    max_value: int  # every count stays in 1..max_value
    max_amount: int  # "gets N more" and "gives N" draw N from 1..max_amount
    multipliers: tuple[tuple[int, int], ...]  # (factor, the largest count it may produce)
    steps: tuple[int, ...]  # how many operations a problem has, drawn uniformly
    # A "+" or "*" step is written with its operands in either order ("3 + 15 = 18" as well as
    # "15 + 3 = 18"), a fair coin each: both are correct, so a model is unsure which operand a
    # line starts with, and two positions decoded in one step can disagree ("15 + 15 = 18").
    either_order: bool = False

    def describe(self) -> str:
        factors = ", ".join(f"x{factor} to at most {limit}" for factor, limit in self.multipliers)
        steps = "/".join(map(str, self.steps))
        order = "; + and x written in either order" if self.either_order else ""
        return (
            f"{self.version}: start {self.start[0]}-{self.start[1]}, counts 1-{self.max_value}, "
            f"+/- 1-{self.max_amount}, {factors}; {steps} steps{order}"
        )


GRAMMARS = {
    grammar.version: grammar
    for grammar in (
        # the first default: one-digit amounts and doubling, a table of sums a 2-layer model
        # learns completely (about 100 % once converged: no headroom for tau to cost accuracy)
        Grammar("arithmetic-2", (2, 30), 49, 9, ((2, 40),), (2, 3)),
        # the same problems' numbers, each "+" and "*" step written with its operands in either
        # order: a model is unsure how a line starts, so tokens decoded in parallel can disagree
        # (the default's since issue 24)
        Grammar("arithmetic-3", (2, 30), 49, 9, ((2, 40),), (2, 3), either_order=True),
    )
}
GENERATOR_VERSION = "arithmetic-2"  # the version a setting that names none means
MAX_VALUE = GRAMMARS[GENERATOR_VERSION].max_value


@dataclass(frozen=True)
class Operation:
    symbol: str  # "+", "-" or "*"
    amount: int

    def apply(self, value: int) -> int:
        if self.symbol == "+":
            return value + self.amount
        if self.symbol == "-":
            return value - self.amount
        return value * self.amount

    def sentence(self, name: str, thing: str, other: str) -> str:
        if self.symbol == "+":
            return f"{name} gets {self.amount} more {thing}."
        if self.symbol == "-":
            return f"{name} gives {self.amount} {thing} to {other}."
        return f"Then the number of {thing} {MULTIPLIED[self.amount]}."


def grammar(version: str) -> Grammar:
    if version not in GRAMMARS:
        raise ValueError(f"unknown arithmetic generator {version!r}; known: {', '.join(GRAMMARS)}")
    return GRAMMARS[version]


def identity(split: str, count: int, seed: int, version: str = GENERATOR_VERSION) -> dict:
    """What a set of problems is, for a result's configuration hash."""
    return {"generator": grammar(version).version, "split": split, "count": count, "seed": seed}


def generate(split: str, count: int, seed: int, version: str = GENERATOR_VERSION) -> list[Problem]:
    """``count`` problems of ``split`` ("train" or "test"), each question once. A question
    belongs to one split by its hash (``split_of``), so train and test never share one,
    whatever the counts; ``seed`` picks which problems of the split are drawn."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rules = grammar(version)
    rng = random.Random(f"{rules.version}:{split}:{seed}")
    problems, seen = [], set()
    while len(problems) < count:
        question, answer = _problem(rng, rules)
        if split_of(question) != split or question in seen:
            continue  # keeps the splits disjoint and each free of repeats
        seen.add(question)
        problems.append(Problem(f"{split}-{len(problems)}", question, answer))
    return problems


def split_of(question: str) -> str:
    """The split a question belongs to: "test" for about 1 in 8 questions, by a hash that is
    the same on every platform and Python version."""
    digest = hashlib.blake2b(question.encode(), digest_size=1).digest()[0]
    return "test" if digest < 32 else "train"


def check_disjoint(train: list[Problem], test: list[Problem]) -> None:
    shared = {p.question for p in train} & {p.question for p in test}
    if shared:
        raise ValueError(f"{len(shared)} question(s) in both train and test, e.g. {min(shared)!r}")


def _problem(rng: random.Random, rules: Grammar) -> tuple[str, str]:
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(OBJECTS)
    value = rng.randint(*rules.start)
    sentences = [f"{name} has {value} {thing}."]
    lines = []
    for _ in range(rng.choice(rules.steps)):
        operation = _operation(rng, value, rules)
        result = operation.apply(value)
        sentences.append(operation.sentence(name, thing, other))
        left, right = value, operation.amount
        if rules.either_order and operation.symbol != "-" and rng.random() < 0.5:
            left, right = right, left
        lines.append(f"{left} {operation.symbol} {right} = {result}")
        value = result
    question = " ".join(sentences) + f" How many {thing} does {name} have?"
    return question, "\n".join([*lines, f"#### {value}"])


def _operation(rng: random.Random, value: int, rules: Grammar) -> Operation:
    """An operation that keeps the count in 1..max_value, drawn uniformly among those allowed
    (the draws of arithmetic-2 are those of the first generator, so its problems are too)."""
    allowed = [
        ("+", None) if value < rules.max_value else None,
        ("-", None) if value > 1 else None,
        *[("*", factor) if factor * value <= top else None for factor, top in rules.multipliers],
    ]
    symbol, factor = rng.choice([choice for choice in allowed if choice is not None])
    if symbol == "+":
        return Operation("+", rng.randint(1, min(rules.max_amount, rules.max_value - value)))
    if symbol == "-":
        return Operation("-", rng.randint(1, min(rules.max_amount, value - 1)))
    return Operation("*", factor)


def split_for_infilling(problem: Problem, step: int | None = None) -> tuple[str, str, str]:
    """(text before, the masked solution step, text after) of a problem's worked solution, the
    question included in the text before; ``step`` counts solution lines from 0 and defaults
    to the middle one (never the final ``####`` line)."""
    lines = problem.answer.split("\n")
    steps = len(lines) - 1  # the last line is the answer
    step = steps // 2 if step is None else step
    if not 0 <= step < steps:
        raise ValueError(f"{problem.id}: step {step} is not one of its {steps} solution steps")
    before = "\n".join([problem.question, *lines[:step]]) + "\n"
    after = "\n" + "\n".join(lines[step + 1 :])
    return before, lines[step], after
