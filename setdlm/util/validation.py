"""One set of rules for every setting a user gives, on the command line or in a configuration.

The value rules live in the workflow schema (workflows/config/schema.yaml): a command-line
option names the schema node it obeys (``option("$defs/threshold")``), so ``--threshold 0``
and ``thresholds: [0]`` are refused by the same rule with the same words. A task's settings
are defined there once: ``task_settings`` turns each into ``setdlm eval``'s option (rule,
default, help) and into the arguments the workflow writes for a configured value. The rules between
settings, or between a setting and the model (a warm-up that leaves nothing to time, a budget
past the model length, a knob the family does not have), are the functions below; the
workflow's semantic checks and the command lines both call them.
"""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from setdlm.families import FAMILIES, FAMILY_NAMES, MODEL_NAME_PATTERN, UnknownNameError
from setdlm.families import family as family_info
from setdlm.tasks.arithmetic import GRAMMARS as ARITHMETIC_GRAMMARS
from setdlm.util.errors import UserError

# setdlm/workflows is the top-level workflows/ folder (a link in the checkout, package data in
# a wheel): found the same way from a checkout and from an installed package.
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "workflows" / "config" / "schema.yaml"


# libyaml's parser where PyYAML has it (its wheels do), Python's otherwise: the same documents,
# errors and marks, 5-8x faster. Every process that validates a configuration reads this schema
# (27 kB) and models.yaml (12 kB): 8.5 and 5 ms instead of 65 and 25 (AMD EPYC), in each workflow
# job, and some 400 times in a test session.
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SettingError(UserError, ValueError):
    """A setting out of its range or in contradiction with another one or with the model."""


@functools.cache
def schema() -> dict:
    """The workflow schema, with what the family table defines filled in: the family names
    and the model-name grammar."""
    with open(SCHEMA_PATH, encoding="utf-8") as handle:
        loaded = yaml.load(handle, Loader=SafeLoader)  # noqa: S506 (a SafeLoader)
    loaded["$defs"]["model"]["properties"]["family"]["enum"] = list(FAMILY_NAMES)
    loaded["$defs"]["generator"]["enum"] = list(ARITHMETIC_GRAMMARS)
    # unconditional samples of arithmetic models are judged against a generator's problems
    loaded["$defs"]["unconditional"]["properties"]["references"]["enum"] += ARITHMETIC_GRAMMARS
    loaded["properties"]["models"]["propertyNames"]["pattern"] = MODEL_NAME_PATTERN
    _anchor_at_the_very_end(loaded)
    return loaded


def _anchor_at_the_very_end(node) -> None:
    """Python's ``$`` also matches before a final newline, so a name ending in one ("tiny\n")
    passed ``^[a-z]...$``; ``(?!\n)`` after it keeps JSON schema's meaning (the string ends)."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern.endswith("$") and not pattern.endswith("\\$"):
            node["pattern"] = pattern + r"(?!\n)"
        for value in node.values():
            _anchor_at_the_very_end(value)
    elif isinstance(node, list):
        for value in node:
            _anchor_at_the_very_end(value)


def node(pointer: str) -> dict:
    """The schema node at a slash-separated path ("$defs/override/properties/window")."""
    value = schema()
    for part in pointer.split("/"):
        value = value[part]
    return resolved(value)


def resolved(value: dict) -> dict:
    """A node with its ``$ref`` followed; keys beside the ``$ref`` (a default, a description
    of this use) take precedence over the referenced node's."""
    ref = value.get("$ref")
    if not ref:
        return value
    return {**node(ref.removeprefix("#/")), **{k: v for k, v in value.items() if k != "$ref"}}


