"""Our own model folders: a round trip is exact, and bad folders fail with a clear error."""

from __future__ import annotations

import json

import pytest
import torch
from model_factory import BACKBONES, FAMILIES, decode_config, prompts, tiny_model
from safetensors.torch import load_file, save_file

from setdlm.checkpoints.folders import CheckpointError, load_model, save_model
from setdlm.core.decoding import DecodeConfig


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_reproduces_logits_and_decoding(tmp_path, family, backbone):
    model = tiny_model(family, backbone)
    folder = save_model(model, tmp_path / "model")
    loaded = load_model(folder)
    assert loaded.config == model.config
    ids = torch.tensor(prompts(1, lengths=(8,)))
    positions = torch.arange(8)[None]
    with torch.no_grad():
        assert torch.equal(
            model.backbone(ids, positions, None), loaded.backbone(ids, positions, None)
        )
    config = decode_config(family, max_new_tokens=6, block_size=4 if family == "mdlm" else None)
    assert (
        model.generate(prompts(2), config).output_ids
        == loaded.generate(prompts(2), config).output_ids
    )


def test_saving_over_an_existing_folder_replaces_it(tmp_path):
    save_model(tiny_model("ar", seed=0), tmp_path / "model")
    second = tiny_model("ar", seed=1)
    save_model(second, tmp_path / "model")
    loaded = load_model(tmp_path / "model")
    assert all(
        torch.equal(a, b)
        for a, b in zip(loaded.state_dict().values(), second.state_dict().values(), strict=True)
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_missing_unexpected_and_misshaped_tensors_are_listed_together(tmp_path):
    folder = save_model(tiny_model("setdlm"), tmp_path / "model")
    state = load_file(folder / "model.safetensors")
    state.pop("backbone.blocks.0.attn_out.weight")
    state["backbone.extra"] = torch.zeros(1)
    state["backbone.vocab_embed.embedding"] = torch.zeros(3, 3)
    save_file(state, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    del config["weights_sha256"]  # a folder written before hashes were recorded
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    message = str(error.value)
    assert "missing tensors ['backbone.blocks.0.attn_out.weight']" in message
    assert "unexpected tensors ['backbone.extra']" in message
    assert "backbone.vocab_embed.embedding: checkpoint (3, 3)" in message


def test_truncated_weights_and_bad_config_fail_clearly(tmp_path):
    folder = save_model(tiny_model("ar"), tmp_path / "model")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception, match="(?i)safetensor|incomplete|invalid|truncat"):
        load_model(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(folder)
    (folder / "config.json").write_text(
        json.dumps({"format": "setdlm-model/1", "model": {"family": "ar", "colour": 1}})
    )
    with pytest.raises(ValueError, match="unknown keys \\['colour'\\]"):
        load_model(folder)


def test_the_same_weights_make_the_same_bytes_and_carry_their_family(tmp_path):
    model = tiny_model("setdlm", "dit")
    copies = [save_model(model, tmp_path / f"copy-{i}") / "model.safetensors" for i in range(6)]
    assert len({path.read_bytes() for path in copies}) == 1  # nothing written in random order
    swapped = tmp_path / "copy-0" / "config.json"
    config = json.loads(swapped.read_text())
    config["model"] = tiny_model("bd3lm", "dit").config.to_dict()  # another family's config
    swapped.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="holds the weights of a setdlm model"):
        load_model(tmp_path / "copy-0")


def test_flipped_bytes_in_the_weights_are_refused_and_the_hash_is_in_every_identity(tmp_path):
    """A few flipped bytes still make a readable safetensors file with wrong weights: the sha256
    recorded at save time refuses it. The hash is part of a result's identity, so retrained
    weights never reuse samples decoded with the old ones."""
    from setdlm.eval.runner import generation_identity

    model = tiny_model("mdlm")
    folder = save_model(model, tmp_path / "model")
    recorded = json.loads((folder / "config.json").read_text())["weights_sha256"]
    loaded = load_model(folder)
    assert loaded.weights_sha256 == recorded
    identity = generation_identity("t", {}, loaded, "m", DecodeConfig(), 0)
    assert identity["weights_sha256"] == recorded
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])  # inside the last tensor's values
    path.write_bytes(bytes(data))
    assert load_file(path)  # still a readable file
    with pytest.raises(CheckpointError, match="does not match the .* recorded in"):
        load_model(folder)
    retrained = save_model(tiny_model("mdlm", seed=1), tmp_path / "model")
    other = generation_identity("t", {}, load_model(retrained), "m", DecodeConfig(), 0)
    assert other["weights_sha256"] != recorded and other["model_source"] == "m"


def test_a_save_killed_midway_leaves_nothing_behind_after_the_next_one(tmp_path):
    """A kill during the final export leaves a staging folder with weights; the next save of
    that folder removes it (and a half-swapped old folder)."""
    folder = tmp_path / "model"
    stale = tmp_path / ".model.tmp-99999"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half-written weights")
    (tmp_path / ".model.old-99999").mkdir()
    save_model(tiny_model("ar"), folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert load_model(folder).config.family == "ar"
