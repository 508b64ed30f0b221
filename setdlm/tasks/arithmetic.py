"""A synthetic, GSM8K-shaped task made by seeded code: short multi-step arithmetic word problems.

Each problem is a story over a name and an object with two or three operations (gets more,
gives away, multiplies; in arithmetic-2 and -3 one-digit amounts, doubling, counts 1-49), a
worked solution of one line per operation (``15 + 3 = 18``) and a final ``#### <answer>``
line, so the GSM8K answer extraction scores it unchanged. Small enough for a CPU-trained model
to learn, with the structure the paper's GSM8K points measure (a chain of steps, one final
number).

Versions (``GRAMMARS``): arithmetic-2 writes each step as ``value op amount = result``;
arithmetic-3 has the same numbers but writes a ``+`` or ``*`` step with its operands in either
order (a fair coin), both correct. A converged model is then unsure how such a line starts,
which is what decoding several positions in one step can get wrong: the kind of uncertainty the
paper's speed-quality trade-off is about. arithmetic-4, the default's since issue 24 (converged
tiny models solve arithmetic-3 at every tau), writes steps as arithmetic-3 does over larger
numbers (counts to 99, amounts to 19, doubling and tripling): most of its numbers take two
tokens under the tiny BPE, so a line has more positions that must agree. A version's problems
never change: a new task is a new version.

The problems are a function of (generator version, split, seed, index) only. Each question
belongs to one split by a hash of its text, and each split draws from its own random stream,
so train and test are disjoint by construction for any counts and seeds (and checked to be).
``identity`` is what a result depends on (part of its configuration hash).

The infilling variant masks one middle solution step: the context before and after it is
given, the step is decoded in place (``split_for_infilling``) and scored against every way the
version writes that step correctly (``correct_lines``: either operand order of a ``+`` or ``*``
step in arithmetic-3 and -4), as well as by exact match.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass

from setdlm.tasks.problem import Problem

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

    def writes_either_order(self, symbol: str) -> bool:
        """Whether this version writes a ``symbol`` step with its operands in either order."""
        return self.either_order and symbol != "-"

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
        # counts to 99, amounts to 19 and tripling as well as doubling, written in either order:
        # a sum table about ten times arithmetic-3's, with two-token numbers under the tiny BPE,
        # so that parallel decoding costs accuracy on converged models (issue 24)
        Grammar("arithmetic-4", (2, 60), 99, 19, ((2, 99), (3, 99)), (2, 3), either_order=True),
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


# Why a test problem is left out when drawn against a model's training problems (``excluding``)
NEAR_DUPLICATES = (
    "test problems whose worked solution, or whose question up to the names, occurs among the "
    "training problems are left out, and more drawn in their place"
)


def identity(
    split: str,
    count: int,
    seed: int,
    version: str = GENERATOR_VERSION,
    excluding: dict | None = None,
) -> dict:
    """What a set of problems is, for a result's configuration hash (``excluding``: the
    training problems its near-duplicates were left out against, see ``generate``)."""
    found = {"generator": grammar(version).version, "split": split, "count": count, "seed": seed}
    if excluding is not None:
        found["excluding"] = _training(excluding)
        found["near_duplicates"] = NEAR_DUPLICATES
    return found


def generate(
    split: str,
    count: int,
    seed: int,
    version: str = GENERATOR_VERSION,
    excluding: dict | None = None,
) -> list[Problem]:
    """``count`` problems of ``split`` ("train" or "test"), each question once. A question
    belongs to one split by its hash (``split_of``), so train and test never share one,
    whatever the counts; ``seed`` picks which problems of the split are drawn.

    ``excluding`` (an ``identity`` of training problems): a problem is also left out when its
    worked solution is one of theirs, or its question is one of theirs up to the names (the
    same numbers and operations told of other people): a model that learned those would
    answer it from memory. The others are the same problems, with the same ids, as without
    ``excluding``; more are drawn from the same stream to make up ``count`` (ids go on from
    where the stream is)."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    version = grammar(version).version
    if excluding is None:
        return list(_generated(split, count, seed, version))
    return list(_kept(split, count, seed, version, *_training_key(excluding)))


def near_duplicates(count: int, seed: int, version: str, excluding: dict) -> dict:
    """How ``generate("test", count, seed, version, excluding)`` came by its problems: of the
    first ``count`` test problems drawn, how many were left out for each reason (a problem may
    have both), and how many were drawn in all."""
    kept = generate("test", count, seed, version, excluding)
    drawn = 1 + max(int(problem.id.split("-")[1]) for problem in kept)
    first = generate("test", count, seed, version)
    solutions, questions = _training_texts(*_training_key(excluding))
    by_solution = {p.id for p in first if p.answer in solutions}
    by_question = {p.id for p in first if without_names(p.question) in questions}
    return {
        "first_drawn": count,
        "dropped_solution": len(by_solution),
        "dropped_question_up_to_names": len(by_question),
        "dropped": len(by_solution | by_question),
        "kept_of_first": count - len(by_solution | by_question),
        "drawn": drawn,
        "kept": len(kept),
    }


