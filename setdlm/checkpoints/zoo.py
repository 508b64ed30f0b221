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
import json
import os
import re
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from setdlm.util.errors import DataError
from setdlm.util.hub import hub_network_errors, hub_offline
from setdlm.util.paths import DataNotFoundError

ORG = "kuleshov-group"
# The Hub commit each published checkpoint is pinned to, by key (written by
# ``setdlm models --pin``, which needs a machine that reaches the Hub; an unpinned key loads
# the repository's main branch, and the commit it resolved to is recorded with every result).
REVISIONS_FILE = Path(__file__).with_name("published_revisions.json")
# A revisions table that replaces REVISIONS_FILE for a run (a rehearsal's pins of the commits its
# local cache holds): an environment variable, so that it reaches every process of a run (the
# workflow sets it from its configuration's `revisions` key; see revisions_file).
REVISIONS_ENV = "SETDLM_REVISIONS_FILE"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
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
# The families the mdlm/bd3lms codebase published as Lightning files: the OWT AR and MDLM.
LEGACY_FAMILIES = ("ar", "mdlm")


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

    def decode_knobs(self) -> dict:
        """The decoding knobs of the paper's scripts for this checkpoint (W, MDLM's block, the
        first-hitting cache order), named as its family's default policy names them."""
        from setdlm.families import family

        values = {
            "window": self.window,
            "block_size": self.mdlm_block,
            "fht_cache_order": self.fht_cache_order or None,
        }
        knobs = family(self.family).default_policy.knobs
        return {knob: value for knob, value in values.items() if knob in knobs and value}


class RevisionsFileError(DataError):
    """The published-revisions file is not what ``setdlm models --pin`` writes."""


REVISIONS_EXPECTED = (
    'expected {"<key>": "<40-hex-digit commit>", ...} as `setdlm models --pin` writes it '
    "(or no file: every key unpinned)"
)


def revisions_file() -> Path:
    """The revisions table in effect: ``$SETDLM_REVISIONS_FILE`` if set, else the package's."""
    named = os.environ.get(REVISIONS_ENV)
    return Path(named).expanduser() if named else REVISIONS_FILE


def pinned_revisions(path: Path | None = None) -> dict[str, str]:
    """key -> pinned Hub commit, from ``path`` (default ``revisions_file()``; checked: 40 hex
    digits each)."""
    path = revisions_file() if path is None else Path(path)
    if not path.exists():
        if path != REVISIONS_FILE:  # a named table that is not there is a typo, not "no pins"
            raise RevisionsFileError(f"{REVISIONS_ENV}={path}: no such file; {REVISIONS_EXPECTED}")
        return {}
    try:
        pins = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not even UTF-8 text
        raise RevisionsFileError(
            f"{path}: not valid JSON ({error}); {REVISIONS_EXPECTED}"
        ) from None
    if not isinstance(pins, dict):
        raise RevisionsFileError(f"{path}: a JSON {type(pins).__name__}; {REVISIONS_EXPECTED}")
    bad = {key: value for key, value in pins.items() if not COMMIT.match(str(value))}
    if bad:
        raise RevisionsFileError(f"{path}: not 40-hex-digit commits: {bad}; {REVISIONS_EXPECTED}")
    return pins


