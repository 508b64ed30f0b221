"""The shipped configurations as the tests use them.

The default (workflows/config/tiny.yaml) measures the arithmetic models only; GSM8K,
CNN/DailyMail and ROCStories infilling (tiny models score 0 on them) and the WikiText-2 tasks
stay tasks of the suite, so the configuration tests check them on the WikiText-2 models of
tiny-wikitext2.yaml, beside the default's arithmetic ones, with these settings.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from snakemake.utils import update_config

TINY_PATH = Path(__file__).resolve().parents[1] / "workflows" / "config" / "tiny.yaml"
QUICK_PATH = TINY_PATH.with_name("tiny-quick.yaml")
WIKITEXT_PATH = TINY_PATH.with_name("tiny-wikitext2.yaml")
WIKITEXT_MODELS = ["ar", "mdlm", "bd3lm-s4", "setdlm-smax8"]
PAPER_TASKS = {
    "gsm8k": {
        "models": WIKITEXT_MODELS,
        "limit": 3,
        "max_new_tokens": 24,
        "thresholds": [1e6, 0.9, 0.5],
        "overrides": {"ar": {"thresholds": [1e6]}, "mdlm": {"thresholds": [1e6], "block_size": 8}},
    },
    "cnndm": {"models": WIKITEXT_MODELS, "limit": 3},
    "infill-1": {"models": WIKITEXT_MODELS, "limit": 3, "skip_too_long": True},
    "infill-3": {"models": WIKITEXT_MODELS, "limit": 3, "skip_too_long": True},
}
PAPER_SOURCES = {"gsm8k": "dir", "cnn_dailymail": "dir", "rocstories": "dir"}


def tiny_config() -> dict:
    """workflows/config/tiny.yaml as loaded."""
    return yaml.safe_load(TINY_PATH.read_text())


def tiny_quick_config() -> dict:
    """tiny.yaml with its quick overlay."""
    return tiny_with_overlay(QUICK_PATH)


def tiny_with_overlay(path: Path) -> dict:
    """tiny.yaml with the overlay at ``path``, merged key by key as Snakemake merges two
    --configfile: each into an empty config in turn, so that tiny.yaml's YAML aliases (one
    `train` block for several models) are copied, not changed through one model."""
    config: dict = {}
    update_config(config, tiny_config())
    update_config(config, yaml.safe_load(path.read_text()))
    return config


def tiny_wikitext_config() -> dict:
    """workflows/config/tiny-wikitext2.yaml as loaded."""
    return yaml.safe_load(WIKITEXT_PATH.read_text())


def tiny_with_paper_tasks() -> dict:
    """The default's arithmetic models and tasks with tiny-wikitext2.yaml's WikiText-2 models
    and tasks, and GSM8K, CNN/DailyMail and both infilling tasks on those: every task at once."""
    config, wikitext = tiny_config(), tiny_wikitext_config()
    config["models"] = {**wikitext["models"], **config["models"]}
    config["train"] = wikitext["train"]
    config["tasks"] = {**copy.deepcopy(PAPER_TASKS), **wikitext["tasks"], **config["tasks"]}
    config["data"] = {"sources": {**wikitext["data"]["sources"], **PAPER_SOURCES}}
    return config
