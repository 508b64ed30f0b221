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
# owt:ar and owt:mdlm are DITLegacy folders.
KEYS = ("lm1b:ar", "lm1b:setdlm-smax8", "owt:ar", "owt:mdlm", "owt:setdlm-smax32")


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
        assert load_tokenizer_for(loaded) is tokenizer  # read once: a job's points share it
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


def test_a_result_records_its_checkpoints_revision_in_metrics_mlflow_and_tables(
    cache, monkeypatch, tmp_path
):
    """Two likelihood points of the two-revision repository, one pinned to the older commit
    and one unpinned (main): metrics.json, the MLflow params and the table each say which."""
    from setdlm.cli import main
    from setdlm.report.tables import build_tables
    from setdlm.results.reader import load_results
    from setdlm.tracking.record import run_record
    from setdlm.workflow.rehearsal import write_data
    from setdlm.workflow.train import fetch_checkpoint

    hf_home, entries = cache
    use_cache(monkeypatch, hf_home)
    data = tmp_path / "data"
    write_data(data_path(), data, log=lambda _: None)
    monkeypatch.setenv("SETDLM_DATA_DIR", str(data))
    older, main_commit = entries["kuleshov-group/owt-setdlm-smax32"].commits
    table = tmp_path / "revisions.json"
    table.write_text(json.dumps({"owt:setdlm-smax32": older}))
    run = tmp_path / "runs" / "rehearsed"
    for model, pinned in (("setdlm-smax32", True), ("setdlm-smax32-main", False)):
        if pinned:
            monkeypatch.setenv(REVISIONS_ENV, str(table))
        else:
            monkeypatch.delenv(REVISIONS_ENV)
        monkeypatch.setattr(zoo, "PUBLISHED", zoo.PublishedTable())
        out = run / "likelihood-owt" / model / "default"
        args = ["eval", "likelihood", "--model", "owt:setdlm-smax32", "--data", "owt"]
        assert main([*args, "--limit", "1", "--batch-size", "1", "--out", str(out)]) == 0
        metrics = json.loads((out / "metrics.json").read_text())
        commit = older if pinned else main_commit
        assert metrics["config"]["model_revision"] == {"commit": commit, "pinned": pinned}
        assert metrics["config"]["model_source"] == f"owt:setdlm-smax32@{commit}"
        # the marker the workflow's fetch job writes beside the run's models
        entry = {"checkpoint": {"owt": "owt:setdlm-smax32"}}
        fetch_checkpoint(model, entry, "owt", run / "models" / model, log=lambda _: None)
    # what the workflow saves as <run>/config.yaml; its substitutions open every table
    (run / "config.yaml").write_text("substitutions: [stand-in checkpoints]\n")
    results = load_results(run)
    params = {p.model: run_record(p).params for p in results.points}
    assert params["setdlm-smax32"]["checkpoint_revision"] == f"pinned {older}"
    assert params["setdlm-smax32-main"]["checkpoint_revision"] == f"unpinned {main_commit}"
    # the result finds its fetch marker and its table entry through the key@commit it records
    assert params["setdlm-smax32"]["checkpoint_commit"] == older
    assert params["setdlm-smax32-main"]["checkpoint_commit"] == main_commit
    assert params["setdlm-smax32"]["checkpoint_hub_id"] == "kuleshov-group/owt-setdlm-smax32"
    assert {p.published_checkpoint().key for p in results.points} == {"owt:setdlm-smax32"}
    (likelihood,) = build_tables(results, ["likelihood"])
    cells = {row["model"]: row["checkpoint"] for row in likelihood.rows}
    assert cells == {
        "setdlm-smax32": f"owt:setdlm-smax32 @ {older[:12]} (pinned)",
        "setdlm-smax32-main": f"owt:setdlm-smax32 @ {main_commit[:12]} (unpinned)",
    }
    assert any(note.startswith("checkpoint: the published key") for note in likelihood.notes)
    assert likelihood.notes[0] == (
        "SUBSTITUTED in this run (not the paper's setup): stand-in checkpoints"
    )


