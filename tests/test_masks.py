"""Each mask builder against a brute-force, element-by-element definition from SPEC §2."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from setdlm.core import masks


def brute_two_stream(length: int, block_size: int) -> torch.Tensor:
    allowed = torch.zeros(2 * length, 2 * length, dtype=torch.bool)
    for q in range(2 * length):
        for k in range(2 * length):
            q_noisy, k_noisy = q >= length, k >= length
            q_block, k_block = (q % length) // block_size, (k % length) // block_size
            if not q_noisy and not k_noisy:
                allowed[q, k] = k_block <= q_block
            elif q_noisy and not k_noisy:
                allowed[q, k] = k_block < q_block
            elif q_noisy and k_noisy:
                allowed[q, k] = k_block == q_block
    return allowed


def test_set_causal_matches_the_spec_example():
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 0, 0, 0],
            [1, 0, 0, 0, 0, 1, 0, 0],
            [1, 1, 0, 0, 0, 0, 1, 0],
            [1, 1, 1, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(masks.set_causal_mask(4), expected)


@pytest.mark.parametrize("length,block_size", [(4, 1), (8, 2), (12, 4), (12, 3), (16, 16)])
def test_two_stream_mask_equals_brute_force(length, block_size):
    assert torch.equal(
        masks.two_stream_mask(length, block_size), brute_two_stream(length, block_size)
    )


@pytest.mark.parametrize("length", [1, 5, 9])
def test_single_stream_masks_equal_brute_force(length):
    causal = [[k <= q for k in range(length)] for q in range(length)]
    assert torch.equal(masks.causal_mask(length), torch.tensor(causal))
    block = [[k // 3 <= q // 3 for k in range(length)] for q in range(length)]
    assert torch.equal(masks.block_causal_mask(length, 3), torch.tensor(block))
    assert masks.bidirectional_mask(length).all()


def test_padding_blocks_padded_queries_and_keys():
    length = 6
    valid = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    padded = masks.with_padding(masks.two_stream_mask(length, 2), valid)
    base = brute_two_stream(length, 2)
    for b in range(2):
        for q in range(2 * length):
            for k in range(2 * length):
                real = bool(valid[b, q % length] and valid[b, k % length])
                assert padded[b, q, k] == (base[q, k] and real)


def test_clean_then_noisy_decode_mask():
    mask = masks.clean_then_noisy_mask(2, 3, clean_causal=True, noisy_see_each_other=False)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [1, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    block = masks.clean_then_noisy_mask(2, 2, clean_causal=False, noisy_see_each_other=True)
    expected_block = torch.tensor(
        [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(block, expected_block)


@pytest.mark.parametrize(
    "case,block_size",
    [
        ("bd3lm-s4-dit", 4),
        ("setdlm-smax8-dit", 1),
        ("bd3lm-s4-qwen3", 4),
        ("setdlm-smax8-qwen3", 1),
    ],
)
def test_training_masks_equal_the_official_ones(parity_dir, case, block_size):
    """The official code's recorded eval-loss mask is our two-stream mask with padding."""
    import json

    reference = json.loads((parity_dir / case / "reference.json").read_text())
    recorded = load_file(parity_dir / case / "reference_tensors.safetensors")
    allowed = recorded["eval_backbone_attention_allowed"][:, 0].bool()  # (B, 2L, 2L)
    valid = torch.tensor(reference["loss_inputs"]["attention_mask"]).bool()
    if block_size == 1:  # SetDLM: padding sits at the end of the order, as in the input
        perm = torch.tensor(reference["eval_loss"]["perm_indices"])
        valid = torch.gather(valid, 1, perm)
    length = valid.shape[1]
    ours = masks.with_padding(masks.two_stream_mask(length, block_size), valid)
    assert torch.equal(ours, allowed)
