"""Published checkpoints: the key table, loading by key or Hub id, malformed folders."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from setdlm.checkpoints import zoo
from setdlm.checkpoints.folders import CheckpointError, load_model
from setdlm.checkpoints.zoo import PUBLISHED, load_pretrained, resolve
from setdlm.core.decoding import DecodeConfig
from setdlm.model import SlidingWindowOptions


def test_the_table_covers_every_task_and_family():
    assert len(PUBLISHED) == 4 * 8
    gsm8k = resolve("gsm8k:setdlm-smax16")
    assert gsm8k.hub_id == "kuleshov-group/setdlm-gsm8k-smax16"  # family first for GSM8K
    assert (gsm8k.d, gsm8k.window, gsm8k.fht_cache_order, gsm8k.keep_clean_bos) == (
        8,
        8,
        True,
        True,
    )
    assert resolve("gsm8k:setdlm-d8") is gsm8k  # dN is an alias of smax2N
    assert resolve("cnndm:setdlm-smax32").hub_id == "kuleshov-group/cnndm-setdlm-smax32"
    assert resolve("kuleshov-group/lm1b-bd3lm-s8").block_size == 8
    assert resolve("owt:ar").loadable and "DITLegacy" in resolve("owt:ar").note
    assert resolve("lm1b:mdlm").mask_token == "[MASK]"
    assert resolve("nothing:here") is None


MAIN_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(tmp_path, monkeypatch, repo_id: str, source, commit: str = MAIN_COMMIT) -> None:
    """A Hugging Face cache holding ``source`` as the main revision of ``repo_id``."""
    cache = tmp_path / "hub"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(source, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_loading_by_key_fetches_from_the_hub_and_applies_the_table(
    parity_dir, tmp_path, monkeypatch
):
    fixture = parity_dir / "setdlm-smax8-qwen3"
    _hub_cache(tmp_path, monkeypatch, "kuleshov-group/setdlm-gsm8k-smax8", fixture)
    model, spec, folder = load_pretrained("gsm8k:setdlm-smax8")
    assert (folder / "config.json").exists()
    assert spec.key == "gsm8k:setdlm-smax8"
    schedule = model.config.schedule
    assert (schedule.N, schedule.d, schedule.M) == (32, 4, 8)  # N from the checkpoint length
    assert model.config.keep_clean_bos  # forced for SetDLM, as the official loader does
    by_id = load_pretrained("kuleshov-group/setdlm-gsm8k-smax8").model
    direct = load_model(fixture)
    prompt = [[140, 17, 42, 9]]
    window = SlidingWindowOptions(window=spec.window)
    config = DecodeConfig(max_new_tokens=8, policy=window, confidence_threshold=0.5)
    assert model.generate(prompt, config).output_ids == direct.generate(prompt, config).output_ids
    assert torch.equal(by_id.backbone.model.lm_head.weight, direct.backbone.model.lm_head.weight)


def test_a_pinned_revision_loads_that_commit_and_a_moved_one_is_an_error(
    parity_dir, tmp_path, monkeypatch
):
    fixture = parity_dir / "mdlm-qwen3"
    repo_id = "kuleshov-group/gsm8k-mdlm"
    _hub_cache(tmp_path, monkeypatch, repo_id, fixture)
    loaded = load_pretrained("gsm8k:mdlm")
    assert loaded.revision == MAIN_COMMIT  # unpinned: main, and the commit is recorded
    assert loaded.source("gsm8k:mdlm") == f"gsm8k:mdlm@{MAIN_COMMIT}"
    assert load_pretrained("gsm8k:mdlm", revision=MAIN_COMMIT).revision == MAIN_COMMIT
    # the pin names a commit the cache does not hold (main moved on): refused, with both commits
    pinned = "fedcba9876543210fedcba9876543210fedcba98"
    spec = dataclasses.replace(PUBLISHED["gsm8k:mdlm"], revision=pinned)
    monkeypatch.setitem(zoo.PUBLISHED, "gsm8k:mdlm", spec)
    with pytest.raises(CheckpointError, match=f"pinned revision {pinned}.*holds {MAIN_COMMIT}"):
        load_pretrained("gsm8k:mdlm")
    # a folder outside a Hub cache has no commit; its source is its name
    assert load_pretrained(str(fixture)).source("x") == "x"


def test_pins_are_read_from_the_revisions_file_and_checked(tmp_path, monkeypatch):
    pins = tmp_path / "published_revisions.json"
    monkeypatch.setattr(zoo, "REVISIONS_FILE", pins)
    assert zoo.pinned_revisions() == {}
    commit = "ab" * 20
    pins.write_text(json.dumps({"gsm8k:ar": commit}))
    assert zoo._published()["gsm8k:ar"].revision == commit
    assert zoo._published()["gsm8k:mdlm"].revision is None
    pins.write_text(json.dumps({"gsm8k:ar": "main"}))
    with pytest.raises(ValueError, match="not 40-hex-digit commits"):
        zoo.pinned_revisions()
    pins.write_text(json.dumps({"gsm8k:nothing": commit}))
    with pytest.raises(ValueError, match="unknown keys"):
        zoo._published()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="offline"):
        zoo.pin_revisions(["gsm8k:ar"])


def test_unloadable_and_unknown_names_fail_clearly(tmp_path, monkeypatch):
    spec = dataclasses.replace(PUBLISHED["owt:mdlm"], loadable=False, note="withdrawn")
    monkeypatch.setitem(zoo.PUBLISHED, "owt:mdlm", spec)
    with pytest.raises(CheckpointError, match="withdrawn"):
        load_pretrained("owt:mdlm")
    with pytest.raises(ValueError, match="not a folder, a known key"):
        load_pretrained("gsm8k-setdlm")


class _Exploit:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickle_that_carries_code_is_refused_before_running_it(parity_dir, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(parity_dir / "ar-dit", folder)
    (folder / "model.safetensors").unlink()
    torch.save({"backbone.vocab_embed.embedding": _Exploit()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused or unreadable pickle"):
        load_model(folder)
    assert "this must never run" not in capsys.readouterr().out


def test_official_layout_with_missing_or_truncated_weights(parity_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(parity_dir / "mdlm-dit", folder)
    weights = load_file(folder / "model.safetensors")
    weights.pop("backbone.sigma_map.mlp.0.weight")
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(
        CheckpointError, match="missing tensors \\['backbone.sigma_map.mlp.0.weight'\\]"
    ):
        load_model(folder)
    data = (parity_dir / "mdlm-dit" / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model(folder)
