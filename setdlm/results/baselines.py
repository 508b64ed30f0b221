"""The committed baselines' formats, as JSON schemas, and the one loader that checks them.

``results/baselines/`` holds four files, each read by one check:

- ``tiny.json`` (``setdlm check``): per result point, per metric, a value and its tolerances;
- ``decoding.json`` (``setdlm check-decoding``): per point, the tokens' digests, the scores,
  the accuracy and the counted speed, with the tolerances of the comparison;
- ``training.json`` (``setdlm check-training``): per model and metric, the reference seeds'
  mean, spread and tolerance;
- ``engine_speed.json`` (``setdlm check-speed``): per family and τ, the engine's time per
  backbone time, and the factor a run may exceed it by.

A check reads its baseline before it measures anything, so a file of the wrong shape is
refused at once, naming the file, the key, what is there and what was expected, instead of a
KeyError or TypeError minutes later, or worse, a check that passes without checking (a point
whose counted speed was removed, a tolerance that lets everything through or nothing).
Impossible tolerances are malformed: a negative one, an agreement above 100 %, a speed factor
below 1 (which every run would fail).
"""

from __future__ import annotations

from pathlib import Path

from setdlm.util.validation import validator_class

NUMBER = {"type": "number"}
NOT_NEGATIVE = {"type": "number", "minimum": 0}
FRACTION = {"type": "number", "minimum": 0, "maximum": 1}
COUNT = {"type": "integer", "minimum": 0}
TOLERANCE = NOT_NEGATIVE

# setdlm check (setdlm/report/check.py; its own loader checks the rules across keys).
CHECK = {
    "type": "object",
    "required": ["format", "points"],
    "properties": {
        "format": {"const": 1},
        "points": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "metrics": {"type": "object", "additionalProperties": {"type": "object"}},
                    "config_hash": {"type": "string"},
                },
            },
        },
    },
}

# setdlm check-decoding (setdlm/report/decoding_check.py)
COUNTED_SPEED = ("generated_tokens", "nfe_mean", "parallelism_mean", "tokens_per_forward_mean")
DECODING = {
    "type": "object",
    "required": ["format", "points"],
    "properties": {
        "format": {"const": 2},
        "tolerances": {
            "type": "object",
            "required": ["accuracy", "counted_speed", "min_agreement"],
            "properties": {
                "accuracy": FRACTION,  # in points of a fraction: 0.02 is 2 points
                "counted_speed": TOLERANCE,  # relative
                "min_agreement": FRACTION,
            },
        },
        "settings": {
            "type": "object",
            "properties": {"batch_size": {"type": "integer", "minimum": 1, "maximum": 4096}},
        },
        "points": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "required": ["accuracy", "counted", "outputs", "scores"],
                "properties": {
                    "accuracy": FRACTION,
                    "counted": {
                        "type": "object",
                        "required": list(COUNTED_SPEED),
                        "additionalProperties": NOT_NEGATIVE,
                    },
                    "outputs": {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": {"type": "string"},
                    },
                    "scores": {"type": "object", "additionalProperties": FRACTION},
                },
            },
        },
    },
}

# setdlm check-training (setdlm/report/training_check.py)
TRAINING = {
    "type": "object",
    "required": ["format", "models"],
    "properties": {
        "format": {"const": 2},
        "models": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "required": ["mean", "std", "std_floor", "tolerance"],
                    "properties": {
                        "mean": NUMBER,
                        "std": NOT_NEGATIVE,
                        "std_floor": NOT_NEGATIVE,
                        "tolerance": TOLERANCE,
                        "problems": {"type": "integer", "minimum": 1},
                        "seeds": {"type": "object", "additionalProperties": NUMBER},
                    },
                },
            },
        },
    },
}

# setdlm check-speed (setdlm/report/speed_check.py)
ENGINE_SPEED = {
    "type": "object",
    "required": ["format", "host_per_forward"],
    "properties": {
        "format": {"const": 1},
        # a run may take up to this factor times the reference: below 1 every run fails
        "factor": {"type": "number", "minimum": 1},
        "host_per_forward": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "number", "exclusiveMinimum": 0},
        },
    },
}


def check_baseline(path: Path, baseline, schema: dict, error) -> dict:
    """``baseline`` (read from ``path``) when it has ``schema``'s shape; else ``error`` naming
    the file, the key, what is there and what was expected."""
    found = sorted(
        validator_class()(schema).iter_errors(baseline),
        key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))),
    )
    if found:
        first = found[0]
        where = _key_path(first.absolute_path)
        raise error(f"{path}: {where}: {_describe(first)} (a baseline the check cannot use)")
    if schema is DECODING:
        _decoding_semantics(path, baseline, error)
    return baseline


def _describe(error) -> str:
    """jsonschema's words, with what is required or allowed spelled out."""
    rule, value = error.validator, error.validator_value
    if rule == "required":
        return f"{error.message}; expected the keys {', '.join(map(repr, value))}"
    if rule == "const":
        return f"{error.instance!r}, expected {value!r}"
    return error.message


def _key_path(parts) -> str:
    from setdlm.workflow.config import key_path  # the configurations' spelling of a key

    return key_path(list(parts))


def _decoding_semantics(path: Path, baseline: dict, error) -> None:
    """Every decoded example has a score (the accuracy over any subset reads them)."""
    for key, point in baseline["points"].items():
        missing = sorted(set(point["outputs"]) - set(point["scores"]))
        if missing:
            raise error(
                f"{path}: points.{key}.scores: no score for {missing[0]} "
                f"({len(missing)} of the {len(point['outputs'])} outputs have none); expected "
                "one per output (a baseline the check cannot use)"
            )