def test_a_published_ar_key_scores_gen_ppl_offline(cache, monkeypatch):
    """The rehearsal's gen-PPL evaluator (owt:ar, not gpt2-large): loadable offline from the
    cache, scored through our AR family, its identity naming the commit."""
    from setdlm.eval.gen_ppl import ARFamilyScorer, load_evaluator
    from setdlm.util.hub import unreachable

    hf_home, entries = cache
    use_cache(monkeypatch, hf_home)
    assert not unreachable("owt:ar")
    scorer = load_evaluator("owt:ar")
    assert isinstance(scorer, ARFamilyScorer)
    assert scorer.identity["name"] == f"owt:ar@{entries['kuleshov-group/owt-ar'].commits[-1]}"
    ids = scorer.encode("The cat sat on the mat .")
    assert scorer.next_token_log_probs(ids).shape == (len(ids) - 1,)
    assert unreachable("gsm8k:ar")  # not in this cache, and the Hub is offline
    with pytest.raises(ValueError, match="gen-PPL needs a causal LM"):
        load_evaluator("lm1b:setdlm-smax8")


def test_lm1b_likelihood_chunks_with_the_checkpoints_cls_and_sep(cache, monkeypatch, tmp_path):
    """bert-base-uncased names no BOS or EOS; the LM1B checkpoints' own ([CLS], [SEP]) chunk
    the held-out text (the rehearsal found every LM1B likelihood point failing here)."""
    from setdlm.data.text import ChunkedLMDataset
    from setdlm.tasks.likelihood import run_likelihood
    from setdlm.workflow.rehearsal import write_data

    hf_home, _ = cache
    use_cache(monkeypatch, hf_home)
    write_data(data_path(), tmp_path / "data", log=lambda _: None)
    monkeypatch.setenv("SETDLM_DATA_DIR", str(tmp_path / "data"))
    loaded = load_pretrained("lm1b:ar")
    tokenizer = load_tokenizer_for(loaded)
    assert tokenizer.bos_token_id is None and tokenizer.eos_token_id is None
    with pytest.raises(ValueError, match="needs bos and eos"):
        ChunkedLMDataset(["a sentence of words"], tokenizer, 8)
    metrics = run_likelihood(loaded.model, tokenizer, "lm1b", tmp_path / "out", limit=2)
    assert metrics["examples"] == 2
    rows = ChunkedLMDataset(["one two three four five six"], tokenizer, 4, 101, 102)
    assert rows.input_ids[:, 0].tolist() == [101, 101]


@pytest.mark.parametrize("key", ["owt:ar", "owt:mdlm"])
def test_the_owt_legacy_stand_ins_as_lightning_files_import_to_the_hub_folders_model(
    cache, monkeypatch, tmp_path, key
):
    """The OWT AR/MDLM stand-in also as the Lightning file the mdlm/bd3lms codebase saved
    (setdlm/checkpoints/legacy.py's input): its EMA weights are the Hub folder's, so the import
    and the Hub loader build the same model."""
    import torch

    from setdlm.checkpoints.legacy import load_lightning
    from setdlm.data.tokenizers import load_tokenizer

    hf_home, _ = cache
    use_cache(monkeypatch, hf_home)
    spec = zoo.resolve(key)
    gpt2 = load_tokenizer(data_path("tokenizers", "gpt2"))
    tokens = standins.task_tokens("owt", gpt2, spec.mask_token)
    path = tmp_path / "last.ckpt"
    path.write_bytes(standins.lightning_checkpoint(spec, tokens))
    imported = load_lightning(path, spec.family, n_heads=standins.HEADS)
    hub = load_pretrained(key).model
    assert imported.config.mask_token_id == hub.config.mask_token_id == 50257
    ours, theirs = imported.backbone.state_dict(), hub.backbone.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    raw = load_lightning(path, spec.family, use_ema=False, n_heads=standins.HEADS)
    assert not torch.equal(raw.backbone.vocab_embed.embedding, hub.backbone.vocab_embed.embedding)
