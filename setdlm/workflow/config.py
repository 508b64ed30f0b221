"""Workflow configurations: schema, defaults, and the checks a schema cannot express.

``validate(raw)`` returns the configuration with every default filled in, or raises one
``ConfigError`` listing every problem, each starting with the key it is about
(``tasks.gsm8k.thresholds[2]: ...``). It runs when the DAG is built, so a bad configuration
fails before any job is queued, and again in ``setdlm train`` for configurations given by hand.

Schema (workflows/config/schema.yaml): unknown keys, wrong types, values out of range.
Semantics (here): model names agree with their family and sizes; BD3LM's block size divides
the model length; SetDLM has d and W; published keys exist and match; every model a task
names is defined and has a checkpoint for the task's domain; τ is a confidence in (0, 1] or
1e6 ("no threshold"); overrides name the task's own models; the data a task needs has a source.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from setdlm.families import FAMILIES, MODEL_NAME_HELP, UnknownNameError, parse_model_name
from setdlm.families import family as family_info
from setdlm.results.layout import point_name
from setdlm.tasks import task as task_info
from setdlm.util import validation
from setdlm.util.errors import UserError
from setdlm.util.validation import (
    block_errors,
    budget_errors,
    expectation,
    knob_errors,
    warmup_errors,
)
from setdlm.workflow import datasets
from setdlm.workflow.destinations import destination_errors
from setdlm.workflow.references import reference_errors

# setdlm/workflows: the top-level workflows/ folder (a link in the checkout, package data in a
# wheel), so that an installed package finds its schema, checkpoint table and profiles.
WORKFLOW_DIR = Path(__file__).resolve().parents[1] / "workflows"
MODELS_PATH = WORKFLOW_DIR / "config" / "models.yaml"
# The TinySettings defaults the checks need (tests keep them equal to setdlm.recipes.tiny's;
# importing setdlm.recipes.tiny here would load torch every time the DAG is built).
TINY_DEFAULTS = {
    "length": 64,
    "hidden_size": 128,
    "n_heads": 4,
    "steps": 400,
    "warmup_steps": 20,
    "batch_size": 16,
    "corpus": "wikitext2",
}


class ConfigError(UserError, ValueError):
    def __init__(self, errors: list[str], source: str = ""):
        self.errors = errors
        where = f" ({source})" if source else ""
        lines = "\n".join(f"  - {error}" for error in errors)
        super().__init__(f"invalid workflow configuration{where}:\n{lines}")


class _StrictLoader(validation.SafeLoader):
    """YAML that refuses a key given twice in one mapping (PyYAML keeps the last silently: a
    second `tasks:` block or a repeated setting replaced the first without a word). Keys
    merged in with ``<<: *anchor`` may be overridden, as YAML intends."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                    key_node, yaml.ScalarNode
                ):
                    continue
                if key_node.value in seen:
                    first = seen[key_node.value]
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key_node.value!r} (first at line {first.line + 1}; "
                        "YAML would keep only the last: give each key once)",
                        key_node.start_mark,
                    )
                seen[key_node.value] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)


def check_files(paths) -> None:
    """Read each configuration file as ``load`` does (Snakemake reads them itself, keeping a
    duplicate key's last value): a ConfigError names the first that is not valid."""
    for path in paths:
        read_file(path)


def load(path: str | Path, check_data: bool = True) -> dict:
    """A configuration file, validated, with defaults."""
    return validate(read_file(path), source=str(path), check_data=check_data)


def read_file(path: str | Path) -> Any:
    """A configuration file's YAML, not yet validated; a ConfigError naming it otherwise."""
    try:
        raw = load_yaml(path)
    except OSError as error:
        raise ConfigError([f"cannot read it ({error.strerror or error})"], str(path)) from None
    except UnicodeDecodeError as error:  # saved in another encoding (Latin-1, UTF-16)
        raise ConfigError(
            [f"not UTF-8 text (byte {error.start}: {error.reason}); expected YAML saved as UTF-8"],
            str(path),
        ) from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(error, "problem", None) or error
        raise ConfigError([f"not valid YAML{line}: {problem}"], str(path)) from None
    return raw


def load_published(path: str | Path = MODELS_PATH) -> dict:
    """models.yaml: {"checkpoints": {key: settings}, "aliases": {alias: key}}, each key's
    ``revision`` the one the revisions table in effect pins (setdlm/checkpoints/zoo.py
    ``revisions_file``: the package's, which models.yaml shows, or a run's own)."""
    from setdlm.checkpoints.zoo import pinned_revisions

    published = load_yaml(path)
    pins = pinned_revisions()
    for key, entry in published["checkpoints"].items():
        entry["revision"] = pins.get(key)
    return published


