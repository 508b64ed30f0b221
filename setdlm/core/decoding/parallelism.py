"""How many tokens a decode yields per step: the official parallelism factor, and tokens per
forward beside it.

The two differ, and a claim "at equal parallelism" means nothing until it says which:

- **parallelism factor**, as the official code computes it (kuleshov-group/setdlms, commit
  549f0bb: ``SetDLM.generate`` in src/denoiser/setdlm.py and ``MDLM.generate``, which BD3LM
  inherits, in src/denoiser/mdlm.py; quoted in docs/checks-and-ci.md): every denoising step
  appends the number of tokens it committed, and the factor is their mean over the steps.
  Whatever a step commits counts: an EOS, and positions after it that the same step filled.
  It is what the paper's Pareto figures plot (SPEC 6.1, "Parallelism factor").
- **tokens per forward**: the generated tokens that are text, EOS and padding excluded, over
  every backbone forward of the decode (NFE, the prompt's prefill included). It is what a
  forward bought, so it is the one that moves tokens/s.

A decode that commits its EOS together with text, or fills positions after the EOS, has a
factor above its tokens per forward; one that spends a forward on its prompt alone has a
factor above it too (the prefill commits nothing, so it is no step).
"""

from __future__ import annotations

from collections.abc import Iterable


def parallelism_factor(committed: int, steps: int) -> float:
    """The official factor: the mean over ``steps`` steps of the tokens each committed, i.e.
    all ``committed`` tokens over the steps (0 with no step)."""
    return committed / steps if steps else 0.0


def content_tokens(token_ids: Iterable[int], end_ids: Iterable[int]) -> int:
    """The generated tokens that are text: ``token_ids`` less every EOS and padding id."""
    ends = set(end_ids)
    return sum(1 for token in token_ids if token not in ends)


def tokens_per_forward(content: int, nfe: int) -> float:
    """Text tokens over backbone forwards (0 with no forward)."""
    return content / nfe if nfe else 0.0


def end_ids(eos_token_ids: Iterable[int], *model_ids: int | None) -> frozenset[int]:
    """The ids that are not text: the decode's stop ids and the model's EOS and padding."""
    return frozenset([*eos_token_ids, *(token for token in model_ids if token is not None)])