_NAME = re.compile(r"\b(?:" + "|".join(NAMES) + r")\b")


def without_names(question: str) -> str:
    """The question with every name replaced by one placeholder: two questions that differ
    only in who has and who receives the things read the same."""
    return _NAME.sub("NAME", question)


def _training(excluding: dict) -> dict:
    generator, count, seed = _training_key(excluding)
    return {"generator": generator, "split": "train", "count": count, "seed": seed}


def _training_key(excluding: dict) -> tuple[str, int, int]:
    if not isinstance(excluding, dict) or excluding.get("split", "train") != "train":
        raise ValueError(f"excluding must name training problems, got {excluding!r}")
    missing = [key for key in ("generator", "count", "seed") if key not in excluding]
    if missing:
        raise ValueError(f"excluding lacks {', '.join(missing)}: {excluding!r}")
    return grammar(excluding["generator"]).version, int(excluding["count"]), int(excluding["seed"])


@functools.lru_cache(maxsize=4)
def _training_texts(version: str, count: int, seed: int) -> tuple[frozenset, frozenset]:
    """(worked solutions, questions up to names) of the training problems."""
    problems = _generated("train", count, seed, version)
    return (
        frozenset(p.answer for p in problems),
        frozenset(without_names(p.question) for p in problems),
    )


@functools.lru_cache(maxsize=8)
def _kept(split, count, seed, version, train_version, train_count, train_seed):
    solutions, questions = _training_texts(train_version, train_count, train_seed)
    kept, drawn = [], 0
    while len(kept) < count:
        drawn = max(drawn * 2, count + 64)  # the stream's first problems, more as needed
        stream = _generated(split, drawn, seed, version)
        kept = [
            p
            for p in stream
            if p.answer not in solutions and without_names(p.question) not in questions
        ]
    return tuple(kept[:count])


# A pure function of its arguments, drawn again by every point of a process that evaluates
# many (the test problems of each solve, infill and likelihood point, the reference pool and
# the training problems of each unconditional point's judge): a fifth of a millisecond per
# problem, seconds per point. Drawn once per process instead; the problems are frozen.
@functools.lru_cache(maxsize=8)
def _generated(split: str, count: int, seed: int, version: str) -> tuple[Problem, ...]:
    rules = grammar(version)
    rng = random.Random(f"{rules.version}:{split}:{seed}")
    problems, seen = [], set()
    while len(problems) < count:
        question, answer = _problem(rng, rules)
        if split_of(question) != split or question in seen:
            continue  # keeps the splits disjoint and each free of repeats
        seen.add(question)
        problems.append(Problem(f"{split}-{len(problems)}", question, answer))
    return tuple(problems)


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
        if rules.writes_either_order(operation.symbol) and rng.random() < 0.5:
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


# ------------------------------------------------------------------- judging generated problems
@dataclass(frozen=True)
class SampleVerdict:
    """What an unconditional sample is, read as a problem of one generator version.

    valid: the question is one the generator could have drawn (its names, objects, start,
    number of operations, amounts and bounds) and the solution has its shape (one
    ``a op b = c`` line per operation, then ``#### n``), whatever the numbers in it;
    correct: valid, and every line and the final answer are right for the question stated
    (a ``+`` or ``*`` line in either operand order where the grammar writes both);
    reason: why it is not valid or not correct ("" when it is both)."""

    valid: bool
    correct: bool
    question: str | None
    reason: str = ""


_SENTENCE = re.compile(r"[^.?]+[.?]")
_START = re.compile(r"(?P<name>[A-Z][a-z]+) has (?P<value>\d+) (?P<thing>[a-z]+)\.")
_GETS = re.compile(r"(?P<name>[A-Z][a-z]+) gets (?P<amount>\d+) more (?P<thing>[a-z]+)\.")
_GIVES = re.compile(
    r"(?P<name>[A-Z][a-z]+) gives (?P<amount>\d+) (?P<thing>[a-z]+) to (?P<other>[A-Z][a-z]+)\."
)
_TIMES = re.compile(r"Then the number of (?P<thing>[a-z]+) (?P<word>[a-z]+)\.")
_ASK = re.compile(r"How many (?P<thing>[a-z]+) does (?P<name>[A-Z][a-z]+) have\?")
_LINE = re.compile(r"(\d+) ([-+*]) (\d+) = (-?\d+)")
_FINAL = re.compile(r"#### (-?\d+)")
_FACTOR = {word: factor for factor, word in MULTIPLIED.items()}


