"""Generative perplexity of generated text under an evaluator causal LM, and unigram entropy.

Generative perplexity (SPEC 5.3, from the deleted ``compute_metrics``): each generated *text*
is re-tokenized with the evaluator's own tokenizer, scored with a sliding window (context
1,024, stride 512 by default), EOS tokens are left out of the NLL, and
PPL = exp(total NLL / total scored tokens) over all generations together.

The evaluator is gpt2-large on the cluster; any ``AutoModelForCausalLM`` Hub id or folder
works, and so does one of our own AR model folders (an AR family model is a causal LM), which
is how the tests score text offline. Either one is wrapped in a ``CausalScorer``.

Sliding window: windows start at 0, stride, 2 * stride, ...; each covers ``context`` tokens
and scores only the tokens no earlier window scored, so every token is scored once, with at
least ``context - stride`` tokens of left context once the text is longer than a window. A
text that fits in one window is scored with its full left context. The evaluator's BOS is put
in front of the text (a setting) so that the first text token is scored too.

Unigram entropy of a generation: the entropy (nats) of the empirical distribution of its
token ids, -sum_v c_v/n log(c_v/n), as the MDLM/BD3LM code computes it for rejection.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

DEFAULT_EVALUATOR = "gpt2-large"


# ---------------------------------------------------------------------------- evaluators
class CausalScorer(ABC):
    """A causal LM that gives log p(token | the tokens before it) for a token sequence."""

    tokenizer = None
    max_context: int  # the longest sequence one forward may see

    @property
    @abstractmethod
    def identity(self) -> dict:
        """What scores the text; part of the gen-PPL metric's identity."""

    @abstractmethod
    def next_token_log_probs(self, ids: list[int]) -> torch.Tensor:
        """(len(ids) - 1,) float64: log p(ids[t] | ids[:t]) for t = 1 .. len(ids) - 1."""

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @property
    def bos_token_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.tokenizer.eos_token_id
        return () if eos is None else (eos,)

    def _check_length(self, ids: list[int]) -> None:
        if len(ids) > self.max_context:
            raise ValueError(
                f"{self.identity['name']}: a forward over {len(ids)} tokens exceeds its context "
                f"of {self.max_context}"
            )


class HFCausalScorer(CausalScorer):
    """Any ``AutoModelForCausalLM`` (Hub id or folder) with its own tokenizer."""

    def __init__(self, name: str, device="cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = name
        self.tokenizer = AutoTokenizer.from_pretrained(name)
        self.model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device).eval()
        config = self.model.config
        self.max_context = getattr(config, "n_positions", None) or config.max_position_embeddings
        self._revision = getattr(config, "_commit_hash", None)

    @property
    def identity(self) -> dict:
        return {
            "name": self.name,
            "kind": "transformers AutoModelForCausalLM",
            "revision": self._revision,
            "dtype": str(self.model.dtype),
            "max_context": self.max_context,
            "transformers": importlib.metadata.version("transformers"),
        }

    @torch.no_grad()
    def next_token_log_probs(self, ids: list[int]) -> torch.Tensor:
        self._check_length(ids)
        device = next(self.model.parameters()).device
        tokens = torch.tensor([ids], device=device)  # (1, n)
        logits = self.model(input_ids=tokens).logits[0, :-1].double()  # (n - 1, V)
        log_probs = torch.log_softmax(logits, dim=-1)
        return log_probs.gather(-1, tokens[0, 1:, None]).squeeze(-1).cpu()  # (n - 1,)


class ARFamilyScorer(CausalScorer):
    """One of our AR family models as the evaluator (a folder written by ``save_model``, or a
    published AR checkpoint by key, ``ARFamilyScorer.published``): its backbone under a causal
    mask, as its training loss scores tokens."""

    def __init__(self, folder: str | Path, device="cpu"):
        from setdlm.checkpoints.folders import load_model
        from setdlm.data.tokenizers import load_tokenizer

        self.folder = Path(folder).expanduser()
        # the name as given: the metric's identity names it this way
        self._use(str(folder), load_model(self.folder), load_tokenizer(self.folder), device)

    @classmethod
    def published(cls, key: str, device="cpu") -> ARFamilyScorer:
        """A published AR checkpoint (``owt:ar``) through the Hub loader; its identity names
        the key with the commit its files were (``owt:ar@<commit>``)."""
        from setdlm.checkpoints.zoo import load_pretrained, load_tokenizer_for

        loaded = load_pretrained(key)
        scorer = cls.__new__(cls)
        scorer.folder = loaded.folder
        scorer._use(loaded.source(key), loaded.model, load_tokenizer_for(loaded), device)
        return scorer

    def _use(self, name: str, model, tokenizer, device) -> None:
        from setdlm.families import family as family_info

        if not family_info(model.config.family).left_to_right:
            raise ValueError(
                f"{name}: gen-PPL needs a causal LM, but this is a "
                f"{model.config.family} model; use an AR model or a Hub causal LM"
            )
        self.name = name
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.max_context = model.config.length

    @property
    def identity(self) -> dict:
        return {
            "name": self.name,
            "kind": "setdlm AR family model",
            "model_config_digest": self.model.config.digest(),
            "max_context": self.max_context,
        }

    @torch.no_grad()
    def next_token_log_probs(self, ids: list[int]) -> torch.Tensor:
        from setdlm.core import masks

        self._check_length(ids)
        device = self.model.device
        tokens = torch.tensor([ids], device=device)  # (1, n)
        positions = torch.arange(len(ids), device=device)[None]  # (1, n)
        mask = masks.causal_mask(len(ids), device=device)[None]  # (1, n, n)
        logits = self.model.backbone(tokens, positions, mask)[0, :-1].double()  # (n - 1, V)
        log_probs = torch.log_softmax(logits, dim=-1)
        return log_probs.gather(-1, tokens[0, 1:, None]).squeeze(-1).cpu()  # (n - 1,)