def _published() -> dict[str, PublishedModel]:
    models = {}
    for task, settings in TASKS.items():
        common = dict(
            task=task,
            length=settings["length"],
            tokenizer=settings["tokenizer"],
            mask_token=settings["mask_token"],
        )
        # OWT AR and MDLM come from the mdlm/bd3lms codebase (a DITLegacy backbone: our DiT's
        # modules and names; the official runs it under bf16 autocast, we in float32)
        legacy = task == "owt"
        note = (
            "legacy DiT (DITLegacy); float32 here, bf16 autocast in the official" if legacy else ""
        )
        models[f"{task}:ar"] = PublishedModel(
            key=f"{task}:ar",
            hub_id=f"{ORG}/{task}-ar",
            family="ar",
            keep_clean_bos=False,
            note=note,
            **common,
        )
        models[f"{task}:mdlm"] = PublishedModel(
            key=f"{task}:mdlm",
            hub_id=f"{ORG}/{task}-mdlm",
            family="mdlm",
            keep_clean_bos=settings["keep_clean_bos"],
            mdlm_block=settings["mdlm_block"],
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
    pins = pinned_revisions()
    unknown = sorted(set(pins) - set(models))
    if unknown:
        raise RevisionsFileError(
            f"{revisions_file()}: unknown keys {unknown} (the published ones: `setdlm models`); "
            f"{REVISIONS_EXPECTED}"
        )
    return {key: dataclasses.replace(m, revision=pins.get(key)) for key, m in models.items()}


class PublishedTable(MutableMapping):
    """The published table, built when first used: built at import, a malformed revisions
    file would stop every command (``--help`` included), not only those that need a
    checkpoint. A mapping like the dict it builds (tests replace entries in it)."""

    def __init__(self):
        self._table: dict[str, PublishedModel] | None = None

    def _built(self) -> dict[str, PublishedModel]:
        if self._table is None:
            self._table = _published()
        return self._table

    def __getitem__(self, key: str) -> PublishedModel:
        return self._built()[key]

    def __setitem__(self, key: str, value: PublishedModel) -> None:
        self._built()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._built()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


class Loaded(NamedTuple):
    model: Any  # a Family, in eval mode
    spec: PublishedModel | None  # the table entry, None for a folder or an unknown Hub id
    folder: Path  # where the checkpoint files are (tokenizer files too, when shipped)

    @property
    def revision(self) -> str | None:
        """The Hub commit the files are a snapshot of (None for a folder outside a Hub cache)."""
        return snapshot_commit(self.folder)

    def revision_record(self) -> dict | None:
        """What a result records of a Hub checkpoint's revision: the commit its files are and
        whether the load was pinned to it (False: the branch's head, as it was then); None for
        a folder outside a Hub cache."""
        commit = self.revision
        if commit is None:
            return None
        return {"commit": commit, "pinned": bool(self.spec is not None and self.spec.revision)}

    def source(self, name: str) -> str:
        """``name`` as a result identity records it: with the resolved commit for a Hub model,
        so that weights that moved on the Hub give a new identity, never a reused result."""
        return f"{name}@{self.revision}" if self.revision else name


def split_source(source: str) -> tuple[str, str | None]:
    """A recorded model source (``Loaded.source``) as (name, commit): ``gsm8k:ar@<commit>``
    -> ("gsm8k:ar", "<commit>"); a name without a commit -> (name, None)."""
    name, _, commit = str(source).rpartition("@")
    if name and COMMIT.match(commit):
        return name, commit
    return str(source), None


def snapshot_commit(folder: Path) -> str | None:
    folder = Path(folder)
    if folder.parent.name == "snapshots" and COMMIT.match(folder.name):
        return folder.name
    return None


PUBLISHED = PublishedTable()
_ALIAS = re.compile(r"^(?P<task>\w+):setdlm-d(?P<d>\d+)$")


def resolve(name: str) -> PublishedModel | None:
    """The published model a key, alias or Hub id names (None if it names none)."""
    match = _ALIAS.match(name)
    if match:
        name = f"{match['task']}:setdlm-smax{2 * int(match['d'])}"
    by_hub_id = {model.hub_id: model for model in PUBLISHED.values()}
    return PUBLISHED.get(name) or by_hub_id.get(name)


def check_model_name(name: str) -> PublishedModel | None:
    """Refuse a name that can name no model (a path that is no folder, a key or Hub id of no
    loadable model) before anything is loaded or downloaded: what ``load_pretrained`` refuses
    first, so that a command can say it before its slow start (``setdlm lm-eval``). Returns
    the published model the name resolves to (None for a folder or another Hub id)."""
    from setdlm.checkpoints.folders import CheckpointError

    if Path(name).expanduser().is_dir():
        return None
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
    return spec


def load_pretrained(name: str, revision: str | None = None) -> Loaded:
    """A model from a local folder, a compact key, or a Hub id.

    Hub checkpoints are fetched with ``huggingface_hub`` (config, weights and tokenizer files
    only; never code). The table's settings then replace what the official loader would guess
    from the name.
    """
    from setdlm.checkpoints.folders import CheckpointError, load_model

    folder = Path(name).expanduser()
    if folder.is_dir():
        return Loaded(load_model(folder), None, folder)
    spec = check_model_name(name)
    repo_id = spec.hub_id if spec else name
    pinned = revision or (spec.revision if spec else None)
    folder = Path(_download(repo_id, pinned))
    resolved = snapshot_commit(folder)
    if pinned and COMMIT.match(pinned) and resolved and resolved != pinned:
        raise CheckpointError(
            f"{repo_id}: pinned to commit {pinned}, but the files are commit {resolved}; "
            "the weights moved: re-pin deliberately (setdlm models --pin) or pass revision="
        )
    model = load_model(folder)
    if spec is not None:
        model = apply_published_settings(model, spec)
        # the entry as this load pinned it: a commit given here pins it too (a branch does not)
        spec = dataclasses.replace(
            spec, revision=pinned if pinned and COMMIT.match(pinned) else None
        )
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

    from setdlm.checkpoints.folders import CheckpointError

    patterns = ["*.json", "*.safetensors", "pytorch_model.bin", "*.txt", "*.model", "*/config.json"]
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
    except (HFValidationError, HfHubHTTPError, LocalEntryNotFoundError) as error:
        where = "not in the local cache and the Hub is offline" if hub_offline() else str(error)
        if revision and hub_offline():
            cached = _cached_main(repo_id)
            held = f"; the cache holds {cached} as main" if cached else ""
            where = f"pinned revision {revision} is not in the local cache{held}"
        raise CheckpointError(
            f"{repo_id}: cannot get it from the Hugging Face Hub ({where.splitlines()[0]}); "
            "give a model folder instead"
        ) from None


def _cached_main(repo_id: str) -> str | None:
    """The commit the local Hub cache records as ``repo_id``'s main branch, if any."""
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.exists() else None


def pin_revisions(keys: list[str]) -> dict[str, str]:
    """Pin ``keys`` to their Hub repositories' current main commits in ``revisions_file()``.

    Needs the Hub; returns the new pins. Existing pins of other keys are kept.
    """
    from huggingface_hub import HfApi

    from setdlm.checkpoints.folders import CheckpointError
    from setdlm.util.files import atomic_write_json

    specs = []
    for key in keys:
        spec = resolve(key)
        if spec is None:
            raise CheckpointError(f"{key!r} is not a published key (see `setdlm models`)")
        specs.append(spec)
    if hub_offline():
        raise CheckpointError("pinning reads the Hub's current commits; the Hub is offline here")
    pins = pinned_revisions()
    new = {spec.key: _main_commit(HfApi(), spec.hub_id) for spec in specs}
    atomic_write_json(revisions_file(), dict(sorted({**pins, **new}.items())))
    return new


def _main_commit(api, hub_id: str) -> str:
    """The commit ``hub_id``'s main branch is at; a Hub that cannot be reached (no network, a
    refused request) is one line naming the repository, not the HTTP client's traceback."""
    from setdlm.checkpoints.folders import CheckpointError

    try:
        return api.model_info(hub_id).sha
    except hub_network_errors() as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        # an HTTP answer (a repository not found, a refused token) is not an offline machine
        answered = getattr(error, "response", None) is not None
        what = (
            "the Hugging Face Hub refused it" if answered else "cannot reach the Hugging Face Hub"
        )
        raise CheckpointError(
            f"{hub_id}: {what} ({type(error).__name__}: {reason}); pinning reads the Hub's "
            f"current commits: run it on a machine that is not offline (nothing was written "
            f"to {revisions_file().name})"
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
    if spec.d is not None:  # SetDLM's staggered schedule, which the name no longer implies
        # N is the checkpoint's own length; M = min(2d, N) (the schedule-version trap, SPEC 1.2)
        changes["schedule"] = StaggeredSchedule.from_sizes(N=config.length, d=spec.d)
    model.config = dataclasses.replace(config, **changes)
    return model