def expectation(rule: dict) -> str:
    """What a value obeying ``rule`` looks like, in words ("an integer >= 1")."""
    rule = resolved(rule)
    if "x-expected" in rule:
        return rule["x-expected"]
    if "enum" in rule:
        return "one of " + ", ".join(map(str, rule["enum"]))
    types = rule.get("type", [])
    types = [t for t in ([types] if isinstance(types, str) else types) if t != "null"]
    noun = {"integer": "an integer", "number": "a number", "boolean": "true or false"}.get(
        types[0] if types else "", "a value"
    )
    bounds = [
        f"{sign} {_show(rule[key])}"
        for key, sign in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if key in rule
    ]
    return " ".join([noun, " and ".join(bounds)]).strip()


def valid(value: Any, rule: dict) -> bool:
    """Whether ``value`` obeys ``rule`` (a schema node, which may refer to shared definitions);
    NaN and infinities never do: a bound cannot refuse them."""
    return validator_class()({"$defs": schema()["$defs"], **resolved(rule)}).is_valid(value)


@functools.cache
def validator_class():
    """JSON schema's validator, with NaN and the infinities not numbers: every comparison with
    NaN is false, so ``minimum`` and ``maximum`` let it through (YAML reads ``.nan`` and
    ``.inf`` as floats), and no setting has a use for an infinite value."""
    from jsonschema import Draft202012Validator, validators

    def finite_number(checker, value) -> bool:
        is_number = Draft202012Validator.TYPE_CHECKER.is_type(value, "number")
        return is_number and not (isinstance(value, float) and not math.isfinite(value))

    checker = Draft202012Validator.TYPE_CHECKER.redefine("number", finite_number)
    return validators.extend(Draft202012Validator, type_checker=checker)


def option(pointer: str):
    """An argparse ``type=`` that parses text as the schema node at ``pointer`` says and
    refuses what the node refuses, in the schema's words."""
    rule = node(pointer)
    types = rule.get("type", "number")
    types = [types] if isinstance(types, str) else types
    integer = "integer" in types and "number" not in types

    def parse(text: str):
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {expectation(rule)}") from None
        if isinstance(value, float) and value.is_integer() and "integer" in types:
            value = int(value)
        if not valid(value, rule):
            raise argparse.ArgumentTypeError(f"{text!r} is not {expectation(rule)}")
        return value

    parse.__name__ = pointer.rsplit("/", 1)[-1]  # argparse names the type in some messages
    return parse


# ----------------------------------------------------------------- task settings as options
# Task keys that say which jobs exist (the workflow's), not what one evaluation computes (or,
# as `mauve_thresholds`, which points compute something: the workflow gives those an option).
NOT_OPTIONS = (
    "models",
    "overrides",
    "policies",
    "thresholds",
    "jobs",
    "shards",
    "mauve_thresholds",
)


