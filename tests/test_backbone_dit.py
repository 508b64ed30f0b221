"""DiT backbone: official checkpoint names, logits parity with the official fixtures, KV cache."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from setdlm.core.backbones.dit import DiT, DiTConfig
from setdlm.core.kv_cache import KVCache

DIT_CASES = ["ar-dit", "mdlm-dit", "bd3lm-s4-dit", "setdlm-smax8-dit"]

# The fixtures' float32 kernels (GEMM, layer norm, softmax) rounded differently from those of
# the development machine (AMD EPYC, AVX2; most likely the recording CPU had AVX-512): both are
# ~3e-4 away from a float64 forward and 1.5e-5..1.2e-4 (mean <= 7.3e-6) away from each other.
# The max/mean bounds below sit above that noise and below a real formula error (layer-norm eps
# 1e-6 instead of 1e-5 gives means of 2e-5..6e-5; exact GELU gives max 4e-3..1.5e-2). The order
# of the official float32 operations is checked bit for bit by
# test_logits_match_official_op_order instead.
FIXTURE_MAX_ATOL = 2.5e-4
FIXTURE_MEAN_ATOL = 1.5e-5
# A cached forward and a full forward differ by float32 rounding only (other GEMM shapes, other
# key counts): up to 5e-5 with these fixture weights, as much as a full forward of a shorter
# prefix differs from the longer one. The cache logic is therefore checked in float64, where
# any real mistake is orders of magnitude above the bound, and once in float32.
CACHE_ATOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def load_case(parity_dir, name: str) -> tuple[DiT, dict, dict[str, torch.Tensor]]:
    case = parity_dir / name
    backbone_config = json.loads((case / "config.json").read_text())["backbone_config"]
    model = DiT(DiTConfig.from_official(backbone_config)).eval()
    state = load_file(case / "model.safetensors")
    # the denoiser's own buffers (static_attention_mask) are not the backbone's
    model.load_state_dict(
        {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    )
    return model, backbone_config, load_file(case / "reference_tensors.safetensors")


def recorded_call(backbone_config: dict, tensors: dict[str, torch.Tensor]):
    """The fixture's backbone call, in our conventions: explicit positions and bool mask."""
    ids = tensors["eval_backbone_input_ids"]  # (B, Q)
    batch, q_len = ids.shape
    # no recorded positions: the official DIT used arange(Q) (BD3LM passes a (1, 2L) row)
    positions = tensors.get("eval_backbone_position_ids", torch.arange(q_len)[None])
    positions = positions.expand(batch, q_len)
    if backbone_config["causal_attention"]:
        # The AR denoiser hands its (B, Q) padding mask to the DIT, which drops it and runs
        # is_causal: padding is not masked, every query sees all earlier tokens.
        assert tensors["eval_backbone_attention_allowed"].shape == (batch, q_len)
        mask = torch.ones(q_len, q_len, dtype=torch.bool).tril().expand(batch, -1, -1)
    else:
        mask = tensors["eval_backbone_attention_allowed"][:, 0].bool()  # (B, Q, Q)
    return ids, positions, mask


def causal_mask(q_len: int, width: int, batch: int = 1) -> torch.Tensor:
    """(B, Q, width + Q): every cached slot, then causal among the new inputs."""
    return torch.ones(q_len, width + q_len, dtype=torch.bool).tril(width).expand(batch, -1, -1)


