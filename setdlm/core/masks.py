"""Attention masks, as (…, Q, K) bool tensors where True means "query may attend to key".

Training uses the 2L layout of SPEC §2: the backbone sees [clean stream x0 | noisy stream x_t],
each of length L. Index i < L is clean token p(i) = i, index i >= L is noisy token p(i) = i - L.
With S the block size and blk(i) = p(i) // S:

    x0 -> x0 : blk(k) <= blk(q)      (block-causal over clean tokens)
    xt -> x0 : blk(k) <  blk(q)      (strictly earlier clean blocks)
    xt -> xt : blk(k) == blk(q)      (own block, bidirectional)
    x0 -> xt : never

BD3LM uses it with its block size S. SetDLM uses S = 1 on the *permuted* sequence: index i then
holds the i-th token of the sampled order, so "earlier block" means "earlier in the order", and
the backbone still receives the true positions as position ids. Decoding-time masks cover the
inputs of one forward (the KV cache columns are added by the engine).
"""

from __future__ import annotations

import functools

import torch


def causal_mask(length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(L, L): each token sees itself and every earlier token (AR)."""
    index = torch.arange(length, device=device)
    return index[None, :] <= index[:, None]


def block_causal_mask(length: int, block_size: int, device=None) -> torch.Tensor:
    """(L, L): each token sees its own block and every earlier block."""
    block = torch.arange(length, device=device) // block_size
    return block[None, :] <= block[:, None]


def bidirectional_mask(length: int, device=None) -> torch.Tensor:
    """(L, L): every token sees every token (MDLM)."""
    return torch.ones(length, length, dtype=torch.bool, device=device)


def two_stream_mask(length: int, block_size: int, device=None) -> torch.Tensor:
    """(2L, 2L) block-diffusion mask over [x0 | x_t]; block_size 1 gives the set-causal mask."""
    index = torch.arange(2 * length, device=device)
    noisy = index >= length  # (2L,)
    block = (index % length) // block_size  # (2L,)
    q_noisy, k_noisy = noisy[:, None], noisy[None, :]
    q_block, k_block = block[:, None], block[None, :]
    clean_to_clean = ~q_noisy & ~k_noisy & (k_block <= q_block)
    noisy_to_clean = q_noisy & ~k_noisy & (k_block < q_block)
    noisy_to_noisy = q_noisy & k_noisy & (k_block == q_block)
    return clean_to_clean | noisy_to_clean | noisy_to_noisy


def set_causal_mask(length: int, device=None) -> torch.Tensor:
    """(2L, 2L) SetDLM training mask, indexed in the sampled order (SPEC §2)."""
    return two_stream_mask(length, 1, device=device)


def with_padding(mask: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """AND a (Q, K) mask with (B, N) key/query validity; streams repeat ``valid`` to Q = K.

    mask: (Q, K) with Q = K = streams * N. valid: (B, N) bool, False for padding.
    Returns (B, Q, K): padding neither attends nor is attended to.
    """
    streams = mask.shape[-1] // valid.shape[-1]
    valid = valid.bool().repeat(1, streams)  # (B, Q)
    return mask[None] & valid[:, :, None] & valid[:, None, :]


# ----------------------------------------------------------------------------- decoding
@functools.lru_cache(maxsize=4096)
def clean_then_noisy_mask(
    num_clean: int, num_noisy: int, clean_causal: bool, noisy_see_each_other: bool
) -> torch.Tensor:
    """(C + M, C + M) mask for one forward whose inputs are C clean tokens then M noisy ones.

    Clean inputs see each other causally (SetDLM: newly committed tokens enter the cache in
    order) or all together (BD3LM: a finished block). Noisy inputs see every clean input and
    either only themselves (SetDLM: each masked position is predicted from the committed
    context alone) or each other (a BD3LM block). Decoding asks for the same few shapes over
    and over, so results are cached: treat them as read-only.
    """
    total = num_clean + num_noisy
    mask = torch.zeros(total, total, dtype=torch.bool)
    mask[:num_clean, :num_clean] = causal_mask(num_clean) if clean_causal else True
    mask[num_clean:, :num_clean] = True
    if noisy_see_each_other:
        mask[num_clean:, num_clean:] = True
    else:
        mask[num_clean:, num_clean:] = torch.eye(num_noisy, dtype=torch.bool)
    return mask
