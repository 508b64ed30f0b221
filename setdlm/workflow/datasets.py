"""Prepared data: each dataset copied from a data directory or fetched from the Hub into a
folder laid out like ``SETDLM_DATA_DIR``, with a manifest of every file's sha256 and row count.

Evaluation jobs then run with ``SETDLM_DATA_DIR`` pointing at the prepared folder, so a result
reads exactly the files its manifest lists. The file names are the ones the task loaders read
(a test checks the two tables agree):

| dataset | prepared file | Hub original |
|---|---|---|
| gsm8k | gsm8k/test.jsonl | openai/gsm8k (main, test) |
| cnn_dailymail | cnn_dailymail/test.jsonl (or test_sample100.jsonl) | abisee/cnn_dailymail |
| rocstories | rocstories/cloze_test_val__spring2016.csv | none (the Story Cloze CSV) |
| wikitext2 | wikitext2/wiki.test.raw | wikitext (wikitext-2-raw-v1, test) |
| openwebtext | openwebtext/valid.jsonl | Skylion007/openwebtext (train[-100000:]) |
| lm1b | lm1b/test.jsonl | lm1b (test) |

CNN/DailyMail: the full test split of 3.0.0 from the Hub, or from a directory its test.jsonl when
it has one, else the mirror's 100-article sample.

From a data directory the file is copied byte for byte (and checked against the directory's
``SHA256SUMS`` when it has one). From the Hub it is written in the same format as the mirror.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from setdlm.util.errors import DataError
from setdlm.util.files import atomic_write_json, atomic_write_text, fsync_dir, sha256_file
from setdlm.util.hub import load_hub_dataset
from setdlm.util.paths import DataNotFoundError
from setdlm.util.scheduler import current_job

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Dataset:
    folder: str
    files: tuple[str, ...]  # candidates in a data directory, the first one present is used
    hub: tuple[str, str | None, str] | None  # (id, config, split)
    hub_file: str | None = None  # the file written from the Hub


DATASETS = {
    "gsm8k": Dataset("gsm8k", ("test.jsonl",), ("openai/gsm8k", "main", "test"), "test.jsonl"),
    "cnn_dailymail": Dataset(
        "cnn_dailymail",
        ("test.jsonl", "test_sample100.jsonl"),  # the full split when the directory has it
        ("abisee/cnn_dailymail", "3.0.0", "test"),
        "test.jsonl",
    ),
    "rocstories": Dataset("rocstories", ("cloze_test_val__spring2016.csv",), None),
    "wikitext2": Dataset(
        "wikitext2", ("wiki.test.raw",), ("wikitext", "wikitext-2-raw-v1", "test"), "wiki.test.raw"
    ),
    "openwebtext": Dataset(
        "openwebtext",
        ("valid.jsonl",),
        ("Skylion007/openwebtext", None, "train[-100000:]"),  # the paper's OWT validation docs
        "valid.jsonl",
    ),
    "lm1b": Dataset("lm1b", ("test.jsonl",), ("lm1b", None, "test"), "test.jsonl"),
}


def source_file(name: str, data_dir: Path) -> Path | None:
    """The file a ``dir`` source copies: the first candidate the directory holds."""
    for file in DATASETS[name].files:
        path = data_dir / DATASETS[name].folder / file
        if path.is_file():
            return path
    return None


def source_identity(name: str, kind: str, data_dir: Path | None) -> dict:
    """What the prepared copy depends on: the source file's content (not where it lies) or the
    Hub reference. Part of the prepare job's config hash."""
    dataset = DATASETS[name]
    if kind == "hub":
        hub_id, config, split = dataset.hub
        return {"dataset": name, "source": "hub", "id": hub_id, "config": config, "split": split}
    path = source_file(name, data_dir)
    relative = f"{dataset.folder}/{path.name}"
    return {
        "dataset": name,
        "source": "dir",
        "file": relative,
        "sha256": _listed_sha256(data_dir, relative) or sha256_file(path),
    }


def _listed_sha256(data_dir: Path, relative: str) -> str | None:
    """The hash ``SHA256SUMS`` lists for a file (the offline mirror ships one), else None."""
    from setdlm.data.mirror import listed_sha256

    listed = listed_sha256(data_dir, relative)
    return None if listed is None else listed[0]