# ----------------------------------------------------------------- config and checkpoint names
@pytest.mark.parametrize("name", DIT_CASES)
def test_config_and_state_dict_names_match_official(parity_dir, name):
    backbone_config = json.loads((parity_dir / name / "config.json").read_text())["backbone_config"]
    config = DiTConfig.from_official(backbone_config)
    sizes = dataclasses.asdict(config) | {"head_dim": config.head_dim}
    expected_sizes = {"vocab_size": 128, "hidden_size": 64, "n_heads": 4, "num_layers": 2}
    expected_sizes |= {"cond_dim": 32, "dropout": 0.1, "length": 32, "head_dim": 16}
    assert {k: sizes[k] for k in expected_sizes} == expected_sizes
    assert config.adaln == backbone_config["adaln"]
    assert config.causal_attention == backbone_config["causal_attention"]

    official = json.loads((parity_dir / name / "keys.json").read_text())["tensors"]
    expected = {
        k.removeprefix("backbone."): v["shape"]
        for k, v in official.items()
        if k.startswith("backbone.")
    }
    ours = {k: list(v.shape) for k, v in DiT(config).state_dict().items()}
    assert ours == expected  # untied output layer even though tie_word_embeddings is true


def test_from_official_rejects_other_backbones():
    with pytest.raises(ValueError, match="not a DIT or DITLegacy"):
        DiTConfig.from_official({"_target_": "backbone_other.UNet"})


# ----------------------------------------------------------------- logits parity
@pytest.mark.parametrize("name", DIT_CASES)
def test_logits_match_official_fixture(parity_dir, name):
    model, backbone_config, tensors = load_case(parity_dir, name)
    ids, positions, mask = recorded_call(backbone_config, tensors)
    with torch.no_grad():
        # timesteps=None: the official denoisers never pass sigma, so adaLN ran with sigma=0
        logits = model(ids, positions, mask)
    reference = tensors["eval_backbone_logits"]
    diff = (logits - reference).abs()
    assert diff.max() <= FIXTURE_MAX_ATOL
    assert diff.mean() <= FIXTURE_MEAN_ATOL
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))


