"""The published checkpoints: compact keys, Hub ids, and every setting loading needs.

The official loader guesses several settings from a checkpoint's *name* (SPEC 7.3-7.4): the
SetDLM staggered schedule (d from ``smaxN``, M = min(2d, N)), ``keep_clean_bos`` (forced on for
SetDLM), the first-hitting-time cache order of the GSM8K runs, the tokenizer and its mask
token. Here they are written down once, per checkpoint, so nothing is parsed from names at
load time. Keys look like ``gsm8k:setdlm-smax8``, ``cnndm:bd3lm-s16``, ``owt:ar``; ``dN`` is
an alias of ``smax2N``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from setdlm.hub import hub_offline
from setdlm.paths import DataNotFoundError

ORG = "kuleshov-group"
# What each task's checkpoints were trained with (SPEC 4): model length, tokenizer, mask token,
# the MDLM decoding block of the paper's scripts, and whether chunks start with a kept BOS.
TASKS = {
    "gsm8k": dict(
        length=1024,
        tokenizer="Qwen/Qwen3-1.7B-Base",
        mask_token="<|fim_middle|>",
        mdlm_block=32,
        keep_clean_bos=False,
    ),
    "cnndm": dict(
        length=768,
        tokenizer="Qwen/Qwen3-0.6B-Base",
        mask_token="<|fim_middle|>",
        mdlm_block=32,
        keep_clean_bos=False,
    ),
    "owt": dict(
        length=1024,
        tokenizer="gpt2",
        mask_token="<|fim_middle|>",
        mdlm_block=1024,
        keep_clean_bos=True,
    ),
    "lm1b": dict(
        length=128,
        tokenizer="bert-base-uncased",
        mask_token="[MASK]",
        mdlm_block=128,
        keep_clean_bos=True,
    ),
}
SIZES = (4, 8, 16)  # BD3LM block sizes S; SetDLM d = S, smax = 2S


@dataclass(frozen=True)
class PublishedModel:
    key: str
    hub_id: str
    task: str
    family: str
    length: int
    tokenizer: str  # Hub id of the tokenizer the model was trained with
    mask_token: str
    keep_clean_bos: bool
    block_size: int | None = None  # BD3LM S
    d: int | None = None  # SetDLM desired block size; M = min(2d, N), N = the model length
    window: int | None = None  # SetDLM decoding window W of the paper's scripts (= d)
    fht_cache_order: bool = False  # the GSM8K accuracy runs set it
    mdlm_block: int | None = None  # MDLM decoding block of the paper's scripts
    revision: str | None = None  # pinned Hub commit; None where it is not known
    loadable: bool = True
    note: str = ""


def _published() -> dict[str, PublishedModel]:
    models = {}
    for task, settings in TASKS.items():
        common = dict(
            task=task,
            length=settings["length"],
            tokenizer=settings["tokenizer"],
            mask_token=settings["mask_token"],
        )
        legacy = task == "owt"  # OWT AR and MDLM come from another codebase (Lightning .ckpt)
        note = (
            "legacy Lightning checkpoint (DITLegacy backbone); not loadable yet" if legacy else ""
        )
        models[f"{task}:ar"] = PublishedModel(
            key=f"{task}:ar",
            hub_id=f"{ORG}/{task}-ar",
            family="ar",
            keep_clean_bos=False,
            loadable=not legacy,
            note=note,
            **common,
        )
        models[f"{task}:mdlm"] = PublishedModel(
            key=f"{task}:mdlm",
            hub_id=f"{ORG}/{task}-mdlm",
            family="mdlm",
            keep_clean_bos=settings["keep_clean_bos"],
            mdlm_block=settings["mdlm_block"],
            loadable=not legacy,
            note=note,
            **common,
        )
        for size in SIZES:
            models[f"{task}:bd3lm-s{size}"] = PublishedModel(
                key=f"{task}:bd3lm-s{size}",
                hub_id=f"{ORG}/{task}-bd3lm-s{size}",
                family="bd3lm",
                keep_clean_bos=settings["keep_clean_bos"],
                block_size=size,
                **common,
            )
            # GSM8K's SetDLM ids put the family first (SPEC 7.1).
            name = (
                f"setdlm-{task}-smax{2 * size}"
                if task == "gsm8k"
                else f"{task}-setdlm-smax{2 * size}"
            )
            models[f"{task}:setdlm-smax{2 * size}"] = PublishedModel(
                key=f"{task}:setdlm-smax{2 * size}",
                hub_id=f"{ORG}/{name}",
                family="setdlm",
                keep_clean_bos=True,  # the official loader forces it for every SetDLM
                d=size,
                window=size,
                fht_cache_order=task == "gsm8k",
                **common,
            )
    return models


class Loaded(NamedTuple):
    model: Any  # a Family, in eval mode
    spec: PublishedModel | None  # the table entry, None for a folder or an unknown Hub id
    folder: Path  # where the checkpoint files are (tokenizer files too, when shipped)


PUBLISHED = _published()
BY_HUB_ID = {model.hub_id: model for model in PUBLISHED.values()}
_ALIAS = re.compile(r"^(?P<task>\w+):setdlm-d(?P<d>\d+)$")


def resolve(name: str) -> PublishedModel | None:
    """The published model a key, alias or Hub id names (None if it names none)."""
    match = _ALIAS.match(name)
    if match:
        name = f"{match['task']}:setdlm-smax{2 * int(match['d'])}"
    return PUBLISHED.get(name) or BY_HUB_ID.get(name)


def load_pretrained(name: str, revision: str | None = None) -> Loaded:
    """A model from a local folder, a compact key, or a Hub id.

    Hub checkpoints are fetched with ``huggingface_hub`` (config, weights and tokenizer files
    only; never code). The table's settings then replace what the official loader would guess
    from the name.
    """
    from setdlm.checkpoints import CheckpointError, load_model

    folder = Path(name).expanduser()
    if folder.is_dir():
        return Loaded(load_model(folder), None, folder)
    if name.startswith((".", "/", "~")):
        raise CheckpointError(f"{name}: no such model folder")
    spec = resolve(name)
    if spec is None and name.count("/") != 1:
        raise CheckpointError(
            f"{name!r} is not a folder, a known key ({', '.join(sorted(PUBLISHED)[:4])}, ...; "
            f"see `setdlm models`) or a Hub id of the form org/name"
        )
    if spec is not None and not spec.loadable:
        raise CheckpointError(f"{spec.key} ({spec.hub_id}): {spec.note}")
    repo_id = spec.hub_id if spec else name
    folder = Path(_download(repo_id, revision or (spec.revision if spec else None)))
    model = load_model(folder)
    if spec is not None:
        model = apply_published_settings(model, spec)
    return Loaded(model, spec, folder)


def load_tokenizer_for(loaded: Loaded):
    """The checkpoint's own tokenizer files, else the tokenizer its table entry names."""
    from setdlm.data.tokenizers import load_tokenizer

    if any(
        (loaded.folder / name).exists() for name in ("tokenizer.json", "vocab.json", "vocab.txt")
    ):
        return load_tokenizer(loaded.folder)
    if loaded.spec is None:
        raise DataNotFoundError(
            f"{loaded.folder} ships no tokenizer; pass one with --tokenizer FOLDER_OR_HUB_ID"
        )
    return load_tokenizer(loaded.spec.tokenizer)


