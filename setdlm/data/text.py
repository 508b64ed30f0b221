"""WikiText-2 documents and the chunked language-modelling dataset built from them.

The tiny configuration trains on WikiText-2 text the way the paper's LM1B/OWT runs train on
their corpora (SPEC section 4): documents are tokenized, concatenated with EOS after each one,
and the token stream is wrapped into fixed chunks of ``length`` tokens, each starting with BOS.
Chunks ignore document boundaries, so no token is padding and every chunk is full.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import torch
from transformers import PreTrainedTokenizerBase

from setdlm.data.mirror import read_text
from setdlm.util.hub import load_hub_dataset
from setdlm.util.paths import data_dir, data_path

WIKITEXT_HUB_ID = ("wikitext", "wikitext-2-raw-v1")
# Hub split name -> file name in the local mirror (the original archive's names).
_WIKITEXT_FILES = {
    "train": "wiki.train.raw",
    "validation": "wiki.valid.raw",
    "test": "wiki.test.raw",
}
# A top-level article title: " = Robert Boulter = " (sections are " = = History = = ").
_ARTICLE_TITLE = re.compile(r"^ = [^=].* = $")


class TextSplits(NamedTuple):
    """Documents to train on and a disjoint held-out slice to evaluate on."""

    train: list[str]
    heldout: list[str]


def read_wikitext2_lines(split: str = "test") -> list[str]:
    """The non-blank lines of a WikiText-2 raw split, from the local mirror or the Hub.

    With ``SETDLM_DATA_DIR`` set the mirror's ``wikitext2/wiki.<split>.raw`` is read (the mirror
    holds the test split only); otherwise the Hub dataset. Both give the same lines: the mirror
    is the Hub text joined with blank lines dropped.
    """
    if split not in _WIKITEXT_FILES:
        raise ValueError(f"WikiText-2 split {split!r} is not one of {sorted(_WIKITEXT_FILES)}")
    if data_dir() is not None:
        text = read_text(data_path("wikitext2", _WIKITEXT_FILES[split]))  # UTF-8, or refused
    else:
        instead = "set SETDLM_DATA_DIR to the offline data folder (e.g. ../shared/data)"
        rows = load_hub_dataset(*WIKITEXT_HUB_ID, split=split, instead=instead)["text"]
        text = "".join(rows)
    return [line for line in text.splitlines() if line.strip()]


def split_wikitext_articles(lines: Sequence[str]) -> list[str]:
    """Group lines into articles: each top-level title line starts a new one.

    Lines before the first title (none in the real splits) form an article of their own.
    """
    articles: list[list[str]] = []
    for line in lines:
        if _ARTICLE_TITLE.match(line) or not articles:
            articles.append([])
        articles[-1].append(line)
    return ["\n".join(article) for article in articles]


def detokenize_wikitext(text: str) -> str:
    """Undo WikiText's own tokenization (" @-@ ", " , ", "( x )") so BPE sees ordinary text.

    MDLM-style pipelines do this before BPE; the rules below cover the patterns that occur in
    WikiText-2 and leave everything else untouched.
    """
    text = text.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    text = re.sub(r" ([.,;:!?%)\]}])", r"\1", text)  # no space before closing punctuation
    text = re.sub(r"([(\[{$]) ", r"\1", text)  # no space after opening brackets
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)  # contractions
    text = re.sub(r'" ([^"\n]*?) "', r'"\1"', text)  # quoted spans
    lines = []
    for line in text.split("\n"):
        line = line.strip()
        heading = re.fullmatch(r"((?:= )+)(.*?)((?: =)+)", line)
        if heading:  # "= = History = =" -> "== History =="
            level = heading.group(1).count("=")
            line = f"{'=' * level} {heading.group(2)} {'=' * level}"
        lines.append(line)
    return "\n".join(lines)


def load_wikitext2(
    split: str = "test", heldout_fraction: float = 0.1, detokenize: bool = True
) -> TextSplits:
    """WikiText-2 articles split deterministically: the last ``heldout_fraction`` are held out."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    articles = split_wikitext_articles(read_wikitext2_lines(split))
    if detokenize:
        articles = [detokenize_wikitext(article) for article in articles]
    if len(articles) < 2:
        raise ValueError(f"WikiText-2 {split} has {len(articles)} article(s); need at least 2")
    n_heldout = min(len(articles) - 1, max(1, round(len(articles) * heldout_fraction)))
    return TextSplits(train=articles[:-n_heldout], heldout=articles[-n_heldout:])