def official_order_forward(state, config: DiTConfig, ids, positions, additive, causal):
    """The official DIT forward written out op by op (packed qkv, RoPE on q/k/v with the v
    rotation set to identity, rotate_half, is_causal for the AR DiT), no KV cache."""
    dim, heads, head_dim = config.hidden_size, config.n_heads, config.head_dim
    x = state["vocab_embed.embedding"][ids]
    freqs = torch.einsum("bs,d->bsd", positions.float(), state["rotary_emb.inv_freq"])
    emb = torch.cat([freqs, freqs], dim=-1)
    cos = emb.cos()[:, :, None, None, :].repeat(1, 1, 3, 1, 1)
    sin = emb.sin()[:, :, None, None, :].repeat(1, 1, 3, 1, 1)
    cos[:, :, 2], sin[:, :, 2] = 1.0, 0.0

    def rotate_half(t):
        return torch.cat((-t[..., head_dim // 2 :], t[..., : head_dim // 2]), dim=-1)

    def norm(t, key):
        return F.layer_norm(t, [dim], weight=state[key])

    def linear(t, key, bias=True):
        return F.linear(t, state[f"{key}.weight"], state[f"{key}.bias"] if bias else None)

    cond = None
    if config.adaln:
        half = 128
        sigma = torch.zeros(ids.shape[0])
        freq = torch.exp(-math.log(10000) * torch.arange(start=0, end=half).float() / half)
        args = sigma[:, None].float() * freq[None]
        features = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        cond = F.silu(linear(F.silu(linear(features, "sigma_map.mlp.0")), "sigma_map.mlp.2"))
    one = torch.ones(1)
    for i in range(config.num_layers):
        p = f"blocks.{i}."
        batch, seq = x.shape[:2]
        skip = x
        h = norm(x, p + "norm1.weight")
        if cond is not None:
            mods = linear(cond, p + "adaLN_modulation")[:, None].chunk(6, dim=2)
            h = h * (1 + mods[1]) + mods[0]
        qkv = linear(h, p + "attn_qkv", bias=False).view(batch, seq, 3, heads, head_dim)
        qkv = (qkv * cos + rotate_half(qkv) * sin).transpose(1, 3)
        attn = F.scaled_dot_product_attention(
            qkv[:, :, 0],
            qkv[:, :, 1],
            qkv[:, :, 2],
            attn_mask=additive,
            is_causal=causal,
            scale=1 / math.sqrt(head_dim),
        )
        attn = linear(attn.transpose(1, 2).reshape(batch, seq, dim), p + "attn_out", bias=False)
        x = skip + (mods[2] if cond is not None else one) * attn
        h = norm(x, p + "norm2.weight")
        if cond is not None:
            h = h * (1 + mods[4]) + mods[3]
        h = linear(F.gelu(linear(h, p + "mlp.0"), approximate="tanh"), p + "mlp.2")
        x = x + (mods[5] if cond is not None else one) * h
    x = norm(x, "output_layer.norm_final.weight")
    if cond is not None:
        shift, scale = linear(cond, "output_layer.adaLN_modulation")[:, None].chunk(2, dim=2)
        x = x * (1 + scale) + shift
    return linear(x, "output_layer.linear")


@pytest.mark.parametrize("name", DIT_CASES)
def test_logits_match_official_op_order(parity_dir, name):
    """Platform-independent: the same float32 operations as the official code, in its order
    and layout (bit-identical here), so the speed-ups (RoPE on q/k only via a roll, explicit
    causal mask) change no bits."""
    model, backbone_config, tensors = load_case(parity_dir, name)
    ids, positions, mask = recorded_call(backbone_config, tensors)
    causal = backbone_config["causal_attention"]
    additive = None
    if not causal:
        additive = torch.zeros(mask.shape)[:, None]
        additive.masked_fill_(~mask[:, None], torch.finfo(torch.float32).min)
    state = model.state_dict()
    with torch.no_grad():
        ours = model(ids, positions, mask)
        official = official_order_forward(state, model.config, ids, positions, additive, causal)
    assert (ours - official).abs().max() <= 1e-6


# ----------------------------------------------------------------- time conditioning, dropout
def test_adaln_timesteps(parity_dir):
    model, backbone_config, tensors = load_case(parity_dir, "mdlm-dit")
    ids, positions, mask = recorded_call(backbone_config, tensors)
    with torch.no_grad():
        default = model(ids, positions, mask)
        zeros = model(ids, positions, mask, timesteps=torch.zeros(2))
        half = model(ids, positions, mask, timesteps=torch.full((2,), 0.5))
        mixed = model(ids, positions, mask, timesteps=torch.tensor([0.0, 0.5]))
    assert torch.equal(default, zeros)
    assert (half - zeros).abs().max() > 1.0  # the conditioning is live
    assert torch.equal(mixed[0], zeros[0]) and torch.equal(mixed[1], half[1])  # one per row
    with pytest.raises(ValueError, match="timesteps"):
        model(ids, positions, mask, timesteps=torch.zeros(2, ids.shape[1]))

    plain, plain_config, plain_tensors = load_case(parity_dir, "setdlm-smax8-dit")
    ids, positions, mask = recorded_call(plain_config, plain_tensors)
    with torch.no_grad():
        assert torch.equal(
            plain(ids, positions, mask), plain(ids, positions, mask, timesteps=torch.ones(2))
        )


def test_dropout_only_in_training(parity_dir):
    model, backbone_config, tensors = load_case(parity_dir, "setdlm-smax8-dit")
    ids, positions, mask = recorded_call(backbone_config, tensors)
    with torch.no_grad():
        evaluated = model(ids, positions, mask)
        assert torch.equal(evaluated, model(ids, positions, mask))
        model.train()
        torch.manual_seed(0)
        trained = model(ids, positions, mask)
        assert (trained - evaluated).abs().max() > 1e-3

        no_dropout = DiT(dataclasses.replace(model.config, dropout=0.0))
        no_dropout.load_state_dict(model.state_dict())
        no_dropout.train()
        assert torch.equal(no_dropout(ids, positions, mask), evaluated)


def test_fully_masked_rows_stay_finite(parity_dir):
    model, _, tensors = load_case(parity_dir, "mdlm-dit")
    ids = tensors["eval_backbone_input_ids"][:1, :8]
    mask = torch.ones(1, 8, 8, dtype=torch.bool)
    mask[:, 5:] = False  # padding queries attend to nothing
    mask[:, :, 5:] = False  # and nobody attends to them
    with torch.no_grad():
        logits = model(ids, torch.arange(8)[None], mask)
        assert torch.isfinite(logits).all()
        # what the kept rows see is unchanged by those rows
        full = model(ids[:, :5], torch.arange(5)[None], mask[:, :5, :5])
    assert (logits[:, :5] - full).abs().max() <= CACHE_ATOL[torch.float32]


def test_mask_shape_is_checked(parity_dir):
    model, _, tensors = load_case(parity_dir, "ar-dit")
    ids = tensors["eval_backbone_input_ids"][:1, :4]
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, torch.arange(4)[None], torch.ones(1, 4, 5, dtype=torch.bool))


# ----------------------------------------------------------------- KV cache
@pytest.mark.parametrize(
    "name, dtype",
    [("ar-dit", torch.float64), ("mdlm-dit", torch.float64), ("ar-dit", torch.float32)],
)
def test_cache_incremental_decoding_matches_full_forward(parity_dir, name, dtype):
    model, _, tensors = load_case(parity_dir, name)
    model.to(dtype)
    atol = CACHE_ATOL[dtype]
    ids = tensors["eval_backbone_input_ids"][:1, :20]  # (1, 20)
    positions = torch.arange(20)[None]
    # adaLN: a non-zero noise level, so that the conditioning must broadcast over the cache step
    timesteps = torch.tensor([0.3], dtype=dtype) if model.config.adaln else None
    with torch.no_grad():
        full = model(ids, positions, causal_mask(20, 0), timesteps=timesteps)  # (1, 20, V)

        cache = KVCache(model.num_layers, batch_size=1)
        # (start, end) of each forward: a 5-token prefill, single tokens, then chunks
        chunks = [(0, 5), *((i, i + 1) for i in range(5, 12)), (12, 16), (16, 20)]
        for start, end in chunks:
            span = positions[:, start:end]
            mask = causal_mask(end - start, cache.width)
            logits = model(ids[:, start:end], span, mask, cache=cache, timesteps=timesteps)
            assert (logits - full[:, start:end]).abs().max() <= atol, (start, end)
            cache.commit(torch.ones_like(span, dtype=torch.bool), span)
    assert int(cache.lengths) == 20


def test_cache_ragged_rows_match_each_row_alone(parity_dir):
    model, _, tensors = load_case(parity_dir, "ar-dit")
    model.double()
    atol = CACHE_ATOL[torch.float64]
    ids = tensors["eval_backbone_input_ids"][:, :12]  # (2, 12): two different rows
    positions = torch.arange(12)[None]
    with torch.no_grad():
        full = model(ids, positions.expand(2, -1), causal_mask(12, 0, batch=2))

        # Prefill 7 inputs per row but keep 4 for row 0 and 7 for row 1: ragged lengths.
        cache = KVCache(model.num_layers, batch_size=2)
        model(ids[:, :7], positions[:, :7].expand(2, -1), causal_mask(7, 0, 2), cache=cache)
        keep = torch.ones(2, 7, dtype=torch.bool)
        keep[0, 4:] = False
        cache.commit(keep, positions[:, :7].expand(2, -1))
        assert cache.lengths.tolist() == [4, 7]

        def step(q_len: int) -> torch.Tensor:
            # each row continues at its own length: slots past it are stale and masked out
            span = cache.lengths[:, None] + torch.arange(q_len)  # (2, Q) positions
            new_ids = torch.gather(ids, 1, span)
            mask = torch.cat(
                (
                    cache.key_valid()[:, None].expand(-1, q_len, -1),
                    torch.ones(q_len, q_len, dtype=torch.bool).tril().expand(2, -1, -1),
                ),
                dim=-1,
            )  # (2, Q, width + Q)
            logits = model(new_ids, span, mask, cache=cache)
            for row in range(2):
                expected = full[row, span[row]]
                assert (logits[row] - expected).abs().max() <= atol
                alone = KVCache(model.num_layers, batch_size=1)
                length = int(cache.lengths[row])
                prefix = ids[row : row + 1, :length]
                model(prefix, positions[:, :length], causal_mask(length, 0), cache=alone)
                alone.commit(torch.ones_like(prefix, dtype=torch.bool), positions[:, :length])
                single = model(
                    new_ids[row : row + 1], span[row : row + 1], causal_mask(q_len, length), alone
                )
                assert (logits[row] - single[0]).abs().max() <= atol
            cache.commit(torch.ones_like(span, dtype=torch.bool), span)
            return logits

        step(3)  # lengths 4 -> 7 and 7 -> 10
        step(1)
        assert cache.lengths.tolist() == [8, 11]


def test_cache_with_permuted_positions_reproduces_setdlm_forward(parity_dir):
    """SetDLM decoding order: row 0 of the fixture (no padding) decoded one permuted position at a
    time. Each forward feeds the clean token (x0 stream) and the mask query (x_t stream) of the
    next position; only the clean one is committed. Both must equal the full 2L forward."""
    model, backbone_config, tensors = load_case(parity_dir, "setdlm-smax8-dit")
    ids, positions, mask = recorded_call(backbone_config, tensors)
    length = ids.shape[1] // 2
    model.double()
    atol = CACHE_ATOL[torch.float64]
    with torch.no_grad():
        full = model(ids, positions, mask)[:1]  # (1, 2L, V)
    assert (full.float() - tensors["eval_backbone_logits"][:1]).abs().max() <= FIXTURE_MAX_ATOL
    order = positions[0, :length]  # the permutation (original positions in decoding order)
    assert not torch.equal(order, torch.arange(length))

    cache = KVCache(model.num_layers, batch_size=1)
    new_inputs = torch.eye(2, dtype=torch.bool)  # x0 query sees itself, x_t query sees itself
    with torch.no_grad():
        for i in range(length):
            step_ids = ids[:1, [i, length + i]]  # (1, 2): clean token, MASK
            step_pos = order[[i, i]][None]  # both at the same original position
            step_mask = torch.cat((torch.ones(2, cache.width, dtype=torch.bool), new_inputs), 1)
            logits = model(step_ids, step_pos, step_mask[None], cache=cache)
            assert (logits[0, 0] - full[0, i]).abs().max() <= atol, i
            assert (logits[0, 1] - full[0, length + i]).abs().max() <= atol, i
            cache.commit(torch.tensor([[True, False]]), step_pos)

        # Keys are stored after RoPE: reversing the slot order changes no logit.
        query_ids, query_pos = ids[:1, -1:], order[-1:][None]
        query_mask = torch.ones(1, 1, cache.width + 1, dtype=torch.bool)
        query_mask[0, 0, -2] = False  # the x_t query of the last position skips its clean token
        before = model(query_ids, query_pos, query_mask, cache=cache)
        cache.commit_prefix([0], query_pos)  # drop the query: nothing is kept
        reverse = torch.arange(length - 1, -1, -1)
        for layer in range(model.num_layers):
            keys, values = cache.read(layer)
            keys[:] = keys[:, :, reverse].clone()
            values[:] = values[:, :, reverse].clone()
        query_mask = query_mask.clone()
        query_mask[0, 0, -2], query_mask[0, 0, 0] = True, False
        after = model(query_ids, query_pos, query_mask, cache=cache)
    assert (after - before).abs().max() <= atol
    assert (before[0, 0] - full[0, -1]).abs().max() <= atol
