"""Stand-in checkpoints in a local Hugging Face cache (setdlm/checkpoints/standins.py): they
load by key through the real Hub loading code offline, the same files come out every time, a
repository holds two revisions, and a revisions table pins the older one."""

from __future__ import annotations

import json

import pytest

from setdlm.checkpoints import standins, zoo
from setdlm.checkpoints.folders import CheckpointError
from setdlm.checkpoints.zoo import REVISIONS_ENV, load_pretrained, load_tokenizer_for
from setdlm.util.paths import data_path

# Small vocabularies (BERT, GPT-2): seconds to build; owt:setdlm-smax32 has two revisions,
# owt:ar is a DITLegacy folder.
KEYS = ("lm1b:ar", "lm1b:setdlm-smax8", "owt:ar", "owt:setdlm-smax32")


def use_cache(monkeypatch, hf_home) -> None:
    """Point the Hugging Face client at ``hf_home``'s cache (its constants are read at import),
    offline."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    hf_home = tmp_path_factory.mktemp("hf")
    entries = standins.build_cache(hf_home, data_path("tokenizers"), KEYS, log=lambda _: None)
    return hf_home, {entry.repo_id: entry for entry in entries}


def test_every_key_loads_through_the_hub_code_with_its_tasks_tokens(cache, monkeypatch):
    hf_home, entries = cache
    use_cache(monkeypatch, hf_home)
    for key in KEYS:
        spec = zoo.resolve(key)
        loaded = load_pretrained(key)
        tokenizer = load_tokenizer_for(loaded)  # the table's tokenizer repository, from the cache
        config = loaded.model.config
        assert loaded.revision == entries[spec.hub_id].commits[-1]  # main
        assert (config.family, config.length) == (spec.family, spec.length)
        assert loaded.folder.parent.parent.name == f"models--{spec.hub_id.replace('/', '--')}"
        assert len(tokenizer) <= config.vocab_size  # every id has an embedding row
    lm1b = load_pretrained("lm1b:setdlm-smax8").model.config
    assert (lm1b.mask_token_id, lm1b.bos_token_id, lm1b.eos_token_id) == (103, 101, 102)
    owt = json.loads((load_pretrained("owt:ar").folder / "config.json").read_text())
    assert owt["backbone_config"]["_target_"] == "backbone_dit_legacy.DITLegacy"
    assert owt["mask_token_id"] == 50257 and owt["noise_config"] is None


def test_the_same_files_and_commits_every_time(cache, tmp_path):
    _, entries = cache
    again = standins.build_cache(
        tmp_path, data_path("tokenizers"), ["lm1b:ar", "owt:setdlm-smax32"], log=lambda _: None
    )
    for entry in again:
        assert entry.commits == entries[entry.repo_id].commits
    two = entries["kuleshov-group/owt-setdlm-smax32"].commits
    assert len(two) == 2 and two[0] != two[1]


def test_a_revisions_table_pins_the_older_revision(cache, monkeypatch, tmp_path):
    hf_home, entries = cache
    use_cache(monkeypatch, hf_home)
    older, main = entries["kuleshov-group/owt-setdlm-smax32"].commits
    unpinned = load_pretrained("owt:setdlm-smax32")
    assert unpinned.revision == main
    assert unpinned.revision_record() == {"commit": main, "pinned": False}
    table = tmp_path / "revisions.json"
    table.write_text(json.dumps({"owt:setdlm-smax32": older}))
    monkeypatch.setenv(REVISIONS_ENV, str(table))
    monkeypatch.setattr(zoo, "PUBLISHED", zoo.PublishedTable())  # built again, with the pins
    pinned = load_pretrained("owt:setdlm-smax32")
    assert pinned.revision == older
    assert pinned.revision_record() == {"commit": older, "pinned": True}
    assert pinned.source("owt:setdlm-smax32") == f"owt:setdlm-smax32@{older}"
    weights = [p.model.backbone.vocab_embed.embedding for p in (unpinned, pinned)]
    assert not weights[0].equal(weights[1])  # two revisions, two sets of weights
    # a pin the cache does not hold: an error naming the commit and what the cache has instead
    table.write_text(json.dumps({"owt:setdlm-smax32": "ab" * 20}))
    monkeypatch.setattr(zoo, "PUBLISHED", zoo.PublishedTable())
    with pytest.raises(CheckpointError, match=f"pinned revision {'ab' * 20}.*holds {main}"):
        load_pretrained("owt:setdlm-smax32")


def test_a_named_revisions_table_that_is_missing_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(REVISIONS_ENV, str(tmp_path / "nowhere.json"))
    with pytest.raises(zoo.RevisionsFileError, match="nowhere.json: no such file"):
        zoo.pinned_revisions()

