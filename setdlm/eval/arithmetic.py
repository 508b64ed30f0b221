"""A synthetic, GSM8K-shaped task made by seeded code: short multi-step arithmetic word problems.

Each problem is a story over a name and an object with two or three operations on one- or
two-digit numbers (gets more, gives away, doubles or triples), a worked solution of one line per
operation (``5 + 3 = 8``) and a final ``#### <answer>`` line, so the GSM8K answer extraction
scores it unchanged. Small enough for a CPU-trained model to learn, with the structure the
paper's GSM8K points measure (a chain of steps, one final number).

The problems are a function of (generator version, split, seed, index) only. Train and test
draw from separate random streams, and the test set also skips every question that the train
set of the same seed holds, so the two are disjoint by construction and checked to be.
``identity`` is what a result depends on (part of its configuration hash).

The infilling variant masks one middle solution step: the context before and after it is
given, the step is decoded in place and scored by exact match (``split_for_infilling``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from setdlm.eval.gsm8k import Problem

GENERATOR_VERSION = "arithmetic-1"
NAMES = (
    "Ada", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
)  # fmt: skip
OBJECTS = (
    "apples", "books", "cards", "coins", "eggs", "marbles", "pens", "shells", "stamps",
    "stickers", "stones", "tickets",
)  # fmt: skip


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
        return f"Then the number of {thing} {'doubles' if self.amount == 2 else 'triples'}."


def identity(split: str, count: int, seed: int) -> dict:
    """What a set of problems is, for a result's configuration hash."""
    return {"generator": GENERATOR_VERSION, "split": split, "count": count, "seed": seed}


def generate(split: str, count: int, seed: int) -> list[Problem]:
    """``count`` problems of ``split`` ("train" or "test"); the test problems of a seed never
    repeat a question of the train problems of the same seed (any count up to ``count``)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    excluded = {p.question for p in generate("train", count, seed)} if split == "test" else set()
    rng = random.Random(f"{GENERATOR_VERSION}:{split}:{seed}")
    problems, seen = [], set()
    while len(problems) < count:
        question, answer = _problem(rng)
        if question in excluded or question in seen:
            continue  # keeps the sets disjoint and each free of repeats
        seen.add(question)
        problems.append(Problem(f"{split}-{len(problems)}", question, answer))
    return problems


def check_disjoint(train: list[Problem], test: list[Problem]) -> None:
    shared = {p.question for p in train} & {p.question for p in test}
    if shared:
        raise ValueError(f"{len(shared)} question(s) in both train and test, e.g. {min(shared)!r}")


def _problem(rng: random.Random) -> tuple[str, str]:
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(OBJECTS)
    value = rng.randint(2, 60)
    sentences = [f"{name} has {value} {thing}."]
    lines = []
    for _ in range(rng.choice((2, 3))):
        operation = _operation(rng, value)
        result = operation.apply(value)
        sentences.append(operation.sentence(name, thing, other))
        lines.append(f"{value} {operation.symbol} {operation.amount} = {result}")
        value = result
    question = " ".join(sentences) + f" How many {thing} does {name} have now?"
    return question, "\n".join([*lines, f"#### {value}"])


def _operation(rng: random.Random, value: int) -> Operation:
    """An operation that keeps the count positive and below 200 (one- or two-digit amounts)."""
    allowed = (("+", value < 190), ("-", value > 1), ("*", value <= 60))
    symbol = rng.choice([symbol for symbol, ok in allowed if ok])
    if symbol == "+":
        return Operation("+", rng.randint(1, min(99, 199 - value)))
    if symbol == "-":
        return Operation("-", rng.randint(1, min(99, value - 1)))
    return Operation("*", rng.choice((2, 3)))


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
