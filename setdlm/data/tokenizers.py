"""Tokenizers: load a published one (Hub id or local folder), or train a tiny byte-level BPE.

Published tokenizers come from the Hub in production and from folders under
``SETDLM_DATA_DIR/tokenizers`` offline. Some of those folders hold only the raw vocabulary files
(GPT-2: ``vocab.json`` + ``merges.txt``; BERT: ``vocab.txt``) and no ``tokenizer_config.json``.
In transformers 5 ``AutoTokenizer`` then cannot tell which class to build, and the direct
constructors (``GPT2TokenizerFast(vocab_file=...)``, ``BertTokenizerFast(vocab_file=...)``)
silently build a near-empty tokenizer, so the folder's files decide the ``tokenizer_type``.

The tiny CPU configuration trains its own small byte-level BPE so that the embedding and output
layers stay small and training is fast.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from setdlm.util.errors import DataError
from setdlm.util.paths import DataNotFoundError

# Raw vocabulary files -> the transformers tokenizer type that reads them.
_RAW_VOCAB_TYPES = (
    (("vocab.json", "merges.txt"), "gpt2"),
    (("vocab.txt",), "bert"),
)
_CONFIG_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(name_or_dir: str | os.PathLike) -> PreTrainedTokenizerBase:
    """A tokenizer from a local folder, or from the Hub when ``name_or_dir`` is not a folder.

    Never runs remote code. A folder needs ``tokenizer.json``/``tokenizer_config.json`` or one
    of the raw vocabularies (``vocab.json`` + ``merges.txt`` for GPT-2 BPE, ``vocab.txt`` for
    BERT WordPiece). A folder loaded before, whose files have not changed since, or a Hub id
    loaded before in this process, gives the same object again: do not modify it.
    """
    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        try:
            return _folder_tokenizer(path, _files_state(path))
        except DataNotFoundError:
            raise
        except (OSError, ValueError) as error:  # files that are there but do not load
            raise DataError(f"tokenizer folder {path}: its files do not load ({error})") from None
    if path.exists() or str(name_or_dir).startswith((".", "/", "~")):
        raise DataNotFoundError(f"tokenizer folder {path} does not exist (or is not a folder)")
    return _hub_tokenizer(str(name_or_dir))  # the published checkpoints name theirs by Hub id


# A workflow job evaluates all of a model's points in one process, and each point loads the same
# tokenizer: Qwen3's (151,669 tokens) takes 0.6 s a time (transformers reads its tokenizer.json
# in Python), about 4 of a 15-point rehearsal job's 35 s. So a tokenizer is read once per
# process (a folder's once per state of its files) and then shared; callers only read it (a fast
# tokenizer sets its truncation and padding afresh on every call). A copy would cost more than a
# load (0.8 s), and only a few are kept, not every one a long process (the test suite) meets.
@functools.lru_cache(maxsize=4)
def _folder_tokenizer(folder: Path, files: tuple) -> PreTrainedTokenizerBase:
    """``files`` (``_files_state``) only keys the cache: a folder rewritten since is read anew."""
    return _load_folder(folder)


@functools.lru_cache(maxsize=4)
def _hub_tokenizer(name: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(name, trust_remote_code=False)


def _files_state(path: Path) -> tuple:
    """What the folder's files are now (name, size, modification time), sorted by name."""
    files = []
    for entry in os.scandir(path):
        if entry.is_file():
            stat = entry.stat()
            files.append((entry.name, stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(files))


def _load_folder(path: Path):
    """A tokenizer saved in ``path``: its tokenizer files, else a raw vocabulary."""
    if any((path / name).is_file() for name in _CONFIG_FILES):
        # local_files_only, always: transformers records it in the saved config, so a copy
        # saved online and one saved offline would otherwise differ
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    for files, tokenizer_type in _RAW_VOCAB_TYPES:
        if all((path / name).is_file() for name in files):
            return AutoTokenizer.from_pretrained(
                path,
                tokenizer_type=tokenizer_type,
                trust_remote_code=False,
                local_files_only=True,
            )
    raise DataNotFoundError(
        f"tokenizer folder {path} holds none of {list(_CONFIG_FILES)}, "
        f"vocab.json + merges.txt, or vocab.txt"
    )


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens a trained tokenizer reserves; they get ids 0..3 in this order."""

    bos: str = "<|bos|>"
    eos: str = "<|eos|>"
    pad: str = "<|pad|>"
    mask: str = "<|mask|>"


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: SpecialTokens,
    out_dir: str | os.PathLike,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts``, save it to ``out_dir`` and return it reloaded.

    Byte-level means every string round-trips exactly (no unknown token). Training is
    deterministic: the same texts in the same order give a byte-identical ``tokenizer.json``.
    The folder (``tokenizer.json`` + ``tokenizer_config.json``) loads with ``load_tokenizer``.
    """
    initial_alphabet = pre_tokenizers.ByteLevel.alphabet()  # 256 byte symbols
    minimum = len(initial_alphabet) + len(astuple(special_tokens))
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} is below the {minimum} bytes + special tokens")

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(astuple(special_tokens)),
        initial_alphabet=initial_alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=special_tokens.bos,
        eos_token=special_tokens.eos,
        pad_token=special_tokens.pad,
        mask_token=special_tokens.mask,
        # The default clean-up rewrites " ," to "," on decode, which breaks the round trip.
        clean_up_tokenization_spaces=False,
    )
    _save_folder_atomically(wrapped, Path(out_dir))
    return load_tokenizer(out_dir)


def _save_folder_atomically(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Write into a sibling temp folder, then rename it into place: never a half-written folder."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        tokenizer.save_pretrained(staging)
        for file in staging.iterdir():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
