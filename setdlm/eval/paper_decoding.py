"""The paper's per-family decoding knobs for the GSM8K, CNN/DailyMail and ROCStories tasks.

A task sets what belongs to the task (budget, stop rules, logits processors); the caller picks
the family's knobs (block, window, τ) through the ``DecodeConfig`` it passes in. The values of
the paper's scripts are in the family table (setdlm/families.py, ``decoding``); these helpers
fill them in for a published checkpoint (a ``zoo.PublishedModel``) or for a loaded model (its
config says the family, BD3LM's S and SetDLM's d). Every paper run is greedy with τ = 1e6 (one
token per forward), which are ``DecodeConfig``'s defaults. Where the values come from:

GSM8K (SPEC 5.1 "Pareto settings"): MDLM blocks of 32 without cache, BD3LM blocks of its S,
SetDLM W = d with the first-hitting cache order.

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

from setdlm import families
from setdlm.core.decoding import DecodeConfig


def family_sizes(source, mdlm_block: int | None = None) -> tuple[str, dict[str, int | None]]:
    """(family, sizes) of a published checkpoint (a ``zoo.PublishedModel``) or of a loaded
    model: the sizes the family table's knobs name (S, d, length, mdlm_block)."""
    from setdlm.checkpoints.zoo import TASKS

    config = getattr(source, "config", None)
    if config is None:  # a zoo.PublishedModel
        name, length, block, d = source.family, source.length, source.block_size, source.d
        task_block = TASKS[source.task]["mdlm_block"]
    else:
        name, length, block = config.family, config.length, config.block_size
        d = getattr(config.schedule, "d", None)
        task_block = None
    return name, {"S": block, "d": d, "length": length, "mdlm_block": mdlm_block or task_block}


def paper_decode_config(
    task: str, source, base: DecodeConfig | None = None, mdlm_block: int | None = None
) -> DecodeConfig:
    """The paper's family knobs for ``task`` (gsm8k, cnndm, infill; setdlm/families.py holds
    them) on top of ``base``. ``mdlm_block``: MDLM's block where the task's comes from the
    checkpoint (GSM8K: 32; a loaded model of ours has none)."""
    from setdlm.checkpoints.zoo import TASKS

    name, sizes = family_sizes(source, mdlm_block)
    # a loaded model of ours: the block the task's checkpoints decode with (GSM8K: 32)
    sizes["mdlm_block"] = sizes["mdlm_block"] or TASKS.get(task, {}).get("mdlm_block")
    knobs = families.family(name).decoding_knobs(task, sizes)
    return families.with_knobs(base or DecodeConfig(), name, **knobs)


def default_stop_cadence(spec) -> str:
    """A published checkpoint (a ``zoo.PublishedModel``; None for our own models) stops as the
    official sampler stops it, so that its NFE and generated-token counts are the official
    ones; our models stop exactly at the stop."""
    return "official" if spec is not None else "exact"