def _download(repo_id: str, revision: str | None) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    from setdlm.checkpoints import CheckpointError

    patterns = ["*.json", "*.safetensors", "pytorch_model.bin", "*.txt", "*.model", "*/config.json"]
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
    except (HFValidationError, HfHubHTTPError, LocalEntryNotFoundError) as error:
        where = "not in the local cache and the Hub is offline" if hub_offline() else str(error)
        raise CheckpointError(
            f"{repo_id}: cannot get it from the Hugging Face Hub ({where.splitlines()[0]}); "
            "give a model folder instead"
        ) from None


def apply_published_settings(model, spec: PublishedModel):
    """Give ``model`` the table's schedule and keep_clean_bos (no parameter depends on them)."""
    from setdlm.core.schedules import StaggeredSchedule

    config = model.config
    if config.family != spec.family:
        raise ValueError(
            f"{spec.key}: the checkpoint holds a {config.family} model, the table says "
            f"{spec.family}"
        )
    changes = {"keep_clean_bos": spec.keep_clean_bos}
    if spec.family == "setdlm":
        # N is the checkpoint's own length; M = min(2d, N) (the schedule-version trap, SPEC 1.2)
        changes["schedule"] = StaggeredSchedule.from_sizes(N=config.length, d=spec.d)
    model.config = dataclasses.replace(config, **changes)
    return model
