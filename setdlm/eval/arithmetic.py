"""A synthetic, GSM8K-shaped task made by seeded code: short multi-step arithmetic word problems.

Each problem is a story over a name and an object with two or three operations (gets more,
gives away: one-digit amounts; doubles), every count between 1 and 49, a worked solution of
one line per operation (``15 + 3 = 18``) and a final ``#### <answer>`` line, so the GSM8K
answer extraction scores it unchanged. Small enough for a CPU-trained model to learn, with the
structure the paper's GSM8K points measure (a chain of steps, one final number).

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

from setdlm.eval.gsm8k import Problem

GENERATOR_VERSION = "arithmetic-2"
SPLITS = ("train", "test")
NAMES = (
    "Ada", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
)  # fmt: skip
OBJECTS = (
    "apples", "books", "cards", "coins", "eggs", "marbles", "pens", "shells", "stamps",
    "stickers", "stones", "tickets",
)  # fmt: skip
MAX_START = 30  # the first count: one or two digits
MAX_VALUE = 49  # every count stays in 1..49
MAX_DOUBLED = 40  # "doubles" only where the result stays small


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
        return f"Then the number of {thing} doubles."  # "*" is always "* 2" (_operation)


def identity(split: str, count: int, seed: int) -> dict:
    """What a set of problems is, for a result's configuration hash."""
    return {"generator": GENERATOR_VERSION, "split": split, "count": count, "seed": seed}


def generate(split: str, count: int, seed: int) -> list[Problem]:
    """``count`` problems of ``split`` ("train" or "test"), each question once. A question
    belongs to one split by its hash (``split_of``), so train and test never share one,
    whatever the counts; ``seed`` picks which problems of the split are drawn."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{GENERATOR_VERSION}:{split}:{seed}")
    problems, seen = [], set()
    while len(problems) < count:
        question, answer = _problem(rng)
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


def _problem(rng: random.Random) -> tuple[str, str]:
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(OBJECTS)
    value = rng.randint(2, MAX_START)
    sentences = [f"{name} has {value} {thing}."]
    lines = []
    for _ in range(rng.choice((2, 3))):
        operation = _operation(rng, value)
        result = operation.apply(value)
        sentences.append(operation.sentence(name, thing, other))
        lines.append(f"{value} {operation.symbol} {operation.amount} = {result}")
        value = result
    question = " ".join(sentences) + f" How many {thing} does {name} have?"
    return question, "\n".join([*lines, f"#### {value}"])


def _operation(rng: random.Random, value: int) -> Operation:
    """An operation on a one-digit amount that keeps the count in 1..MAX_VALUE: small enough
    a table of sums for a 2-layer model to learn in minutes, still a chain of 2-3 steps."""
    allowed = (
        ("+", value < MAX_VALUE),
        ("-", value > 1),
        ("*", 2 * value <= MAX_DOUBLED),
    )
    symbol = rng.choice([symbol for symbol, ok in allowed if ok])
    if symbol == "+":
        return Operation("+", rng.randint(1, min(9, MAX_VALUE - value)))
    if symbol == "-":
        return Operation("-", rng.randint(1, min(9, value - 1)))
    return Operation("*", 2)


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
