"""The paper's per-family decoding knobs for the CNN/DailyMail and ROCStories tasks.

A task sets what belongs to the task (budget, stop rules, logits processors); the caller picks
the family's knobs (block, window, τ) through the ``DecodeConfig`` it passes in. These helpers
give the values of the paper's scripts for a published checkpoint (a ``zoo.PublishedModel``) or
for a loaded model (its config says the family, BD3LM's S and SetDLM's d). Every paper run is
greedy with τ = 1e6 (one token per forward), which are ``DecodeConfig``'s defaults.

CNN/DM (SPEC 5.2, ``bash_scripts/run_seq2seq_eval_cnndm.sh``):

| family | decoding block | SetDLM window W |
|---|---|---|
| AR | 1 (one token per forward) | - |
| MDLM | 32 (T = 32 steps per block, no cache) | - |
| BD3LM-s{4,8,16} | S | - |
| SetDLM-smax{8,16,32} | the whole generation | d = 4 / 8 / 16 |

ROCStories infilling (SPEC 5.4, ``bash_scripts/repro_paper_infill_rouge_tput_h100.sh``): AR;
MDLM with one block over the model length (1024); BD3LM-s16 with S = 16; SetDLM-smax32 with
W = 32 and every visible token of both contexts cached first (our SetDLM policy always caches
the full infilling context, the script's ``cache_full_infill_context=true``).
"""

from __future__ import annotations

from typing import NamedTuple

from setdlm.core.decoding import DecodeConfig

CNNDM_MDLM_BLOCK = 32
INFILL_SETDLM_WINDOW = 32


class FamilySizes(NamedTuple):
    family: str
    length: int  # model length
    block_size: int | None  # BD3LM's trained S
    d: int | None  # SetDLM's desired block size


def family_sizes(source) -> FamilySizes:
    """The sizes of a published checkpoint (zoo entry) or of a loaded model."""
    config = getattr(source, "config", None)
    if config is None:  # a zoo.PublishedModel
        return FamilySizes(source.family, source.length, source.block_size, source.d)
    d = config.schedule.d if config.family == "setdlm" else None
    return FamilySizes(config.family, config.length, config.block_size, d)


def default_stop_cadence(spec) -> str:
    """A published checkpoint (a ``zoo.PublishedModel``; None for our own models) stops as the
    official sampler stops it, so that its NFE and generated-token counts are the official
    ones; our models stop exactly at the stop."""
    return "official" if spec is not None else "exact"


def cnndm_decode_config(source, base: DecodeConfig | None = None) -> DecodeConfig:
    """The paper's CNN/DM family knobs on top of ``base`` (see the table above)."""
    base = base or DecodeConfig()
    sizes = family_sizes(source)
    if sizes.family == "mdlm":
        return base.replace(block_size=CNNDM_MDLM_BLOCK)
    if sizes.family == "bd3lm":
        return base.replace(block_size=sizes.block_size)
    if sizes.family == "setdlm":
        return base.replace(window=sizes.d)
    return base


def infill_decode_config(source, base: DecodeConfig | None = None) -> DecodeConfig:
    """The paper's ROCStories infilling family knobs on top of ``base``."""
    base = base or DecodeConfig()
    sizes = family_sizes(source)
    if sizes.family == "mdlm":
        return base.replace(block_size=sizes.length)  # one block: the whole sequence
    if sizes.family == "bd3lm":
        return base.replace(block_size=sizes.block_size)
    if sizes.family == "setdlm":
        return base.replace(window=INFILL_SETDLM_WINDOW)
    return base