def resolve_key(key: str, published: dict) -> dict | None:
    """The models.yaml entry of a key or alias, with its canonical key; None if unknown."""
    key = published["aliases"].get(key, key)
    entry = published["checkpoints"].get(key)
    return None if entry is None else {"key": key, **entry}


def digest(value: Any) -> str:
    """A short, stable hash of JSON-like data (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def validate(
    raw: Any,
    source: str = "",
    published: dict | None = None,
    environ: dict | None = None,
    check_data: bool = True,
) -> dict:
    raw = json.loads(json.dumps(raw))  # plain dicts and lists (Snakemake hands OrderedDicts)
    schema = copy.deepcopy(validation.schema())  # the rules the command line obeys too
    errors = schema_errors(raw, schema)
    if errors:
        raise ConfigError(errors, source)
    config = fill_defaults(copy.deepcopy(raw), schema, schema)
    errors = semantic_errors(
        config,
        published if published is not None else load_published(),
        os.environ if environ is None else environ,
        check_data,
    )
    errors = list(dict.fromkeys(errors))  # a shared setting can fail for several models
    if errors:
        raise ConfigError(errors, source)
    return config


# ---------------------------------------------------------------------------------- schema
def key_path(parts) -> str:
    """("tasks", "gsm8k", "thresholds", 2) -> "tasks.gsm8k.thresholds[2]"."""
    text = ""
    for part in parts:
        if isinstance(part, str) and not part.isprintable():
            part = repr(part)  # a key ending in a newline, shown as such
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def schema_errors(instance: Any, schema: dict) -> list[str]:
    errors = []
    for error in validation.validator_class()(schema).iter_errors(instance):
        path = list(error.absolute_path)
        if error.validator == "additionalProperties":
            known = error.schema.get("properties", {})
            for name in sorted(k for k in error.instance if k not in known):
                errors.append(f"{key_path([*path, name])}: unknown key")
        elif "propertyNames" in error.schema_path:  # the key itself is malformed
            errors.append(
                f"{key_path([*path, error.instance])}: not a model name ({MODEL_NAME_HELP})"
            )
        elif _is_value_rule(error.schema):  # a rule the command line shares: the same words
            message = f"{key_path(path)}: {error.instance!r} is not {expectation(error.schema)}"
            if _reads_as_number(error.instance):
                message += " (YAML reads 1e6 as text; write 1.0e+6)"
            errors.append(message)
        else:
            message = f"{key_path(path)}: {error.message}"
            if error.validator == "type" and _reads_as_number(error.instance):
                message += " (YAML reads 1e6 as text; write 1.0e+6)"
            errors.append(message)
    return sorted(set(errors))


def _is_value_rule(rule: dict) -> bool:
    """A rule on one scalar value (a number's range, a choice), described the same way as
    the command line describes it."""
    types = rule.get("type", [])
    types = {types} if isinstance(types, str) else set(types)
    return "x-expected" in rule or "enum" in rule or bool(types & {"integer", "number"})


def _reads_as_number(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def fill_defaults(value: Any, schema: dict, root: dict) -> Any:
    """Fill missing keys with the schema's ``default`` values, recursively."""
    schema = _resolved(schema, root)
    if not isinstance(value, dict):
        return value
    properties = schema.get("properties", {})
    for key, sub in properties.items():
        if key not in value:
            nodes = (sub, _resolved(sub, root))
            defaults = [node["default"] for node in nodes if "default" in node]
            if not defaults:
                continue
            value[key] = copy.deepcopy(defaults[0])
        value[key] = fill_defaults(value[key], sub, root)
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        for key in value:
            if key not in properties:
                value[key] = fill_defaults(value[key], additional, root)
    return value


def _resolved(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if not ref:
        return schema
    node = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


# ------------------------------------------------------------------------------- semantics
def semantic_errors(config: dict, published: dict, environ, check_data: bool = True) -> list[str]:
    errors = []
    for name, entry in config["models"].items():
        errors += _model_errors(name, entry, config, published)
    for task, settings in config["tasks"].items():
        errors += _task_errors(task, settings, config, published)
    trained = [name for name in used_models(config) if "train" in config["models"][name]]
    errors += reference_errors(config, trained)  # setdlm/workflow/references.py
    errors += destination_errors(config)  # setdlm/workflow/destinations.py
    if check_data:
        errors += _data_errors(config, environ)
    return errors


def train_settings(config: dict, name: str) -> dict:
    """A trained model's settings: the top-level ``train`` with the model's own on top, and a
    learning curve's budget, where it gives none, the one its arithmetic-solve points use."""
    settings = {**config["train"], **config["models"][name].get("train", {})}
    curve = settings.get("curve")
    budget = _solve_budget(config, name)
    if curve is not None and "max_new_tokens" not in curve and budget is not None:
        # Resolved here, before the plan hashes the settings: a curve that states the solve
        # budget and one that inherits it are the same training, and record the same curve.
        settings["curve"] = {**curve, "max_new_tokens": budget}
    return settings


def _solve_budget(config: dict, name: str) -> int | None:
    """The max_new_tokens of the arithmetic-solve task when it evaluates this model (None:
    it does not, or it sets none and ArithmeticSettings' default applies)."""
    solve = config.get("tasks", {}).get("arithmetic-solve") or {}
    if name not in solve.get("models", ()):
        return None
    return solve.get("max_new_tokens")


# Train-block keys that say how many models to train and what to record along the way, not
# how one model's weights come out (setdlm train hands the rest to TinySettings).
NOT_A_TRAINING_SETTING = ("seeds", "curve")


def model_seeds(config: dict, name: str) -> list[int] | None:
    """The seeds of a model trained once per seed (``train.seeds``), or None: one model, its
    folder models/<name>/ without a seed level (``train.seed``)."""
    entry = config["models"][name]
    if "train" not in entry:
        return None
    return train_settings(config, name).get("seeds")


def resolved_train_settings(config: dict, name: str) -> dict:
    """``train_settings`` with the TinySettings defaults the checks and the plan read."""
    return {**TINY_DEFAULTS, **train_settings(config, name)}


def train_corpus(config: dict, name: str) -> str:
    """What a model trained here learns from."""
    return resolved_train_settings(config, name)["corpus"]


def _model_errors(name: str, entry: dict, config: dict, published: dict) -> list[str]:
    where = f"models.{name}"
    family, size = parse_model_name(name)
    errors = []
    if entry["family"] != family:
        errors.append(f"{where}.family: {entry['family']!r}, but the name says {family}")
        return errors
    if ("train" in entry) == ("checkpoint" in entry):
        which = "both" if "train" in entry else "neither"
        errors.append(
            f"{where}: give either `train` (train it here) or `checkpoint` (published keys), "
            f"not {which}"
        )
    errors += _size_errors(where, family, size, entry)
    if errors:
        return errors
    if "train" in entry:
        settings = resolved_train_settings(config, name)
        origin = lambda key: f"{where}.train.{key}" if key in entry["train"] else f"train.{key}"  # noqa: E731
        errors += _length_errors(where, family, entry, settings["length"], origin("length"))
        if settings["hidden_size"] % settings["n_heads"]:
            errors.append(
                f"{origin('hidden_size')}: {settings['hidden_size']} is not divisible by "
                f"n_heads = {settings['n_heads']}"
            )
        if settings["warmup_steps"] > settings["steps"]:
            errors.append(
                f"{origin('warmup_steps')}: {settings['warmup_steps']} warm-up steps exceed "
                f"the {settings['steps']} training steps"
            )
        if "seed" in settings and "seeds" in settings:
            errors.append(
                f"{origin('seeds')}: give `seed` (one model) or `seeds` (one model per seed), "
                f"not both ({origin('seed')} is set too)"
            )
        if settings["corpus"] != "arithmetic":
            for key in ("curve", "generator", "problem_seed"):
                if key in settings:
                    errors.append(
                        f"{origin(key)}: only for arithmetic training (corpus: arithmetic), "
                        f"but the corpus is {settings['corpus']}"
                    )
    for domain, key in entry.get("checkpoint", {}).items():
        errors += _checkpoint_errors(f"{where}.checkpoint.{domain}", domain, key, entry, published)
    return errors


def _size_errors(where: str, family: str, size: int | None, entry: dict) -> list[str]:
    """The settings a family has (families.py ``settings``), and the size its name says."""
    info = family_info(family)
    errors = []
    for key in ("block_size", "d", "window"):
        if key in entry and key not in info.settings:
            holders = [f.title for f in FAMILIES.values() if key in f.settings]
            errors.append(
                f"{where}.{key}: only {' and '.join(holders)} has {SETTING_WORDS[key]}"
                + (
                    " (decoding blocks are set per task under tasks.<task>.overrides)"
                    if key == "block_size"
                    else ""
                )
            )
    for key in info.settings:
        if key not in entry:
            errors.append(f"{where}.{key}: {info.title} needs its {SETTING_WORDS[key]}")
    rule = info.size
    if rule is not None and not errors:
        value = entry[rule.setting]
        if size % rule.multiple:
            errors.append(
                f"{where}: {rule.letter}{size} is not a multiple of {rule.multiple}, but "
                f"{rule.symbol} = {rule.multiple} x {rule.setting}"
            )
        elif value * rule.multiple != size:
            errors.append(
                f"{where}.{rule.setting}: {info.title} needs {rule.setting} = "
                f"{size // rule.multiple} (the name says {rule.letter}{size}), got {value}"
            )
    return errors


# How messages name the model settings.
SETTING_WORDS = {
    "block_size": "a training block size S",
    "d": "a desired block size d (smax M = 2d)",
    "window": "a decoding window W (the paper uses W = d)",
}


def _length_errors(where: str, family: str, entry: dict, length: int, length_key: str):
    if "block_size" in entry and length % entry["block_size"]:
        return [
            f"{where}.block_size: S = {entry['block_size']} does not divide the model length "
            f"{length} ({length_key})"
        ]
    if "d" in entry and 2 * entry["d"] > length:
        return [f"{where}.d: smax 2d = {2 * entry['d']} exceeds the model length {length}"]
    if "window" in entry and entry["window"] > length:
        return [f"{where}.window: W = {entry['window']} exceeds the model length {length}"]
    return []


def _checkpoint_errors(where: str, domain: str, key: str, entry: dict, published: dict):
    spec = resolve_key(key, published)
    if spec is None:
        return [f"{where}: unknown checkpoint key {key!r} (see workflows/config/models.yaml)"]
    errors = []
    if spec["task"] != domain:
        errors.append(f"{where}: {key} is a {spec['task']} checkpoint, not a {domain} one")
    if spec["family"] != entry["family"]:
        errors.append(f"{where}: {key} is a {spec['family']} model, not {entry['family']}")
    else:
        for setting in ("block_size", "d"):  # the published table's sizes (models.yaml)
            if setting in entry and spec[setting] != entry[setting]:
                errors.append(
                    f"{where}: {key} has {setting} = {spec[setting]}, not {entry[setting]}"
                )
    return errors or _length_errors(where, entry["family"], entry, spec["length"], key)


def model_length(config: dict, published: dict, name: str, task: str) -> int:
    """The length of the model a task uses (its published checkpoint's, or the trained one's)."""
    entry = config["models"][name]
    if "train" in entry:
        return resolved_train_settings(config, name)["length"]
    return resolve_key(entry["checkpoint"][task_info(task).domain], published)["length"]


def _task_errors(task: str, settings: dict, config: dict, published: dict) -> list[str]:
    where = f"tasks.{task}"
    models = config["models"]
    domain = task_info(task).domain
    errors = []
    for index, name in enumerate(settings["models"]):
        if name not in models:
            errors.append(f"{where}.models[{index}]: {name!r} is not defined under `models`")
        elif reads_arithmetic(task) and "train" in models[name]:
            corpus = train_corpus(config, name)
            if corpus != "arithmetic":
                errors.append(
                    f"{where}.models[{index}]: {name!r} is trained on {corpus}, but {task} "
                    "needs a model trained on the arithmetic problems "
                    "(models.<name>.train.corpus: arithmetic)"
                )
            else:
                errors += _generator_errors(where, task, settings, name, config)
        elif "checkpoint" in models[name] and domain not in models[name]["checkpoint"]:
            errors.append(
                f"models.{name}.checkpoint: no {domain!r} checkpoint, which {where} needs"
            )
    if task_info(task).decoding:
        errors += _threshold_errors(f"{where}.thresholds", settings["thresholds"])
        errors += warmup_errors(
            settings["warmup"], settings.get("limit"), f"{where}.warmup", f"{where}.limit"
        )
        if settings.get("max_new_tokens") is not None and not errors:
            for name in settings["models"]:
                if _has_checkpoint_for(models.get(name), task):
                    length = model_length(config, published, name, task)
                    errors += budget_errors(
                        settings["max_new_tokens"], length, f"{where}.max_new_tokens ({name})"
                    )
        for name in settings["models"]:
            if _has_checkpoint_for(models.get(name), task):
                errors += _policy_errors(task, settings, name, models[name]["family"])
        for name, override in settings["overrides"].items():
            errors += _override_errors(name, override, task, config, published)
        sharded = [(f"{where}.shards", settings.get("shards", 1))]
        sharded += [
            (f"{where}.overrides.{name}.shards", override["shards"])
            for name, override in settings["overrides"].items()
            if "shards" in override
        ]
        for key, shards in sharded:
            if shards > 1 and settings.get("jobs") != "point":
                errors.append(
                    f"{key}: {shards} shards split one point over several jobs, which needs "
                    f"`jobs: point` (it is {settings.get('jobs')!r}: a job over several points)"
                )
    if "evaluator" in settings:  # unconditional's and arithmetic-unconditional's
        errors += _evaluator_errors(f"{where}.evaluator", settings["evaluator"], models)
    if "reject" in settings:
        errors += _reject_errors(where, settings)
    return errors


def _reject_errors(where: str, settings: dict) -> list[str]:
    """A rejection rule no sample of the budget can pass: every sample would be generated
    ``attempts`` times and its last try kept anyway (n tokens hold at most ln n nats of
    unigram entropy, and a sample of at most ``length`` tokens is rejected)."""
    import math

    budget, reject = settings.get("max_new_tokens"), settings["reject"]
    if budget is None or reject["attempts"] <= 1:
        return []
    errors = []
    if budget <= reject["length"]:
        errors.append(
            f"{where}.reject.length: {reject['length']} rejects every sample of at most "
            f"max_new_tokens = {budget} tokens; lower it below the budget (0: off)"
        )
    if reject["entropy"] > math.log(budget):
        errors.append(
            f"{where}.reject.entropy: {reject['entropy']} nats is more than {budget} tokens can "
            f"hold (ln {budget} = {math.log(budget):.2f}), so every sample is rejected; lower "
            "it (0: off)"
        )
    return errors


def _generator_errors(where: str, task: str, settings: dict, name: str, config: dict):
    """An arithmetic task judges a model with the grammar it was trained on: the problems it
    solves, scores or is told are novel come from the task's generator (arithmetic-
    unconditional names it as its ``references``), so a model trained on another version
    would be measured on problems it never learned the shape of."""
    from setdlm.tasks.arithmetic import GENERATOR_VERSION  # no torch: the grammars only

    key = "references" if "references" in settings else "generator"
    trained = train_settings(config, name).get("generator", GENERATOR_VERSION)
    if settings[key] == trained:
        return []
    return [
        f"{where}.{key}: {settings[key]!r}, but {name!r} is trained on {trained!r} problems "
        f"(models.{name}.train.generator); {task} must judge a model with its own generator"
    ]


def _threshold_errors(where: str, thresholds: list[float]) -> list[str]:
    """Two τ that name one result folder (each τ's range is the schema's)."""
    errors, seen = [], {}
    for index, tau in enumerate(thresholds):
        if point_name(tau) in seen:
            errors.append(
                f"{where}[{index}]: τ = {tau} gives the same result folder "
                f"{point_name(tau)} as {where}[{seen[point_name(tau)]}]"
            )
        seen.setdefault(point_name(tau), index)
    return errors


def model_policies(settings: dict, name: str, family: str) -> list[str | None]:
    """The decoding policies a task's model decodes with (its override's, else the task's), as
    its point folders name them: None for the family's own policy (``tau-<τ>``), else the
    policy's name (``<policy>-tau-<τ>``)."""
    own = family_info(family).default_policy.name
    override = settings.get("overrides", {}).get(name, {})
    names = override.get("policies") or settings.get("policies") or ["default"]
    return [None if policy in ("default", own) else policy for policy in names]


def _policy_errors(task: str, settings: dict, name: str, family: str) -> list[str]:
    """Policies the model's family does not decode with, or its own named twice."""
    override = settings["overrides"].get(name, {})
    where = (
        f"tasks.{task}.overrides.{name}.policies"
        if "policies" in override
        else (f"tasks.{task}.policies")
    )
    info = family_info(family)
    errors = []
    for policy in override.get("policies") or settings["policies"]:
        if policy == "default":
            continue
        try:
            info.policy(policy)
        except UnknownNameError as error:
            errors.append(
                f"{where}: {error} ({name} is {family}; give {name} its own list "
                f"under tasks.{task}.overrides.{name}.policies)"
            )
    resolved = model_policies(settings, name, family)
    if len(set(resolved)) != len(resolved):
        errors.append(
            f"{where}: names {name}'s own policy ({info.default_policy.name}) twice ('default' "
            "is that policy)"
        )
    return errors


def _has_checkpoint_for(entry: dict | None, task: str) -> bool:
    """Whether a model entry gives a model for this task (trained here, or a checkpoint of
    the task's domain); the other cases are reported with the task's model list."""
    if entry is None:
        return False
    return "train" in entry or task_info(task).domain in entry.get("checkpoint", {})


def _override_errors(name: str, override: dict, task: str, config: dict, published: dict):
    where = f"tasks.{task}.overrides.{name}"
    if name not in config["tasks"][task]["models"]:
        return [f"{where}: {name!r} is not one of tasks.{task}.models"]
    entry = config["models"].get(name)
    if not _has_checkpoint_for(entry, task):
        return []  # reported with the models list
    family = entry["family"]
    errors = _threshold_errors(f"{where}.thresholds", override.get("thresholds", []))
    knobs = {knob: override.get(knob) for knob in ("window", "block_size")}
    for policy in model_policies(config["tasks"][task], name, family):
        errors += knob_errors(family, knobs, where + ".{knob}", name, policy)
    errors = list(dict.fromkeys(errors))
    if "block_size" in override and not errors:
        length = model_length(config, published, name, task)
        errors += block_errors(override["block_size"], length, f"{where}.block_size")
    return errors


def _evaluator_errors(where: str, evaluator, models: dict) -> list[str]:
    if not isinstance(evaluator, dict):
        return []
    name = evaluator["model"]
    if name not in models:
        return [f"{where}.model: {name!r} is not defined under `models`"]
    if "train" not in models[name] or not family_info(models[name]["family"]).left_to_right:
        return [
            f"{where}.model: {name!r} must be an AR model trained by this workflow "
            f"(gen-PPL scores text with a causal model folder)"
        ]
    return []


# ------------------------------------------------------------------------------------ data
def used_models(config: dict) -> list[str]:
    """Models some task evaluates (or scores with), in definition order."""
    used = set()
    for settings in config["tasks"].values():
        used.update(settings["models"])
        evaluator = settings.get("evaluator")
        if isinstance(evaluator, dict):
            used.add(evaluator["model"])
    return [name for name in config["models"] if name in used]


def reads_arithmetic(task: str) -> bool:
    """Whether a task evaluates on the synthetic arithmetic problems (generated by code, for
    models trained on them): the arithmetic-* tasks, and likelihood-arithmetic."""
    return task_info(task).trained_here


def task_dataset(task: str, settings: dict) -> str | None:
    """The dataset a task reads (None: none to prepare): its row's (setdlm/tasks/__init__.py), or
    the one its setting names (unconditional's references: owt or wikitext2)."""
    info = task_info(task)
    if info.dataset_setting is None:
        return info.dataset
    data = settings[info.dataset_setting]
    return {"owt": "openwebtext"}.get(data, data)


def datasets_needed(config: dict) -> dict[str, str]:
    """Dataset name -> the first key that needs it (trained models read WikiText-2)."""
    needed: dict[str, str] = {}
    for task, settings in config["tasks"].items():
        if task_dataset(task, settings) is not None:
            needed.setdefault(task_dataset(task, settings), f"tasks.{task}")
    for name in used_models(config):
        if "train" in config["models"][name] and train_corpus(config, name) == "wikitext2":
            needed.setdefault("wikitext2", f"models.{name}.train")
    return needed


def data_dir(config: dict, environ=os.environ) -> Path | None:
    """The directory ``dir`` sources copy from: data.dir, else $SETDLM_DATA_DIR."""
    value = config["data"]["dir"] or environ.get("SETDLM_DATA_DIR")
    return Path(value).expanduser().resolve() if value else None


def _data_errors(config: dict, environ) -> list[str]:
    errors = []
    root = data_dir(config, environ)
    for name, why in datasets_needed(config).items():
        if config["data"]["sources"][name] != "dir":
            continue
        if root is None:
            errors.append(
                f"data.dir: not set and SETDLM_DATA_DIR is unset, but data.sources.{name} = dir "
                f"(needed by {why})"
            )
        elif datasets.source_file(name, root) is None:
            folder = root / datasets.DATASETS[name].folder
            errors.append(
                f"data.sources.{name}: {folder} holds none of "
                f"{list(datasets.DATASETS[name].files)} (needed by {why})"
            )
    return errors
