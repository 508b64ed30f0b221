"""ROUGE F-measures with ``rouge_score`` directly, every setting explicit and recorded.

The paper scored with ``evaluate.load("rouge")`` (SPEC 5.2, 5.4), which fetches its code from
the Hub. That code is a thin wrapper around ``rouge_score`` (read from huggingface/evaluate,
metrics/rouge/rouge.py): ``RougeScorer(rouge_types, use_stemmer=False)`` with the default
tokenizer and ``split_summaries=False``, per-example ``score(reference, prediction)``, then a
``BootstrapAggregator`` whose reported number is ``.mid.fmeasure``: the median of 1,000
*unseeded* bootstrap means of the per-example F1. That median estimates the plain mean and
differs from it by a small amount that changes from run to run, so here the reported value is
the exact mean of per-example F1, and the bootstrap is kept only as a seeded 95% interval next
to it. The scoring itself is the same call with the same settings:

- tokenization: lower-case, every non-alphanumeric character is a separator, no stemming
  (evaluate's default ``use_stemmer=False``; ``use_stemmer=True`` needs no NLTK download);
- rougeLsum: sentences are the text's lines (rouge_score's ``split_summaries=False``, which is
  what evaluate passes), so no NLTK sentence splitter and no NLTK data download is involved;
- an empty prediction (or reference) scores 0 on every type; it is not an error.
"""

from __future__ import annotations

import importlib.metadata
import statistics
from dataclasses import asdict, dataclass

from setdlm.eval.intervals import bootstrap_95

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
_DEFINITIONS = {
    "rouge1": "ROUGE-1 F1 (unigram overlap)",
    "rouge2": "ROUGE-2 F1 (bigram overlap)",
    "rougeL": "ROUGE-L F1 (longest common subsequence over the whole text)",
    "rougeLsum": "ROUGE-Lsum F1 (summary-level LCS over newline-separated sentences)",
}


@dataclass(frozen=True)
class RougeSettings:
    rouge_types: tuple[str, ...] = ROUGE_TYPES
    use_stemmer: bool = False  # HF evaluate's default, which the paper's runs used
    bootstrap_samples: int = 1000  # for the reported 95% interval only
    bootstrap_seed: int = 0

    def __post_init__(self):
        unknown = sorted(set(self.rouge_types) - set(ROUGE_TYPES))
        if unknown or not self.rouge_types:
            raise ValueError(f"rouge_types must be a non-empty subset of {ROUGE_TYPES}: {unknown}")

    def to_dict(self) -> dict:
        """The settings plus what is fixed by this module: the metric's full identity."""
        return asdict(self) | {
            "rouge_types": list(self.rouge_types),
            "package": f"rouge_score {importlib.metadata.version('rouge_score')}",
            "tokenizer": "rouge_score default (lower-case, split on non-alphanumerics)",
            "lsum_sentence_split": "newline (split_summaries=False, no NLTK)",
            "score": "F-measure",
            "aggregation": "mean of per-example F1 (evaluate reports a bootstrap median)",
        }


class RougeScorer:
    """Per-example ROUGE F1 of one prediction against one reference."""

    def __init__(self, settings: RougeSettings = RougeSettings()):
        self.settings = settings
        # Imported here: rouge_score loads NLTK, scipy and scikit-learn (about 4 s), which
        # every task importing this module's settings (arithmetic infilling) would pay.
        from rouge_score import rouge_scorer

        self._scorer = rouge_scorer.RougeScorer(
            list(settings.rouge_types), use_stemmer=settings.use_stemmer, split_summaries=False
        )

    def score(self, reference: str, prediction: str) -> dict[str, float]:
        for name, text in (("reference", reference), ("prediction", prediction)):
            if not isinstance(text, str):
                raise TypeError(f"ROUGE {name} must be a string, got {type(text).__name__}")
        scores = self._scorer.score(reference, prediction)  # (target, prediction) order
        return {name: float(scores[name].fmeasure) for name in self.settings.rouge_types}


def aggregate_rouge(per_example: list[dict[str, float]], settings: RougeSettings) -> dict:
    """{type: {"value": mean F1, "definition", "bootstrap_95": [low, high], "settings"}}."""
    if not per_example:
        raise ValueError("no per-example ROUGE scores to aggregate")
    count = len(per_example)
    columns = {name: [scores[name] for scores in per_example] for name in settings.rouge_types}
    # One shared set of resamples for every type, as rouge_score's aggregator does.
    intervals = bootstrap_95(columns, settings.bootstrap_samples, settings.bootstrap_seed)
    metrics = {}
    for name, values in columns.items():
        metrics[name] = {
            "value": statistics.fmean(values),
            "definition": f"{_DEFINITIONS[name]}, mean over {count} examples",
            "bootstrap_95": intervals[name],
            "settings": settings.to_dict(),
        }
    return metrics
