"""The tiny recipe's settings, and what a model's training data is: what the workflow needs to
know about a model trained here (its recipe, to match a committed reference copy) before any
job runs, without torch (setdlm/recipes/tiny.py trains it)."""

from __future__ import annotations

from dataclasses import dataclass

from setdlm.tasks import arithmetic
from setdlm.util.files import sha256_file
from setdlm.util.paths import data_path

CORPORA = ("wikitext2", "arithmetic")


@dataclass(frozen=True)
class TinySettings:
    length: int = 64
    vocab_size: int = 512
    hidden_size: int = 128
    n_heads: int = 4
    num_layers: int = 2
    steps: int = 400
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 20
    final_lr_fraction: float = 0.1  # the cosine schedule ends at this fraction of lr
    ema_decay: float = 0.98
    block_size: int = 4  # BD3LM S; SetDLM uses d = S and smax M = 2S (the paper's pairing)
    prompt_tokens: int = 16
    new_tokens: int = 32
    num_prompts: int = 4
    thresholds: tuple[float, ...] = (1e6, 0.5)
    seed: int = 0
    # What the model is trained on: WikiText-2 in chunks, or the synthetic arithmetic problems
    # (setdlm/tasks/arithmetic.py), ``problems`` of them from ``generator``, one per row, drawn
    # with ``problem_seed`` (None: ``seed``, so that a seed then changes the problems too).
    corpus: str = "wikitext2"
    problems: int = 20000
    generator: str = arithmetic.GENERATOR_VERSION
    problem_seed: int | None = None

    def __post_init__(self):
        if self.corpus not in CORPORA:
            raise ValueError(f"corpus must be one of {CORPORA}, got {self.corpus!r}")
        arithmetic.grammar(self.generator)  # an unknown version is an error here

    @property
    def problems_seed(self) -> int:
        """The seed the training problems are drawn with."""
        return self.seed if self.problem_seed is None else self.problem_seed


def corpus_identity(settings: TinySettings) -> dict:
    """What the training data is, for the model's identity."""
    if settings.corpus == "arithmetic":
        return arithmetic.identity(
            "train", settings.problems, settings.problems_seed, settings.generator
        )
    return {"wikitext2": sha256_file(data_path("wikitext2", "wiki.test.raw"))}