def load_evaluator(name: str, device="cpu") -> CausalScorer:
    """Our AR model folder or a published AR checkpoint's key (``owt:ar``), else any causal LM
    folder or Hub id (``gpt2-large`` by default)."""
    from setdlm.checkpoints.zoo import resolve

    folder = Path(name).expanduser()
    if not folder.exists() and ":" in name and resolve(name) is not None:
        return ARFamilyScorer.published(name, device=device)
    config = folder / "config.json"
    if config.is_file():
        try:
            is_ours = json.loads(config.read_text()).get("format", "").startswith("setdlm-model")
        except json.JSONDecodeError as error:
            raise ValueError(f"{config}: not valid JSON ({error})") from error
        if is_ours:
            return ARFamilyScorer(name, device=device)
    return HFCausalScorer(name, device=device)


# --------------------------------------------------------------------------- perplexity
@dataclass(frozen=True)
class PerplexitySettings:
    context: int = 1024  # tokens one window sees (capped by the evaluator's own context)
    stride: int = 512  # how far the window moves; each window scores its last new tokens
    prefix_bos: bool = True  # score the first text token given the evaluator's BOS
    exclude_eos: bool = True  # EOS tokens are never scored (SPEC 5.3)

    def __post_init__(self):
        if not 1 <= self.stride <= self.context:
            raise ValueError(f"need 1 <= stride <= context, got {self.stride}, {self.context}")

    def to_dict(self) -> dict:
        return asdict(self)


def window_starts(length: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over ``length`` tokens.

    Position 0 is never scored (nothing precedes it); every other position is scored by
    exactly one window, the first whose end lies beyond it. A window starts ``stride`` after
    the one before, but never after the token before the first it scores: with a stride of a
    whole context, the next window would otherwise begin at the very token it scores first,
    with nothing in it to predict that token from.
    """
    windows, scored_until, begin = [], 1, 0
    while scored_until < length:
        begin = min(begin, scored_until - 1)
        end = min(begin + context, length)
        windows.append((begin, end, scored_until))
        scored_until = end
        begin += stride
    return windows


def token_nlls(
    scorer: CausalScorer, ids: list[int], settings: PerplexitySettings
) -> list[tuple[int, float]]:
    """(token, NLL) for every scored token of ``ids`` (EOS left out if the settings say so)."""
    context = min(settings.context, scorer.max_context)
    stride = min(settings.stride, context)
    excluded = set(scorer.eos_token_ids) if settings.exclude_eos else set()
    scored = []
    for begin, end, first in window_starts(len(ids), context, stride):
        log_probs = scorer.next_token_log_probs(ids[begin:end])  # (end - begin - 1,)
        for position in range(first, end):
            token = ids[position]
            if token not in excluded:
                scored.append((token, -float(log_probs[position - begin - 1])))
    return scored


def generative_perplexity(
    scorer: CausalScorer, texts: Sequence[str], settings: PerplexitySettings = PerplexitySettings()
) -> dict:
    """Gen-PPL of ``texts``: exp(total NLL / total scored tokens), and per-text figures."""
    if settings.prefix_bos and scorer.bos_token_id is None:
        raise ValueError(f"{scorer.identity['name']} has no BOS token; set prefix_bos=False")
    prefix = [scorer.bos_token_id] if settings.prefix_bos else []
    per_text = []
    for text in texts:
        nlls = [nll for _, nll in token_nlls(scorer, prefix + scorer.encode(text), settings)]
        per_text.append({"nll_sum": math.fsum(nlls), "tokens": len(nlls)})
    total_tokens = sum(item["tokens"] for item in per_text)
    total_nll = math.fsum(item["nll_sum"] for item in per_text)
    mean_nll = total_nll / total_tokens if total_tokens else float("nan")
    return {
        "perplexity": math.exp(mean_nll) if total_tokens else float("nan"),
        "mean_nll": mean_nll,
        "scored_tokens": total_tokens,
        "texts": len(per_text),
        "texts_without_scored_tokens": sum(item["tokens"] == 0 for item in per_text),
        "per_text": per_text,
    }


# ----------------------------------------------------------------------- unigram entropy
def unigram_entropy(tokens: Sequence[int]) -> float:
    """Entropy in nats of the token-id frequencies of one sequence (0.0 when empty)."""
    if not tokens:
        return 0.0
    total = len(tokens)
    return -math.fsum(c / total * math.log(c / total) for c in Counter(tokens).values())