def judge_sample(text: str, version: str) -> SampleVerdict:
    """``text`` (a question line, then its solution lines) judged against generator
    ``version``: see ``SampleVerdict``."""
    rules = grammar(version)
    lines = text.strip().split("\n")
    question = lines[0].strip()
    operations, why = _read_question(question, rules)
    if operations is None:
        return SampleVerdict(False, False, None, f"question: {why}")
    solution = [line.strip() for line in lines[1:]]
    if len(solution) != len(operations) + 1:
        shape = f"{len(solution)} solution lines for {len(operations)} operations (+ ####)"
        return SampleVerdict(False, False, question, f"solution: {shape}")
    steps, final = solution[:-1], solution[-1]
    if not all(_LINE.fullmatch(line) for line in steps) or not _FINAL.fullmatch(final):
        return SampleVerdict(False, False, question, "solution: a line not 'a op b = c' / '#### n'")
    value = int(_START.match(question)["value"])
    for index, (line, operation) in enumerate(zip(steps, operations, strict=True)):
        result = operation.apply(value)
        if line not in correct_lines(value, operation.symbol, operation.amount, result, rules):
            return SampleVerdict(True, False, question, f"wrong: step {index + 1}")
        value = result
    if final != f"#### {value}":
        return SampleVerdict(True, False, question, "wrong: final answer")
    return SampleVerdict(True, True, question)


def correct_lines(left: int, symbol: str, right: int, result: int, rules: Grammar) -> set[str]:
    """Every way ``rules`` writes the step ``left symbol right = result`` correctly: as given,
    and with its operands swapped where the version writes a ``+`` or ``*`` step in either
    order (arithmetic-3); subtraction keeps its order."""
    lines = {f"{left} {symbol} {right} = {result}"}
    if rules.writes_either_order(symbol):
        lines.add(f"{right} {symbol} {left} = {result}")
    return lines


def correct_forms_of(step: str, version: str) -> set[str]:
    """The written forms of a solution line (``a op b = c``, as ``generate`` wrote it) that
    version ``version`` counts as correct: what an infilled step is scored against."""
    line = _LINE.fullmatch(step.strip())
    if line is None:
        raise ValueError(f"not a solution step 'a op b = c': {step!r}")
    left, symbol, right, result = line.groups()
    return correct_lines(int(left), symbol, int(right), int(result), grammar(version))


def _read_question(question: str, rules: Grammar) -> tuple[list[Operation] | None, str]:
    """The operations of a question the generator ``rules`` could have drawn, else (None, why)."""
    sentences = [s.strip() for s in _SENTENCE.findall(question)]
    if " ".join(sentences) != question:
        return None, "not a sequence of sentences"
    if len(sentences) < 2:
        return None, "too short"
    start, ask = _START.fullmatch(sentences[0]), _ASK.fullmatch(sentences[-1])
    if start is None or ask is None:
        return None, "no 'X has N things.' first or no 'How many ...?' last"
    name, thing, value = start["name"], start["thing"], int(start["value"])
    if name not in NAMES or thing not in OBJECTS:
        return None, f"unknown name or object ({name}, {thing})"
    if (ask["name"], ask["thing"]) != (name, thing):
        return None, "asks about another name or object"
    if not rules.start[0] <= value <= rules.start[1]:
        return None, f"start {value} outside {rules.start}"
    operations, others = [], set()
    for sentence in sentences[1:-1]:
        operation, why = _read_operation(sentence, name, thing, value, rules, others)
        if operation is None:
            return None, why
        operations.append(operation)
        value = operation.apply(value)
    if len(operations) not in rules.steps:
        return None, f"{len(operations)} operations, not one of {rules.steps}"
    return operations, ""


def _read_operation(sentence, name, thing, value, rules, others) -> tuple[Operation | None, str]:
    """One operation sentence, if the generator could draw it at count ``value``."""
    if match := _GETS.fullmatch(sentence):
        operation, top = Operation("+", int(match["amount"])), rules.max_value - value
    elif match := _GIVES.fullmatch(sentence):
        operation, top = Operation("-", int(match["amount"])), value - 1
        others.add(match["other"])
        if match["other"] not in NAMES or match["other"] == name or len(others) > 1:
            return None, f"gives to {match['other']!r}: not the problem's one other name"
    elif (match := _TIMES.fullmatch(sentence)) and match["word"] in _FACTOR:
        factor = _FACTOR[match["word"]]
        limits = dict(rules.multipliers)
        if factor not in limits or factor * value > limits[factor]:
            return None, f"{match['word']} at {value}: not allowed"
        return (Operation("*", factor), "") if match["thing"] == thing else (None, "object")
    else:
        return None, f"not an operation sentence: {sentence[:40]!r}"
    if match["name"] != name or match["thing"] != thing:
        return None, "another name or object in an operation"
    if not 1 <= operation.amount <= min(rules.max_amount, top):
        return None, f"{operation.symbol}{operation.amount} at {value}: out of bounds"
    return operation, ""


class SampleJudge:
    """Per-sample scores of generated problems: valid, correct and novel (valid, and its
    question is not one of the model's training problems: ``training``, an ``identity`` of
    them, or None when they are unknown, and then no novelty is scored)."""

    def __init__(self, version: str, training: dict | None):
        self.version = grammar(version).version
        self.training = training
        self._seen = None
        if training is not None:
            problems = generate("train", training["count"], training["seed"], training["generator"])
            self._seen = {problem.question for problem in problems}

    def scores(self, text: str) -> dict[str, float]:
        verdict = judge_sample(text, self.version)
        scores = {"valid": float(verdict.valid), "correct": float(verdict.correct)}
        if self._seen is not None:
            scores["novel"] = float(verdict.valid and verdict.question not in self._seen)
        return scores
