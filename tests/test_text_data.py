"""Tokenizers, WikiText-2 documents, the chunked LM dataset and the resumable batch loader."""

from __future__ import annotations

import pytest
import torch

from setdlm.data.loader import ResumableBatchLoader, derive_seed
from setdlm.data.text import (
    ChunkedLMDataset,
    detokenize_wikitext,
    load_wikitext2,
    read_wikitext2_lines,
    split_wikitext_articles,
)
from setdlm.data.tokenizers import SpecialTokens, load_tokenizer, train_bpe_tokenizer


@pytest.fixture(scope="module")
def wikitext():
    return load_wikitext2()


@pytest.fixture(scope="module")
def bpe(wikitext, tmp_path_factory):
    return train_bpe_tokenizer(
        wikitext.train, 512, SpecialTokens(), tmp_path_factory.mktemp("bpe") / "tokenizer"
    )


# --- tokenizers ---------------------------------------------------------------------------


def test_bpe_training_is_deterministic_and_loadable(wikitext, tmp_path):
    first = train_bpe_tokenizer(wikitext.train, 600, SpecialTokens(), tmp_path / "a")
    second = train_bpe_tokenizer(wikitext.train, 600, SpecialTokens(), tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (
        tmp_path / "b" / "tokenizer.json"
    ).read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert len(first) == len(second) == 600
    reloaded = load_tokenizer(tmp_path / "a")
    special = SpecialTokens()
    assert (reloaded.bos_token, reloaded.eos_token) == (special.bos, special.eos)
    assert (reloaded.pad_token, reloaded.mask_token) == (special.pad, special.mask)
    ids = [reloaded.bos_token_id, reloaded.eos_token_id]
    ids += [reloaded.pad_token_id, reloaded.mask_token_id]
    assert ids == [0, 1, 2, 3]


def test_bpe_round_trips_text_it_never_saw(bpe, wikitext):
    samples = [wikitext.heldout[0][:2000], "naïve café — 1,000 @-@ ( x ) 's \n\n  tabs\tend "]
    for text in samples:
        ids = bpe(text, add_special_tokens=False)["input_ids"]
        assert bpe.decode(ids) == text
        assert len(ids) < len(text.encode())  # merges were learnt, not just bytes
    # Special tokens are single ids and never produced from ordinary text.
    assert bpe("<|bos|>x", add_special_tokens=False)["input_ids"][0] == bpe.bos_token_id


def test_bpe_rejects_a_vocab_smaller_than_the_byte_alphabet(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_bpe_tokenizer(["abc"], 100, SpecialTokens(), tmp_path / "tiny")


def test_mirror_tokenizers_load_with_the_right_vocabularies(data_dir):
    gpt2 = load_tokenizer(data_dir / "tokenizers" / "gpt2")
    assert len(gpt2) == 50257 and gpt2("Hello world")["input_ids"] == [15496, 995]
    assert gpt2.eos_token == "<|endoftext|>"
    qwen = load_tokenizer(data_dir / "tokenizers" / "qwen3")
    assert len(qwen) == 151669 and qwen.convert_tokens_to_ids("<|endoftext|>") == 151643
    bert = load_tokenizer(data_dir / "tokenizers" / "bert-base-uncased")
    assert len(bert) == 30522 and bert.mask_token_id == 103
    assert bert("Hello world")["input_ids"] == [101, 7592, 2088, 102]


def test_a_folder_loaded_again_gives_its_tokenizer_until_its_files_change(tmp_path):
    """A job's points share one load of their tokenizer; a folder rewritten since is read anew."""
    folder = tmp_path / "tokenizer"
    train_bpe_tokenizer(["abc def " * 50], 300, SpecialTokens(), folder)
    first = load_tokenizer(folder)
    assert load_tokenizer(folder) is first
    assert load_tokenizer(tmp_path / "." / "tokenizer") is first  # the same path, written apart
    train_bpe_tokenizer(["xyz uvw " * 50], 300, SpecialTokens(), folder)  # rewritten in place
    again = load_tokenizer(folder)
    assert again is not first
    assert (
        again("xyz", add_special_tokens=False)["input_ids"]
        != first("xyz", add_special_tokens=False)["input_ids"]
    )


def test_load_tokenizer_names_a_missing_or_empty_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_tokenizer(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


# --- WikiText-2 ---------------------------------------------------------------------------


def test_wikitext_articles_and_heldout_slice_are_deterministic(wikitext):
    lines = read_wikitext2_lines("test")
    assert len(lines) == 2891  # the mirror's README: blank lines dropped
    articles = split_wikitext_articles(lines)
    assert len(articles) == 62 and articles[0].startswith(" = Robert Boulter = \n")
    assert len(wikitext.train) + len(wikitext.heldout) == 62
    assert len(wikitext.heldout) == 6
    assert wikitext.train[0].startswith("= Robert Boulter =\nRobert Boulter is an English film,")
    assert wikitext == load_wikitext2()
    assert not set(wikitext.train) & set(wikitext.heldout)
    raw = load_wikitext2(detokenize=False)
    assert raw.heldout[-1] == articles[-1]


def test_wikitext_detokenizer_undoes_its_tokenization():
    text = ' = = Career = = \n He said " it is n\'t 1 @,@ 000 @-@ odd ( roughly ) " , and left .'
    assert detokenize_wikitext(text) == (
        '== Career ==\nHe said "it isn\'t 1,000-odd (roughly)", and left.'
    )


# --- chunked dataset ----------------------------------------------------------------------


def test_chunks_start_with_bos_and_carry_eos_after_every_document(bpe):
    documents = ["first document here.", "second, longer document follows it.", "third"]
    length = 8
    dataset = ChunkedLMDataset(documents, bpe, length)
    encoded = [bpe(d, add_special_tokens=False)["input_ids"] for d in documents]
    stream = [token for ids in encoded for token in [*ids, bpe.eos_token_id]]
    assert len(dataset) == len(stream) // (length - 1)
    items = [dataset[i] for i in range(len(dataset))]
    for item in items:
        assert item["input_ids"].shape == (length,) and item["input_ids"].dtype == torch.long
        assert torch.equal(item["attention_mask"], torch.ones(length, dtype=torch.long))
        assert item["input_ids"][0] == bpe.bos_token_id
        assert (item["input_ids"][1:] != bpe.bos_token_id).all()
    bodies = [token for item in items for token in item["input_ids"][1:].tolist()]
    assert bodies == stream[: len(bodies)]  # chunks are the stream, in order, tail dropped
    assert len(stream) - len(bodies) < length - 1


def test_chunked_dataset_errors_are_clear(bpe):
    with pytest.raises(ValueError, match="fewer than one chunk of 64"):
        ChunkedLMDataset(["short"], bpe, 64)
    with pytest.raises(ValueError, match="at least 2"):
        ChunkedLMDataset(["short"], bpe, 1)


# --- resumable loader ---------------------------------------------------------------------


def _numbered_dataset(n: int) -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": torch.full((4,), i), "attention_mask": torch.ones(4)} for i in range(n)]


def _ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return batch["input_ids"][:, 0].tolist()


def test_loader_order_depends_only_on_seed_and_epoch():
    dataset = _numbered_dataset(23)
    loader = ResumableBatchLoader(dataset, batch_size=5, seed=7)
    assert loader.batches_per_epoch == 4  # 3 leftover items are dropped each epoch
    epoch0 = [_ids(loader.next_batch()) for _ in range(4)]
    epoch1 = [_ids(loader.next_batch()) for _ in range(4)]
    seen0 = [i for batch in epoch0 for i in batch]
    assert len(set(seen0)) == 20 and seen0 == loader.epoch_order(0)[:20].tolist()
    assert epoch0 != epoch1 and loader.epoch == 2
    again = ResumableBatchLoader(dataset, batch_size=5, seed=7)
    assert [_ids(again.next_batch()) for _ in range(4)] == epoch0
    other = ResumableBatchLoader(dataset, batch_size=5, seed=8)
    assert [_ids(other.next_batch()) for _ in range(4)] != epoch0
    assert derive_seed(7, "data-order", 0) == derive_seed(7, "data-order", 0) != derive_seed(7)


@pytest.mark.parametrize("consumed", [0, 3, 4, 9])  # start, mid-epoch, boundary, later epoch
def test_loader_resumes_at_exactly_the_next_batch(consumed):
    dataset = _numbered_dataset(23)
    reference = ResumableBatchLoader(dataset, batch_size=5, seed=3)
    expected = [_ids(reference.next_batch()) for _ in range(consumed + 6)][consumed:]
    interrupted = ResumableBatchLoader(dataset, batch_size=5, seed=3)
    for _ in range(consumed):
        interrupted.next_batch()
    position = interrupted.state_dict()
    resumed = ResumableBatchLoader(dataset, batch_size=5, seed=3)
    resumed.load_state_dict(position)
    assert [_ids(resumed.next_batch()) for _ in range(6)] == expected


def test_loader_shards_global_batches_across_processes_and_checks_positions():
    dataset = _numbered_dataset(40)
    single = ResumableBatchLoader(dataset, batch_size=8, seed=1)
    ranks = [ResumableBatchLoader(dataset, 4, 1, rank=r, world_size=2) for r in range(2)]
    for _ in range(7):
        assert _ids(ranks[0].next_batch()) + _ids(ranks[1].next_batch()) == _ids(
            single.next_batch()
        )
    position = single.state_dict()
    with pytest.raises(ValueError, match="batch_size=8"):
        ResumableBatchLoader(dataset, batch_size=4, seed=1).load_state_dict(position)
    with pytest.raises(ValueError, match="fewer than one global batch of 48"):
        ResumableBatchLoader(dataset, 24, 1, rank=0, world_size=2)