class TokenRowsDataset(torch.utils.data.Dataset):
    """Rows of token ids, ``input_ids`` (N, L); an item is ``{"input_ids": (L,),
    "attention_mask": (L,)}`` with an all-ones mask: every position is trained on."""

    input_ids: torch.Tensor  # (N, L)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        input_ids = self.input_ids[index]  # (L,)
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _bos_eos(
    tokenizer: PreTrainedTokenizerBase,
    purpose: str,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> tuple[int, int]:
    """The ids given (a checkpoint's own), else the tokenizer's."""
    bos_id = tokenizer.bos_token_id if bos_id is None else bos_id
    eos_id = tokenizer.eos_token_id if eos_id is None else eos_id
    if bos_id is None or eos_id is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} needs bos and eos tokens {purpose} "
            f"(bos_token_id={bos_id}, eos_token_id={eos_id})"
        )
    return bos_id, eos_id


class ChunkedLMDataset(TokenRowsDataset):
    """Documents -> one token stream (EOS after each document) -> chunks of ``length`` tokens.

    Every chunk is BOS followed by the next ``length - 1`` tokens of the stream; the tail that
    does not fill a chunk is dropped. Items are ``{"input_ids": (L,), "attention_mask": (L,)}``
    long tensors (the mask is all ones: chunks have no padding). ``bos_id``/``eos_id``: a
    model's own (BERT's tokenizer, LM1B's, names none: its checkpoints use [CLS] and [SEP]),
    else the tokenizer's.
    """

    def __init__(
        self,
        documents: Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        length: int,
        bos_id: int | None = None,
        eos_id: int | None = None,
    ):
        if length < 2:
            raise ValueError(f"chunk length must be at least 2 (BOS + one token), got {length}")
        bos_id, eos_id = _bos_eos(tokenizer, "to chunk documents", bos_id, eos_id)
        encoded = tokenizer(list(documents), add_special_tokens=False)["input_ids"]
        stream = [token for document in encoded for token in [*document, eos_id]]
        body_length = length - 1
        n_chunks = len(stream) // body_length
        if n_chunks == 0:
            raise ValueError(
                f"{len(documents)} document(s) give {len(stream)} tokens, "
                f"fewer than one chunk of {length}"
            )
        body = torch.tensor(stream[: n_chunks * body_length], dtype=torch.long)
        body = body.view(n_chunks, body_length)  # (N, L - 1)
        bos_column = torch.full((n_chunks, 1), bos_id, dtype=torch.long)  # (N, 1)
        self.input_ids = torch.cat([bos_column, body], dim=1)  # (N, L)
        self.length = length
        self.n_stream_tokens = len(stream)


def first_chunks(
    documents: Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    limit: int | None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    start: int = 256,
) -> tuple[ChunkedLMDataset, int]:
    """The chunks of as few leading documents as give ``limit`` of them (of all with None), and
    how many documents were tokenized.

    The chunks of the first k documents are the first chunks of all documents (they share one
    token stream), so a limited set tokenizes ``start`` documents, then twice as many at a time
    until it has enough, instead of the whole split. Callers take the first ``limit`` chunks.
    """
    used = len(documents) if limit is None else min(len(documents), start)
    while True:
        try:
            chunks = ChunkedLMDataset(documents[:used], tokenizer, length, bos_id, eos_id)
        except ValueError:  # not one full chunk yet
            if used == len(documents):
                raise
        else:
            if limit is None or len(chunks) >= limit or used == len(documents):
                return chunks, used
        used = min(2 * used, len(documents))


class PaddedRowsDataset(TokenRowsDataset):
    """One document per row: BOS + document + EOS, filled up to ``length`` with more EOS.

    For short, self-contained documents (the arithmetic problems): every row starts where a
    prompt starts at evaluation, and the EOS fill is trained on like any token (the mask is all
    ones), so every family learns to end a solution and what follows the end. Items are
    ``{"input_ids": (L,), "attention_mask": (L,)}`` like ``ChunkedLMDataset``'s.
    """

    def __init__(self, documents: Sequence[str], tokenizer: PreTrainedTokenizerBase, length: int):
        bos_id, eos_id = _bos_eos(tokenizer, "for rows")
        encoded = tokenizer(list(documents), add_special_tokens=False)["input_ids"]
        rows = []
        for index, document in enumerate(encoded):
            row = [bos_id, *document, eos_id]
            if len(row) > length:
                raise ValueError(
                    f"document {index} takes {len(row)} tokens with BOS and EOS, more than the "
                    f"row length {length}: {documents[index][:60]!r}..."
                )
            rows.append(row + [eos_id] * (length - len(row)))
        if not rows:
            raise ValueError("no documents to make rows of")
        self.input_ids = torch.tensor(rows, dtype=torch.long)  # (N, L)
        self.length = length
