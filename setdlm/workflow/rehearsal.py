"""The paper rehearsal's inputs: its data folder and its revisions table.

workflows/config/paper-rehearsal.yaml runs paper.yaml's DAG on a CPU with three substitutions,
stated in its ``substitutions`` (printed in every table). This module makes two of their
inputs; the third, the stand-in checkpoints in a local Hugging Face cache, is
setdlm/checkpoints/standins.py's.

Data (``write_data``): a folder laid out like ``SETDLM_DATA_DIR`` that the overlay's
``data.dir`` names, so every data set goes through the real ``dir`` preparation (copy, sha256,
manifest) and the tasks' real readers:

- GSM8K, CNN/DailyMail (the mirror's 100-article sample) and the Story Cloze CSV are the
  offline mirror's files, byte for byte (checked against its SHA256SUMS); the overlay's
  ``limit``s take the first few examples of each;
- OpenWebText and LM1B are not in the mirror: their files hold WikiText-2's test text instead
  (``openwebtext/valid.jsonl``: one article per line, as the OWT validation documents are;
  ``lm1b/test.jsonl``: one sentence per line, as LM1B's are).

Revisions (``rehearsal_pins``): a table in the format of published_revisions.json that pins
some keys to commits the cache holds, among them a repository's older revision (which its main
branch does not point at), and leaves the others unpinned, so that both kinds reach the tables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from setdlm.util.errors import DataError
from setdlm.util.files import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    sha256_file,
)

# The mirror's files the rehearsal copies as they are.
MIRROR_FILES = (
    "gsm8k/test.jsonl",
    "cnn_dailymail/test_sample100.jsonl",
    "rocstories/cloze_test_val__spring2016.csv",
)
WIKITEXT = "wikitext2/wiki.test.raw"
# WikiText-2 in place of the data sets the mirror does not have (written as `setdlm data
# prepare` writes them from the Hub: one {"text"} per line).
STANDIN_FILES = {"openwebtext": "openwebtext/valid.jsonl", "lm1b": "lm1b/test.jsonl"}
HEADING = re.compile(r"^ = [^=].* = $")  # an article's title line (subsections have == ... ==)
MIN_SENTENCE_WORDS = 5
# The rehearsal's pins: every GSM8K key at the commit the cache holds as main, and each
# repository with two revisions at its older one; every other key stays unpinned.
PINNED_TASKS = ("gsm8k",)


def write_data(mirror: Path, out: Path, log=print) -> dict[str, str]:
    """Write the rehearsal's data folder; returns relative path -> sha256 of every file."""
    mirror, out = Path(mirror), Path(out)
    sums = _mirror_sums(mirror)
    written = {}
    for relative in MIRROR_FILES:
        source = mirror / relative
        if not source.is_file():
            raise DataError(f"{source}: not in the offline mirror (SETDLM_DATA_DIR={mirror})")
        digest = sha256_file(source)
        if sums.get(relative) not in (None, digest):
            raise DataError(f"{source}: sha256 {digest} differs from {mirror / 'SHA256SUMS'}")
        atomic_write_bytes(out / relative, source.read_bytes())
        written[relative] = digest
    text = (mirror / WIKITEXT).read_text(encoding="utf-8")
    documents = {"openwebtext": wikitext_articles(text), "lm1b": wikitext_sentences(text)}
    for name, relative in STANDIN_FILES.items():
        rows = "".join(
            json.dumps({"text": doc}, ensure_ascii=False) + "\n" for doc in documents[name]
        )
        atomic_write_text(out / relative, rows)
        written[relative] = sha256_file(out / relative)
        log(f"{relative}: {len(documents[name])} rows of WikiText-2 test text ({name} stand-in)")
    # the copies' hashes, which `setdlm data prepare` checks each copy of them against
    lines = "".join(f"{digest}  ./{relative}\n" for relative, digest in sorted(written.items()))
    atomic_write_text(out / "SHA256SUMS", lines)
    return written


def _mirror_sums(mirror: Path) -> dict[str, str]:
    sums = mirror / "SHA256SUMS"
    if not sums.is_file():
        return {}
    listed = {}
    for line in sums.read_text().splitlines():
        digest, _, path = line.strip().partition("  ")
        listed[path.lstrip("*./")] = digest
    return listed


def wikitext_articles(text: str) -> list[str]:
    """WikiText-2's articles, each one document (its title line starts it)."""
    articles: list[list[str]] = []
    for line in text.splitlines():
        if HEADING.match(line) or not articles:
            articles.append([])
        articles[-1].append(line.strip())
    return ["\n".join(lines) for lines in articles if len(lines) > 1]


def wikitext_sentences(text: str) -> list[str]:
    """WikiText-2's sentences (paragraph lines cut after each " . "), headings left out."""
    sentences = []
    for line in text.splitlines():
        if line.strip().startswith("="):
            continue
        for sentence in re.split(r"(?<= \.) ", line.strip()):
            if len(sentence.split()) >= MIN_SENTENCE_WORDS:
                sentences.append(sentence)
    return sentences


def rehearsal_pins(entries) -> dict[str, str]:
    """key -> commit: ``PINNED_TASKS``' keys at main, two-revision repositories at the older
    one (``entries``: standins.build_cache's)."""
    pins = {}
    for entry in entries:
        if entry.key is None:
            continue
        if len(entry.commits) > 1:
            pins[entry.key] = entry.commits[0]
        elif entry.key.split(":")[0] in PINNED_TASKS:
            pins[entry.key] = entry.commits[-1]
    return dict(sorted(pins.items()))


def write_revisions(path: Path, entries) -> dict[str, str]:
    pins = rehearsal_pins(entries)
    atomic_write_json(Path(path), pins)
    return pins
