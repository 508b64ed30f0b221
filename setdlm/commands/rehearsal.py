"""``setdlm rehearsal``: the inputs of the paper rehearsal (workflows/config/paper-rehearsal.yaml).

``cache`` writes the stand-in checkpoints and tokenizers into a Hugging Face cache
(setdlm/checkpoints/standins.py) with the rehearsal's revisions table beside it; ``data``
writes its data folder (setdlm/workflow/rehearsal.py). ``make rehearsal`` runs both, then the
DAG with ``HF_HOME`` at that cache and ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import os
from pathlib import Path

from setdlm.commands.command import Command, group
from setdlm.util.validation import output_path


def _add_mirror(parser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the offline data mirror (default: $SETDLM_DATA_DIR)",
    )


def _mirror(args) -> Path:
    from setdlm.util.paths import DATA_DIR_ENV, DataNotFoundError

    folder = args.data_dir or (
        Path(os.environ[DATA_DIR_ENV]) if os.environ.get(DATA_DIR_ENV) else None
    )
    if folder is None or not folder.is_dir():
        raise DataNotFoundError(
            f"--data-dir: {folder or 'not given'} is not a folder, and {DATA_DIR_ENV} names "
            "none; expected the offline data mirror (e.g. ../shared/data)"
        )
    return folder


def _add_cache_arguments(parser) -> None:
    parser.add_argument(
        "--hf-home", type=output_path, required=True, help="the HF_HOME to write (its hub/ cache)"
    )
    parser.add_argument(
        "--revisions",
        type=output_path,
        default=None,
        help="where the rehearsal's revisions table goes (default: HF_HOME/revisions.json)",
    )
    parser.add_argument(
        "--keys", nargs="+", default=None, help="only these published keys (default: all)"
    )
    _add_mirror(parser)


def _cache(args) -> int:
    from setdlm.checkpoints.standins import build_cache, manifest
    from setdlm.checkpoints.zoo import resolve
    from setdlm.util.files import atomic_write_json
    from setdlm.util.validation import SettingError
    from setdlm.workflow.rehearsal import write_revisions

    keys = None
    if args.keys:
        unknown = [key for key in args.keys if resolve(key) is None]
        if unknown:
            raise SettingError(f"--keys: {unknown} are not published keys (see `setdlm models`)")
        keys = [resolve(key).key for key in args.keys]
    entries = build_cache(args.hf_home, _mirror(args) / "tokenizers", keys)
    atomic_write_json(args.hf_home / "standins.json", manifest(entries))
    revisions = args.revisions or args.hf_home / "revisions.json"
    pins = write_revisions(revisions, entries)
    print(
        f"{len(entries)} repositories in {args.hf_home / 'hub'}; "
        f"{len(pins)} keys pinned in {revisions}"
    )
    return 0


CACHE = Command(
    "cache",
    "tiny random stand-ins of every published checkpoint (and the tokenizers) in a local "
    "Hugging Face cache, with a revisions table pinning some of them",
    _add_cache_arguments,
    _cache,
)


def _add_data_arguments(parser) -> None:
    parser.add_argument("--out", type=output_path, required=True, help="the data folder to write")
    _add_mirror(parser)


def _data(args) -> int:
    from setdlm.workflow.rehearsal import write_data

    written = write_data(_mirror(args), args.out)
    print(f"{len(written)} files in {args.out}")
    return 0


DATA = Command(
    "data",
    "the rehearsal's data folder: the mirror's GSM8K, CNN/DM and Story Cloze files, and "
    "WikiText-2 text in place of OpenWebText and LM1B",
    _add_data_arguments,
    _data,
)

REHEARSAL = group(
    "rehearsal",
    "the paper rehearsal's stand-in checkpoints (a local Hub cache) and data folder",
    "rehearsal_command",
    (CACHE, DATA),
)
