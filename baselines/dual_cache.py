"""Block decoding with a dual KV cache (Fast-dLLM's DualCache), for MDLM and BD3LM checkpoints.

Both families decode block after block, and every step of a block is a forward over positions
that do not change during the block: the canvas outside it (MDLM, bidirectional) or the rest
of the trained block (BD3LM). The dual cache computes their keys and values once, in the
block's first forward, and every later step of the block feeds the block alone on top of them.

What it approximates. A cached key or value was computed from the tokens its position saw in
the block's first forward. Within the block, each step commits tokens; the exact forward
would recompute every position against those commits, the dual cache keeps the stale values:

- MDLM (``MaskedDualCachePolicy``): everything but the current block is cached, the prefix
  and the still-masked suffix ("dual": both sides). MDLM attends bidirectionally, so every
  cached position is stale once the block commits its first token. The cache is recomputed
  at every block's first forward (the logits of that forward are exact).
- BD3LM (``BlockDualCachePolicy``): finished blocks are cached exactly, as the exact block
  cache does (a clean block depends only on earlier clean blocks). Inside the current trained
  block of S, decoding goes in sub-blocks; the rest of the block (decoded sub-blocks before
  it, masked ones after) is cached at each sub-block's first forward and is stale until the
  next one. With one sub-block per block nothing is approximated.

The trade: an MDLM step then costs a forward over the block instead of the whole canvas, a
BD3LM step a forward over the sub-block instead of the block; the tokens can differ from the
exact policies' (tests/test_dual_cache.py measures the logits' drift on a small model). The
family table (setdlm/families.py) flags the policy's cache as approximate, and so do the
tables and figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from setdlm.baselines.bd3lm import BlockCachePolicy
from setdlm.baselines.mdlm import BlockState, SemiAutoregressivePolicy, decode_blocks, step_quota
from setdlm.core import masks
from setdlm.core.decoding import DecodeConfig, PolicyOptions, RowInputs, RowState
from setdlm.core.decoding.config import check_size
from setdlm.core.decoding.sampling import tokens_per_step


# ------------------------------------------------------------------------------------- MDLM
@dataclass(frozen=True)
class MaskedDualCacheOptions(PolicyOptions):
    name = "dual-cache"
    block_size: int | None = (
        None  # decoding block, the cache's refresh unit; None: the model length
    )

    def __post_init__(self):
        check_size("block_size", self.block_size)


@dataclass
class MaskedDualState(BlockState):
    refreshed: int = -1  # the block whose first forward recomputed the cache


class MaskedDualCachePolicy(SemiAutoregressivePolicy):
    """MDLM's semi-autoregressive blocks over the canvas (padded to the model length, as in
    training); a block's first forward feeds the whole canvas window and caches everything
    outside the block, its later steps feed the block alone."""

    Options = MaskedDualCacheOptions
    uses_cache = True

    def setup(self, row: RowState) -> None:
        super().setup(row)  # the canvas and its blocks, as the exact policy has them
        row.policy = MaskedDualState(**vars(row.policy))

    def plan(self, row: RowState) -> RowInputs | None:
        exact = super().plan(row)  # the exact step: the canvas window, the block's targets
        if exact is None:
            return None
        state = row.policy
        block = state.blocks[state.current]
        mask_id = self.family.config.mask_token_id
        if state.refreshed != state.current:  # the block's first forward: recompute the cache
            state.refreshed = state.current
            inside = set(block)
            outside = [s for s in exact.slots if s not in inside]  # prefix and suffix, cached
            slots = outside + block
            keep_cached = 0
        else:  # a later step: the block alone, on the cached rest of the canvas
            slots, outside, keep_cached = block, [], None
        targets = [(len(outside) + i, s) for i, s in enumerate(block) if row.tokens[s] == mask_id]
        return RowInputs(
            slots, None, len(outside), targets, k=exact.k, ranked=block, keep_cached=keep_cached
        )


# ------------------------------------------------------------------------------------ BD3LM
@dataclass(frozen=True)
class BlockDualCacheOptions(PolicyOptions):
    name = "dual-cache"
    block_size: int | None = None  # decoding block, cached exactly once finished; None: S
    # Sub-blocks of a block, each step feeding one; the rest of the block is cached at each
    # sub-block's first forward. None: half the block (at least 1).
    sub_block_size: int | None = None

    def __post_init__(self):
        check_size("block_size", self.block_size)
        check_size("sub_block_size", self.sub_block_size)


@dataclass
class BlockDualState(BlockState):
    """``blocks`` are the sub-blocks (the decoding units); ``groups[i]`` the block that holds
    sub-block i."""

    groups: list[list[int]] = field(default_factory=list)
    exact: int = 0  # leading cache slots that are exact (context and finished blocks)
    pending: list[int] = field(default_factory=list)  # a finished block not yet cached
    sending_pending: bool = False  # the planned forward caches ``pending``
    refreshed: int = -1  # the sub-block whose first forward recomputed the cached rest
    predicted: int = 0  # the row's forwards with predictions, at the last observe


class BlockDualCachePolicy(BlockCachePolicy):
    """BD3LM's blocks with their exact block cache, each block decoded in sub-blocks: a
    sub-block's first forward feeds the pending finished block (cached exactly), the rest of
    the current block (cached, approximate) and the sub-block; its later steps feed the
    sub-block alone."""

    Options = BlockDualCacheOptions

    def __init__(self, family, config: DecodeConfig, options=None):
        super().__init__(family, config, options)  # self.block: the decoding block (S)
        self.sub_block = self.options.sub_block_size or max(1, self.block // 2)

    def setup(self, row: RowState) -> None:
        subs, groups = [], []
        for block in decode_blocks(row, self.block, self.config):
            for start in range(0, len(block), self.sub_block):
                subs.append(block[start : start + self.sub_block])
                groups.append(block)
        per_step = tokens_per_step(self.sub_block, self.config.num_steps)
        row.policy = BlockDualState(subs, per_step, groups=groups)

    def prefill(self, row: RowState) -> RowInputs | None:
        inputs = super().prefill(row)  # the context outside the blocks, cached exactly
        row.policy.exact = 0 if inputs is None else inputs.num_cached
        return inputs

    def plan(self, row: RowState) -> RowInputs | None:
        state = row.policy
        mask_id = self.family.config.mask_token_id
        while state.current < len(state.blocks) and all(  # a sub-block of prompt only
            row.tokens[s] != mask_id for s in state.blocks[state.current]
        ):
            self._next_sub_block(state)
        if state.current >= len(state.blocks):
            return None  # the last block is never cached: nothing would read it
        sub, group = state.blocks[state.current], state.groups[state.current]
        if state.refreshed == state.current:  # a later step: the sub-block alone
            targets = [(i, s) for i, s in enumerate(sub) if row.tokens[s] == mask_id]
            return RowInputs(sub, None, 0, targets, k=step_quota(state), ranked=sub)
        state.refreshed = state.current
        state.sending_pending = bool(state.pending)
        inside = set(sub)
        rest = [s for s in group if s not in inside]
        clean, noisy = state.pending, rest + sub  # a finished block sees itself whole
        attend = masks.clean_then_noisy_mask(
            len(clean), len(noisy), clean_causal=False, noisy_see_each_other=True
        )
        start = len(clean) + len(rest)
        targets = [(start + i, s) for i, s in enumerate(sub) if row.tokens[s] == mask_id]
        return RowInputs(
            clean + noisy,
            attend,
            start,  # the finished block and the rest of this one enter the cache
            targets,
            k=step_quota(state),
            ranked=sub,
            keep_cached=state.exact,  # drop the rest of the previous sub-block's forward
        )

    def observe(self, row: RowState, committed: list[int]) -> None:
        del committed
        state = row.policy
        if state.sending_pending:  # now in the cache, exactly, after the exact slots
            state.exact += len(state.pending)
            state.pending, state.sending_pending = [], False
        # the prompt-cache forward predicts nothing: it is not a sampler step
        predicted, state.predicted = row.steps > state.predicted, row.steps
        if not predicted:
            return
        state.step += 1
        mask_id = self.family.config.mask_token_id
        if all(row.tokens[s] != mask_id for s in state.blocks[state.current]):
            self._next_sub_block(state)

    @staticmethod
    def _next_sub_block(state: BlockDualState) -> None:
        group = state.groups[state.current]
        state.current, state.step = state.current + 1, 0
        if state.current == len(state.blocks) or state.groups[state.current] is not group:
            state.pending = group  # the block is finished: cache it in the next forward
            state.finished_end = group[-1] + 1
