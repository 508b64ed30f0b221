"""The one table of family facts: every place that needs to know something about a family or
a decoding policy asks here, and an unknown name is an error that lists the known ones.

A family is a model class (its loss and its default decoding policy) plus the facts the rest
of the suite needs about it: how its models are named, which schedule it trains with, which
decoding policies it can decode with (the first is its default), what its likelihood measures,
and the paper's decoding settings per task. A decoding policy is an ``OrderPolicy`` class
(``setdlm/core/decoding/engine.py``) with its own typed options; the engine runs every one.

Adding a family or a decoding policy is a row here plus the file that holds its class: the
workflow, the command lines, the tables, the figures and MLflow read everything else from this
table. The module imports no torch (the workflow checks configurations with it before any job
runs); classes are named as lazy ``"module:Class"`` strings.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from setdlm.util.errors import UserError


class UnknownNameError(UserError, ValueError):
    """A family or decoding policy name that the table does not hold."""


@dataclass(frozen=True)
class PolicyInfo:
    """A decoding policy: which positions each forward decodes, and what it caches."""

    name: str  # how configurations, command lines and result folders name it
    path: str  # "module:Class" of its OrderPolicy (which declares its typed Options)
    knobs: tuple[str, ...]  # its options a configuration or a command line may set
    # Whether its KV cache holds exactly what recomputing the forward would give (or it keeps
    # no cache); an approximate cache reuses keys and values computed before the tokens they
    # saw changed, and trades accuracy for speed.
    exact_cache: bool
    summary: str


@dataclass(frozen=True)
class SizeRule:
    """The size a model name carries (``bd3lm-s4``: S = 4) and where its settings hold it."""

    letter: str  # in the name: "s" -> bd3lm-s4, "smax" -> setdlm-smax8
    symbol: str  # in messages: "S" (bd3lm-s<S>), "M" (setdlm-smax<M>)
    setting: str  # the model setting it is a multiple of (a workflow model entry's key)
    multiple: int  # size = multiple x setting (SetDLM: smax M = 2d)
    config_path: tuple[str, ...]  # where a ModelConfig's dict holds the size itself
    title: str  # "BD3LM S={size}"


@dataclass(frozen=True)
class FamilyInfo:
    name: str
    title: str  # in tables, figures, and the official checkpoints' "architectures"
    model_class: str  # "module:Class" of its Family (an nn.Module)
    size: SizeRule | None  # None: the name carries no size (ar, mdlm)
    settings: tuple[str, ...]  # model-entry settings it has (d, window, block_size)
    # Those settings that are also decoding knobs, given to every evaluation of the model
    # (SetDLM's W); a task's overrides may change them.
    entry_knobs: tuple[str, ...]
    schedule: str | None  # "linear", "staggered" or None (no noise)
    policies: tuple[PolicyInfo, ...]  # the first is its default
    likelihood: str  # what its held-out NLL measures, said beside every number
    likelihood_exact: bool  # False: a bound or one sampled order
    # Decodes one token per forward from the left: τ is not one of its settings (one point
    # per sweep), it infills from the left context only, and its loss draws no noise.
    left_to_right: bool
    training_cost: int  # positions its loss runs per token (2: the clean and noisy streams)
    # The DiT of the tiny and LM1B/OWT recipes: time-conditioned (adaLN on sigma = 0) and/or
    # causal attention.
    dit: Mapping[str, bool]
    keep_clean_bos: bool  # the recipes' training chunks keep a clean BOS
    # Figure colours, light to dark with size: the first for the smallest published size (S
    # = d = 4), so that the paper's pairs (BD3LM-S with SetDLM-smax2S) share a shade.
    colours: tuple[str, ...]
    # Decoding knobs per context: the paper's tasks (gsm8k, cnndm, infill) and "bench" (the
    # suite's benchmarks and the tiny job); knob -> value, where a string names a size of the
    # model ("S", "d", "length") or one the caller gives ("mdlm_block").
    decoding: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def default_policy(self) -> PolicyInfo:
        return self.policies[0]

    def policy(self, name: str | None) -> PolicyInfo:
        """The policy ``name`` (None: the default); an error naming the ones it has."""
        if name is None:
            return self.default_policy
        for policy in self.policies:
            if policy.name == name:
                return policy
        known = ", ".join(p.name for p in self.policies)
        raise UnknownNameError(
            f"decoding policy {name!r} is not one of {self.title}'s ({known})"
            + (f"; {name} decodes {_users(name)}" if _users(name) else "")
        )

    @property
    def knobs(self) -> tuple[str, ...]:
        """Every decoding knob some policy of the family has."""
        return tuple(dict.fromkeys(k for p in self.policies for k in p.knobs))

    def colour(self, size: int | None) -> str:
        """The figure colour of the family's model of ``size`` (see ``colours``)."""
        if size is None or self.size is None:
            return self.colours[0]
        index = round(math.log2(size // self.size.multiple)) - 2  # S = d = 4 -> 0
        return self.colours[min(max(index, 0), len(self.colours) - 1)]

    def model_name(self, size: int | None = None) -> str:
        return self.name if self.size is None else f"{self.name}-{self.size.letter}{size}"

    def model_title(self, size: int | None) -> str:
        return self.title if self.size is None else self.size.title.format(size=size)

    def decoding_knobs(self, context: str, sizes: Mapping[str, int | None]) -> dict[str, Any]:
        """The knobs of ``context`` (a paper task, or "bench") with the sizes filled in (S, d,
        length, mdlm_block); {} where it sets none."""
        return {
            knob: sizes[value] if isinstance(value, str) else value
            for knob, value in self.decoding.get(context, {}).items()
        }


# ------------------------------------------------------------------------------ the policies
NEXT_TOKEN = PolicyInfo(
    name="next-token",
    path="setdlm.baselines.ar:NextTokenPolicy",
    knobs=(),
    exact_cache=True,
    summary="the next position; prompt and every token cached",
)
SEMI_AR = PolicyInfo(
    name="semi-ar",
    path="setdlm.baselines.mdlm:SemiAutoregressivePolicy",
    knobs=("block_size",),
    exact_cache=True,  # no cache: every step is a forward over the whole canvas
    summary="most confident masks of the current block, bidirectional forward over the "
    "canvas, no cache",
)
BLOCK_CACHE = PolicyInfo(
    name="block-cache",
    path="setdlm.baselines.bd3lm:BlockCachePolicy",
    knobs=("block_size", "fused_block_cache"),
    exact_cache=True,
    summary="most confident masks of the current block; a finished block is cached in the "
    "next block's first forward",
)
SLIDING_WINDOW = PolicyInfo(
    name="sliding-window",
    path="setdlm.model:SlidingWindowPolicy",
    knobs=("window", "infill_cache", "fht_cache_order"),
    exact_cache=True,
    summary="most confident masks in a window of W at the leftmost mask; every commit cached "
    "in the next step's forward",
)

# Fast-dLLM's dual cache (baselines/dual_cache.py): one policy name, a class per family.
DUAL_CACHE = (
    "a block's later steps feed the block (BD3LM: a sub-block) alone, on keys and values "
    "cached at its first forward (MDLM: the canvas outside it; BD3LM: the rest of the block)"
)
MASKED_DUAL_CACHE = PolicyInfo(
    name="dual-cache",
    path="setdlm.baselines.dual_cache:MaskedDualCachePolicy",
    knobs=("block_size",),
    exact_cache=False,
    summary=DUAL_CACHE,
)
BLOCK_DUAL_CACHE = PolicyInfo(
    name="dual-cache",
    path="setdlm.baselines.dual_cache:BlockDualCachePolicy",
    knobs=("block_size", "sub_block_size"),
    exact_cache=False,
    summary=DUAL_CACHE,
)

# The paper's knob values are those of its scripts (SPEC 5.1-5.4; setdlm/eval/paper_decoding.py
# says where each comes from).
FAMILIES: dict[str, FamilyInfo] = {
    info.name: info
    for info in (
        FamilyInfo(
            name="ar",
            title="AR",
            model_class="setdlm.baselines.ar:AR",
            size=None,
            settings=(),
            entry_knobs=(),
            schedule=None,
            policies=(NEXT_TOKEN,),
            likelihood="exact NLL",
            likelihood_exact=True,
            left_to_right=True,
            training_cost=1,
            dit={"adaln": False, "causal_attention": True},
            keep_clean_bos=False,
            colours=("black",),
        ),
        FamilyInfo(
            name="mdlm",
            title="MDLM",
            model_class="setdlm.baselines.mdlm:MDLM",
            size=None,
            settings=(),
            entry_knobs=(),
            schedule="linear",
            policies=(SEMI_AR, MASKED_DUAL_CACHE),
            likelihood="NELBO (upper bound on NLL), one t per sequence",
            likelihood_exact=False,
            left_to_right=False,
            training_cost=1,
            dit={"adaln": True, "causal_attention": False},
            keep_clean_bos=True,
            colours=("#41ab5d",),
            decoding={
                "gsm8k": {"block_size": "mdlm_block"},
                "cnndm": {"block_size": 32},
                "infill": {"block_size": "length"},  # one block: the whole sequence
                "bench": {"block_size": "mdlm_block"},  # semi-AR blocks, not one over L
            },
        ),
        FamilyInfo(
            name="bd3lm",
            title="BD3LM",
            model_class="setdlm.baselines.bd3lm:BD3LM",
            size=SizeRule(
                letter="s",
                symbol="S",
                setting="block_size",
                multiple=1,
                config_path=("block_size",),
                title="BD3LM S={size}",
            ),
            settings=("block_size",),
            entry_knobs=(),
            schedule="linear",
            policies=(BLOCK_CACHE, BLOCK_DUAL_CACHE),
            likelihood="NELBO (upper bound on NLL), one t per block",
            likelihood_exact=False,
            left_to_right=False,
            training_cost=2,
            dit={"adaln": True, "causal_attention": False},
            keep_clean_bos=True,
            colours=("#6baed6", "#2171b5", "#08306b"),
            decoding={
                "gsm8k": {"block_size": "S"},
                "cnndm": {"block_size": "S"},
                "infill": {"block_size": "S"},
            },
        ),
        FamilyInfo(
            name="setdlm",
            title="SetDLM",
            model_class="setdlm.model:SetDLM",
            size=SizeRule(
                letter="smax",
                symbol="M",
                setting="d",
                multiple=2,
                config_path=("schedule", "M"),
                title="SetDLM smax{size}",
            ),
            settings=("d", "window"),
            entry_knobs=("window",),
            schedule="staggered",
            policies=(SLIDING_WINDOW,),
            likelihood="NLL of one sampled staggered order (upper bound on NLL)",
            likelihood_exact=False,
            left_to_right=False,
            training_cost=2,
            dit={"adaln": False, "causal_attention": False},
            keep_clean_bos=True,
            colours=("#fc9272", "#ef3b2c", "#99000d"),
            decoding={
                "gsm8k": {"window": "d", "fht_cache_order": True},
                "cnndm": {"window": "d"},
                "infill": {"window": 32},
            },
        ),
    )
}
FAMILY_NAMES = tuple(FAMILIES)  # the order of tables, figures and command-line choices


def family(name: str) -> FamilyInfo:
    """The table row of family ``name``; an error naming the known families."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise UnknownNameError(
            f"family {name!r} is not one of {', '.join(FAMILY_NAMES)} (setdlm/families.py)"
        ) from None


def policy_names() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.name for f in FAMILIES.values() for p in f.policies))


def policy(name: str) -> PolicyInfo:
    """The decoding policy ``name``, whichever families decode with it."""
    for info in FAMILIES.values():
        for entry in info.policies:
            if entry.name == name:
                return entry
    raise UnknownNameError(f"decoding policy {name!r} is not one of {', '.join(policy_names())}")


def _users(policy_name: str) -> str:
    """The families that decode with ``policy_name``, in words ("MDLM and BD3LM")."""
    titles = [f.title for f in FAMILIES.values() if any(p.name == policy_name for p in f.policies)]
    return " and ".join(titles)


def with_knobs(decode, family_name: str, policy: str | None = None, **knobs):
    """``decode`` (a DecodeConfig) decoding with ``policy`` (None: the policy it already names,
    else the family's default) with these knobs set; a knob given as None is left as it is.
    Switching policy carries over the knobs both policies have (a decoding block stays the
    same block). A policy the family does not decode with, or a knob the policy does not have,
    is an error that names what there is."""
    info = family(family_name)
    current = decode.policy
    chosen = info.policy(policy or (None if current is None else current.name))
    knobs = {knob: value for knob, value in knobs.items() if value is not None}
    unknown = sorted(set(knobs) - set(chosen.knobs))
    if unknown:
        raise UnknownNameError(
            f"{info.title}'s {chosen.name} decoding has no {' or '.join(unknown)} "
            f"(its knobs: {', '.join(chosen.knobs) or 'none'})"
        )
    options = load(chosen.path).Options
    if isinstance(current, options):
        base = current
    else:
        shared = dataclasses.asdict(current) if current is not None else {}
        base = options(**{knob: v for knob, v in shared.items() if knob in chosen.knobs})
    chosen_options = dataclasses.replace(base, **knobs)
    if chosen is info.default_policy and chosen_options == options():
        chosen_options = None  # one form for "the default": DecodeConfig's policy=None
    return decode.replace(policy=chosen_options)


def build_model(config):
    """A model of ``config`` (a ModelConfig), with fresh weights: its family's class."""
    return load(family(config.family).model_class)(config)


def load(path: str):
    """The object a lazy ``"module:Class"`` path names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# ------------------------------------------------------------------------------ model names
def _name_pattern(info: FamilyInfo) -> str:
    if info.size is None:
        return f"(?P<{info.name}>{info.name})"
    prefix = f"{info.name}-{info.size.letter}"
    return f"(?P<{info.name}>{prefix}(?P<{info.name}_size>[1-9][0-9]*))"


# ``<family>[-<letter><size>][-<tag>]``: ar, mdlm, bd3lm-s4, setdlm-smax8, ar-arith. The tag
# tells two models of one family and size apart (``ar-arith``: trained on arithmetic).
MODEL_NAME = re.compile(
    "^(?:" + "|".join(map(_name_pattern, FAMILIES.values())) + ")(?:-(?P<tag>[a-z][a-z0-9]*))?$"
)


def without_group_names(pattern: str) -> str:
    """A regex with its named groups unnamed: for JSON schema and Snakemake, which do not
    take Python's ``(?P<name>...)``."""
    return re.sub(r"\(\?P<\w+>", "(?:", pattern)


# The same grammar without named groups: the workflow schema's model keys and Snakemake's
# {model} wildcard (unanchored).
MODEL_NAME_PATTERN = without_group_names(MODEL_NAME.pattern)
MODEL_WILDCARD = MODEL_NAME_PATTERN.removeprefix("^").removesuffix("$")
# "ar, mdlm, bd3lm-s<S>, setdlm-smax<M>": the grammar in words, for messages
MODEL_NAME_HELP = ", ".join(
    f"{f.name}-{f.size.letter}<{f.size.symbol}>" if f.size else f.name for f in FAMILIES.values()
)


def parse_model_name(name: str) -> tuple[str, int | None] | None:
    """(family, size) of a model name (size: S for BD3LM, smax M for SetDLM, None where the
    name carries none); None when ``name`` follows no family's grammar."""
    match = MODEL_NAME.fullmatch(name)  # not ``match``: "ar\n" would pass its ``$``
    if match is None:
        return None
    for info in FAMILIES.values():
        if match[info.name]:
            size = match[f"{info.name}_size"] if info.size else None
            return info.name, None if size is None else int(size)
    return None  # unreachable: one alternative matched


def config_size(info: FamilyInfo, model_config: Mapping) -> int | None:
    """The size a model's config (``ModelConfig.to_dict()``) holds for its name, or None."""
    if info.size is None:
        return None
    value: Any = model_config
    for key in info.size.config_path:
        value = (value or {}).get(key) if isinstance(value, Mapping) else None
    return value