# ------------------------------------------------------------------------------- prepare
def prepare(name: str, kind: str, out: Path, data_dir: Path | None, log=print) -> dict:
    """Write dataset ``name`` under ``out/<folder>/`` and its part manifest; return the part."""
    dataset = DATASETS[name]
    folder = out / dataset.folder
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        source = source_file(name, data_dir)
        if source is None:
            raise DataNotFoundError(
                f"data.sources.{name} = dir: none of {list(dataset.files)} is in "
                f"{data_dir / dataset.folder}"
            )
        relative = f"{dataset.folder}/{source.name}"
        target = out / relative
        _copy(source, target)
        expected = _listed_sha256(data_dir, relative)
        origin = {"kind": "dir", "path": str(source)}
    elif kind == "hub":
        if dataset.hub is None:
            raise ValueError(f"data.sources.{name}: {name} is not on the Hub; use a data directory")
        target = folder / dataset.hub_file
        origin = _from_hub(name, dataset, target)
        expected = None
    else:
        raise ValueError(f"data.sources.{name}: unknown source kind {kind!r}")
    try:
        rows = count_rows(target)
    except DataError:  # not text: no copy is left to be taken for prepared data
        target.unlink()
        raise
    entry = {
        "path": target.relative_to(out).as_posix(),
        "sha256": sha256_file(target),
        "rows": rows,
        "bytes": target.stat().st_size,
        "source": origin,
    }
    if expected is not None and expected != entry["sha256"]:
        target.unlink()
        raise DataError(
            f"{origin['path']}: sha256 {entry['sha256']} differs from {expected} listed in "
            f"{data_dir / 'SHA256SUMS'}"
        )
    part = {"dataset": name, "files": [entry], "job": current_job()}
    atomic_write_json(folder / MANIFEST, part)
    log(f"{name}: {entry['path']} ({entry['rows']} rows, sha256 {entry['sha256'][:12]}...)")
    return part


def _copy(source: Path, target: Path) -> None:
    temporary = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, temporary)
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    temporary.replace(target)
    fsync_dir(target.parent)


def _from_hub(name: str, dataset: Dataset, target: Path) -> dict:
    hub_id, config, split = dataset.hub
    rows = load_hub_dataset(
        hub_id, config, split=split, instead=f"use data.sources.{name}: dir (--source dir)"
    )
    if name == "wikitext2":  # the mirror's format: the raw text with blank lines dropped
        lines = [line for line in "".join(rows["text"]).splitlines() if line.strip()]
        text = "".join(line + "\n" for line in lines)
    elif name == "gsm8k":
        text = _jsonl({"question": r["question"], "answer": r["answer"]} for r in rows)
    elif name == "cnn_dailymail":
        text = _jsonl(
            {"doc_id": r["id"], "article": r["article"], "highlights": r["highlights"]}
            for r in rows
        )
    else:  # openwebtext, lm1b: one document per line
        text = _jsonl({"text": r["text"]} for r in rows)
    atomic_write_text(target, text)
    fingerprint = getattr(rows, "_fingerprint", None)
    return {
        "kind": "hub",
        "id": hub_id,
        "config": config,
        "split": split,
        "fingerprint": fingerprint,
    }


def _jsonl(rows) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def count_rows(path: Path) -> int:
    """Examples in a file: JSON lines, CSV records after the header, non-blank text lines."""
    from setdlm.data.mirror import read_text

    text = read_text(path)  # UTF-8, or refused naming the file
    if path.suffix == ".csv":
        return max(0, sum(1 for _ in csv.reader(io.StringIO(text))) - 1)
    return sum(1 for line in text.splitlines() if line.strip())


# ------------------------------------------------------------------------------ manifest
def write_manifest(out: Path) -> dict:
    """Merge every dataset's part manifest into ``out/manifest.json``."""
    parts = sorted(out.glob(f"*/{MANIFEST}"))
    if not parts:
        raise DataError(
            f"{out}: no prepared dataset in it (no <dataset>/{MANIFEST}); "
            "`setdlm data prepare --out FOLDER` writes them"
        )
    files = [entry for part in parts for entry in json.loads(part.read_text())["files"]]
    manifest = {
        "files": sorted(files, key=lambda entry: entry["path"]),
        "sha256": hashlib.sha256(
            "".join(f"{e['sha256']}  {e['path']}\n" for e in files).encode()
        ).hexdigest(),
    }
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


def verify(out: Path) -> list[str]:
    """Problems with the prepared files against ``out/manifest.json`` (empty: all match)."""
    if not (out / MANIFEST).is_file():
        raise DataError(
            f"{out / MANIFEST} does not exist: {out} is not a prepared data folder "
            "(`setdlm data manifest FOLDER` writes one)"
        )
    manifest = json.loads((out / MANIFEST).read_text())
    problems = []
    for entry in manifest["files"]:
        path = out / entry["path"]
        if not path.is_file():
            problems.append(f"{entry['path']}: missing")
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"{entry['path']}: sha256 differs from the manifest")
        elif count_rows(path) != entry["rows"]:
            problems.append(f"{entry['path']}: {count_rows(path)} rows, manifest {entry['rows']}")
    return problems