@dataclass(frozen=True)
class Setting:
    """A task setting, defined once by its schema node: the configuration key
    ``tasks.<task>.<key>`` and the command-line option ``--<key>`` of ``setdlm eval`` obey the
    same rule and share the default, and the workflow writes a configured value as the option.

    Its form on the command line follows the node: a choice (``enum``), a flag (a boolean
    that defaults to false: ``--key``; to true: ``--no-key``), an object as its properties'
    values joined by commas (``--reject 4.0,50,10``), text, or a number checked as the schema
    checks it.
    """

    key: str
    pointer: str  # the schema node ("$defs/gsm8k/properties/limit")

    @property
    def rule(self) -> dict:
        return node(self.pointer)

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def kind(self) -> str:
        rule = self.rule
        types = rule.get("type", [])
        types = {types} if isinstance(types, str) else set(types)
        if "enum" in rule:
            return "choice"
        if types == {"boolean"}:
            return "negated" if rule.get("default") else "flag"
        if types == {"object"}:
            return "composite"
        if types & {"integer", "number"}:
            return "number"
        return "text"

    @property
    def parts(self) -> list[str]:
        """A composite setting's properties, in the order the option lists them."""
        return list(self.rule.get("properties", {}))

    def add_to(self, parser) -> None:
        rule, kind = self.rule, self.kind
        words = rule.get("description")
        help_text = " ".join(str(words).split()) if words else None
        if kind == "flag":
            parser.add_argument(self.flag, dest=self.key, action="store_true", help=help_text)
        elif kind == "negated":
            flag = "--no-" + self.key.replace("_", "-")
            parser.add_argument(flag, dest=self.key, action="store_false", help=help_text)
        elif kind == "choice":
            choices = rule["enum"]
            parser.add_argument(
                self.flag, choices=choices, default=rule.get("default"), help=help_text
            )
        elif kind == "composite":
            default = ",".join(str(node(self._part(p)).get("default")) for p in self.parts)
            parser.add_argument(
                self.flag,
                type=self.parse_composite,
                default=self.parse_composite(default),
                metavar=",".join(p.upper() for p in self.parts),
                help=help_text,
            )
        else:
            parse = option(self.pointer) if kind == "number" else str
            parser.add_argument(self.flag, type=parse, default=rule.get("default"), help=help_text)

    def parse_composite(self, text: str) -> tuple:
        """``a,b,c`` as the composite's properties, each by its own rule."""
        values = str(text).split(",")
        if len(values) != len(self.parts):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {','.join(p.upper() for p in self.parts)} "
                f"({len(self.parts)} comma-separated values)"
            )
        return tuple(
            option(self._part(part))(value) for part, value in zip(self.parts, values, strict=True)
        )

    def args(self, value) -> list[str]:
        """The command-line form of a configured value (nothing for None or an unset flag)."""
        kind = self.kind
        if kind == "flag":
            return [self.flag] if value else []
        if kind == "negated":
            return [] if value else ["--no-" + self.key.replace("_", "-")]
        if value is None:
            return []
        if kind == "composite":
            return [self.flag, ",".join(str(value[part]) for part in self.parts)]
        return [self.flag, str(value)]

    def _part(self, part: str) -> str:
        return f"{self.pointer}/properties/{part}"


def schema_task(task: str) -> str:
    """The schema node of a workflow task ("infill-3" -> "infill")."""
    return schema()["properties"]["tasks"]["properties"][task]["$ref"].rsplit("/", 1)[-1]


def task_settings(task: str, skip: tuple[str, ...] = ()) -> list[Setting]:
    """The settings of schema task node ``task`` ("gsm8k", "arithmetic-solve", ...) that one
    evaluation computes with, in the schema's order."""
    pointer = f"$defs/{task}"
    return [
        Setting(key, f"{pointer}/properties/{key}")
        for key in node(pointer)["properties"]
        if key not in NOT_OPTIONS and key not in skip
    ]


# The options several commands share, by the schema node (workflows/config/schema.yaml) they obey.
SEED = option("$defs/seed")
BATCH_SIZE = option("$defs/override/properties/batch_size")
LIMIT = option("$defs/gsm8k/properties/limit")
THRESHOLD = option("$defs/threshold")
WINDOW = option("$defs/override/properties/window")
BLOCK_SIZE = option("$defs/override/properties/block_size")
WARMUP = option("$defs/gsm8k/properties/warmup")
NEW_TOKENS = option("$defs/gsm8k/properties/max_new_tokens")
THREADS = option("$defs/resources/properties/cpus")
COUNT = option("$defs/count")
EXAMPLES = option("$defs/examples")  # prompts, problems, samples: bounded above too
TOKENS = option("$defs/tokens")  # a prompt's or a generation's tokens: bounded above too
REPEATS = option("$defs/repeats")
HEADS = option("$defs/train/properties/n_heads")
LENGTH = option("$defs/train/properties/length")


