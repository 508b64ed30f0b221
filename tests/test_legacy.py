"""The OWT AR/MDLM checkpoints of the mdlm/bd3lms codebase: Hub folders whose backbone is a
DITLegacy, and raw Lightning .ckpt files, loaded without running the code they name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_factory import decode_config, prompts, tiny_model

from setdlm.baselines.mdlm import SemiAutoregressiveOptions
from setdlm.checkpoints.folders import CheckpointError, load_model
from setdlm.checkpoints.legacy import load_lightning
from setdlm.cli import main
from setdlm.core.decoding import DecodeConfig


def test_a_hub_folder_with_a_dit_legacy_backbone_and_no_noise_config_loads(parity_dir, tmp_path):
    """The pushed OWT folders name ``backbone_dit_legacy.DITLegacy`` and save no noise_config
    (the official loader attaches LinearNoise): same modules and names as DIT."""
    folder = tmp_path / "owt-mdlm"
    shutil.copytree(parity_dir / "mdlm-dit", folder)
    config = json.loads((folder / "config.json").read_text())
    config["backbone_config"]["_target_"] = "backbone_dit_legacy.DITLegacy"
    config["noise_config"] = None
    (folder / "config.json").write_text(json.dumps(config))
    legacy, current = load_model(folder), load_model(parity_dir / "mdlm-dit")
    assert legacy.config.schedule == current.config.schedule  # the plain LinearNoise
    prompt = [[101, 5, 9, 17]]
    decode = DecodeConfig(max_new_tokens=8, policy=SemiAutoregressiveOptions(block_size=8))
    assert legacy.generate(prompt, decode).output_ids == current.generate(prompt, decode).output_ids


class _Tokenizer:
    """Stands for the pickled tokenizer in hyper_parameters; unpickling it must run nothing."""

    def __init__(self, witness: str):
        self.witness = witness

    def __reduce__(self):
        return (open, (self.witness, "w"))  # would create the witness file if it ran


def _lightning_file(tmp_path, family: str, compiled: bool):
    """A .ckpt laid out as the mdlm/bd3lms trainer writes it, from a tiny random DiT."""
    source = tiny_model(family, "dit", length=32)
    prefix = "backbone._orig_mod." if compiled else "backbone."
    state = {prefix + k.removeprefix("backbone."): v for k, v in source.state_dict().items()}
    state["sampling_eps_min"] = torch.tensor(1e-3)
    ema = [
        p.detach() + 0.01 * (i + 1) for i, (_, p) in enumerate(source.backbone.named_parameters())
    ]
    witness = tmp_path / "witness"
    checkpoint = {
        "state_dict": state,
        "ema": {"decay": 0.9999, "num_updates": 3, "shadow_params": ema},
        "hyper_parameters": {"tokenizer": _Tokenizer(str(witness)), "config": {"lr": 3e-4}},
        "global_step": 300000,
    }
    path = tmp_path / f"{family}.ckpt"
    torch.save(checkpoint, path)
    return path, source, ema, witness


@pytest.mark.parametrize("family", ["mdlm", "ar"])
def test_a_lightning_checkpoint_loads_its_ema_weights_and_runs_no_pickled_code(tmp_path, family):
    path, source, ema, witness = _lightning_file(tmp_path, family, compiled=family == "mdlm")
    heads = source.config.backbone["n_heads"]
    model = load_lightning(path, family, n_heads=heads, length=32)
    assert not witness.exists()  # the pickled "tokenizer" was never called
    for (name, parameter), expected in zip(model.backbone.named_parameters(), ema, strict=True):
        assert torch.equal(parameter, expected), name
    assert torch.equal(model.backbone.rotary_emb.inv_freq, source.backbone.rotary_emb.inv_freq)
    assert model.config.mask_token_id == model.config.vocab_size - 1  # GPT-2 + <|fim_middle|>
    assert model.config.backbone["adaln"] == (family == "mdlm")
    assert model.config.backbone["causal_attention"] == (family == "ar")
    raw = load_lightning(path, family, use_ema=False, n_heads=heads, length=32)
    raw_state, source_state = raw.backbone.state_dict(), source.backbone.state_dict()
    assert raw_state.keys() == source_state.keys()
    assert all(torch.equal(raw_state[k], source_state[k]) for k in raw_state)
    block = 8 if family == "mdlm" else None
    output = model.generate(prompts(1), decode_config(family, max_new_tokens=6, block_size=block))
    assert output.num_generated == [6]


def test_import_legacy_writes_a_model_folder(tmp_path, capsys):
    path, source, ema, _ = _lightning_file(tmp_path, "mdlm", compiled=False)
    out = tmp_path / "imported"
    heads = str(source.config.backbone["n_heads"])
    argv = ["import-legacy", str(path), "--family", "mdlm", "--out", str(out), "--heads", heads]
    assert main([*argv, "--length", "32"]) == 0
    assert "EMA weights" in capsys.readouterr().out
    model = load_model(out)
    assert torch.equal(next(model.backbone.parameters()), ema[0])


def test_wrong_family_or_missing_ema_is_a_clear_error(tmp_path):
    path, _, _, _ = _lightning_file(tmp_path, "mdlm", compiled=False)
    with pytest.raises(CheckpointError, match="adaLN off, but these weights have it on"):
        load_lightning(path, "ar", n_heads=2, length=32)
    checkpoint = torch.load(path, weights_only=False)
    del checkpoint["ema"], checkpoint["hyper_parameters"]
    torch.save(checkpoint, path)
    with pytest.raises(CheckpointError, match="no ema.shadow_params"):
        load_lightning(path, "mdlm", n_heads=2, length=32)
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable Lightning checkpoint"):
        load_lightning(tmp_path / "garbage.ckpt", "mdlm")