def output_path(text: str) -> Path:
    """An argparse ``type=`` for a file or folder a command writes. An empty value (``--out
    ""``, an unset shell variable) would be the working directory, whose files are not the
    command's to overwrite."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a path to write (an empty one would be the working directory); "
            "expected the folder or file for the output"
        )
    return Path(text)


def torch_device(name: str, flag: str = "--device", hint: str = ""):
    """The torch device an option names, refused in the option's words when torch does not
    know it (tpu), this project does not run on it (mps, meta) or this machine lacks it
    (cuda without a GPU, cuda:3 with one). ``hint``: what to pass instead, for the last."""
    import torch

    expected = f"{flag} {name!r}: expected cpu, cuda or cuda:N (N a GPU index)"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SettingError(expected) from None
    if device.type not in ("cpu", "cuda"):
        raise SettingError(expected)
    if device.type == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == 0:
            raise SettingError(f"{flag} {name}: no CUDA device is available here{hint}")
        if device.index is not None and device.index >= available:
            raise SettingError(
                f"{flag} {name}: this machine has {available} CUDA device(s), "
                f"cuda:0 to cuda:{available - 1}"
            )
    return device


# --------------------------------------------------------------------- rules between settings
def warmup_errors(warmup: int, limit: int | None, where: str, limit_where: str) -> list[str]:
    """Untimed warm-up examples must leave at least one example to time."""
    if limit is not None and warmup >= limit:
        return [
            f"{where}: {warmup} untimed warm-up example(s) leave none of the {limit} examples "
            f"({limit_where}) to time; expected fewer than {limit} (0 times every example)"
        ]
    return []


def knob_errors(
    family: str, knobs: dict[str, Any], where: str, name: str, policy: str | None = None
) -> list[str]:
    """A decoding policy the family does not decode with, or knobs the policy does not have
    (a SetDLM window on AR, ...); ``where`` is a format string with ``{knob}`` (block_size) or
    ``{flag}`` (block-size). policy None: the family's default."""
    info = family_info(family)
    try:
        chosen = info.policy(policy)
    except UnknownNameError as error:
        return [f"{where.format(knob='policy', flag='policy')}: {error} ({name} is {family})"]
    errors = []
    for knob, value in knobs.items():
        if value is None or knob in chosen.knobs:
            continue
        place = where.format(knob=knob, flag=knob.replace("_", "-"))
        holders = [f.title for f in FAMILIES.values() if knob in f.knobs]
        if info.title in holders:  # another of its policies has the knob
            has = ", ".join(chosen.knobs) or "none"
            errors.append(
                f"{place}: {info.title}'s {chosen.name} decoding has no {knob} "
                f"(its knobs: {has}; {name} is {family})"
            )
        else:
            verb = "decodes" if len(holders) == 1 else "decode"
            errors.append(
                f"{place}: only {' and '.join(holders)} {verb} with a {knob} ({name} is {family})"
            )
    return errors


def budget_errors(
    max_new_tokens: int | None, length: int, where: str, prompt_tokens: int = 1
) -> list[str]:
    """A generation budget must fit in the model beside its prompt (at least one token)."""
    if max_new_tokens is not None and prompt_tokens + max_new_tokens > length:
        return [
            f"{where}: {max_new_tokens} new tokens after a {prompt_tokens}-token prompt do not "
            f"fit in a model of length {length}; expected at most {length - prompt_tokens}"
        ]
    return []


def block_errors(block_size: int | None, length: int, where: str) -> list[str]:
    """Decoding blocks tile the model's length."""
    if block_size is not None and length % block_size:
        return [f"{where}: {block_size} does not divide the model length {length}"]
    return []


def tokenizer_errors(tokens: int, embedding_rows: int, where: str) -> list[str]:
    """A tokenizer with ids the model has no embedding for (another model's tokenizer)."""
    if tokens > embedding_rows:
        return [
            f"{where}: {tokens} tokens, but the model embeds only {embedding_rows} "
            "(the tokenizer of another model?); expected the model's own tokenizer"
        ]
    return []


def raise_for(errors: list[str]) -> None:
    if errors:
        raise SettingError("; ".join(errors))


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
