"""ROUGE on hand-made pairs whose answers were worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from rouge_score import rouge_scorer, scoring

from setdlm.eval.rouge import ROUGE_TYPES, RougeScorer, RougeSettings, aggregate_rouge


@pytest.fixture(scope="module")
def scorer():
    return RougeScorer()


def test_identical_texts_score_one_and_disjoint_texts_zero(scorer):
    text = "The committee approved the budget on Tuesday.\nVoting ends in May."
    assert scorer.score(text, text) == dict.fromkeys(ROUGE_TYPES, 1.0)
    assert scorer.score(text, "purple elephants sing loudly") == dict.fromkeys(ROUGE_TYPES, 0.0)


def test_a_worked_partial_match(scorer):
    # reference: the cat sat on the mat   prediction: the cat lay on the mat (6 tokens each)
    # unigrams shared: the x2, cat, on, mat = 5        -> P = R = 5/6
    # bigrams shared: the-cat, on-the, the-mat = 3 of 5 -> P = R = 3/5
    # longest common subsequence: the cat on the mat = 5 -> P = R = 5/6
    scores = scorer.score("the cat sat on the mat", "the cat lay on the mat")
    assert scores["rouge1"] == pytest.approx(5 / 6)
    assert scores["rouge2"] == pytest.approx(3 / 5)
    assert scores["rougeL"] == pytest.approx(5 / 6)
    assert scores["rougeLsum"] == pytest.approx(5 / 6)  # one sentence: same as rougeL


def test_precision_and_recall_differ_and_f_is_their_harmonic_mean(scorer):
    # reference "a b c d", prediction "a b": unigrams P = 2/2, R = 2/4 -> F = 2/3;
    # bigrams P = 1/1 (a-b), R = 1/3 -> F = 2 * 1 * (1/3) / (4/3) = 1/2
    scores = scorer.score("a b c d", "a b")
    assert scores["rouge1"] == pytest.approx(2 / 3)
    assert scores["rouge2"] == pytest.approx(1 / 2)
    assert scores["rougeL"] == pytest.approx(2 / 3)


def test_lsum_splits_sentences_on_newlines_only(scorer):
    # rougeL over the whole text: LCS("a b c d", "c d a b") = 2 of 4 -> 0.5.
    # rougeLsum: each reference line is matched against the prediction's lines: "a b" -> 2,
    # "c d" -> 2, so the union LCS covers all 4 tokens -> 1.0.
    scores = scorer.score("a b\nc d", "c d a b")
    assert scores["rougeL"] == pytest.approx(0.5)
    assert scores["rougeLsum"] == pytest.approx(1.0)
    # A period is not a sentence boundary (no NLTK splitting): the same text on one line
    assert scorer.score("a b. c d.", "c d a b")["rougeLsum"] == pytest.approx(0.5)


def test_empty_predictions_score_zero_without_error(scorer):
    for empty in ("", "   ", "\n", "!!!"):
        assert scorer.score("a real summary", empty) == dict.fromkeys(ROUGE_TYPES, 0.0)
    assert scorer.score("", "") == dict.fromkeys(ROUGE_TYPES, 0.0)


def test_case_and_punctuation_are_ignored_and_stemming_is_off_by_default(scorer):
    assert scorer.score("The Cat, sat!", "the cat sat")["rouge1"] == 1.0
    assert scorer.score("running dogs", "run dog")["rouge1"] == 0.0
    stemmed = RougeScorer(RougeSettings(use_stemmer=True))
    assert stemmed.score("running dogs", "run dog")["rouge1"] == 1.0


def test_the_aggregate_is_the_mean_with_a_seeded_bootstrap_interval():
    settings = RougeSettings(rouge_types=("rouge1",))
    per_example = [{"rouge1": v} for v in (0.0, 0.5, 1.0, 0.25)]
    result = aggregate_rouge(per_example, settings)["rouge1"]
    assert result["value"] == pytest.approx(0.4375)
    low, high = result["bootstrap_95"]
    assert 0.0 <= low <= 0.4375 <= high <= 1.0
    assert aggregate_rouge(per_example, settings)["rouge1"]["bootstrap_95"] == [low, high]
    assert result["settings"]["use_stemmer"] is False
    assert result["settings"]["package"].startswith("rouge_score ")
    assert "newline" in result["settings"]["lsum_sentence_split"]


def test_the_mean_is_what_evaluates_bootstrap_median_estimates(scorer):
    # evaluate.load("rouge") reports rouge_score's BootstrapAggregator mid (a median of
    # bootstrap means); with many examples it agrees with the plain mean to within noise.
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(12)]
    pairs = [(" ".join(rng.choice(words, 8)), " ".join(rng.choice(words, 6))) for _ in range(300)]
    evaluate_scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
    aggregator = scoring.BootstrapAggregator()
    per_example = []
    for reference, prediction in pairs:
        per_example.append(scorer.score(reference, prediction))
        aggregator.add_scores(evaluate_scorer.score(reference, prediction))
    np.random.seed(0)  # the aggregator draws from numpy's global generator
    theirs = aggregator.aggregate()
    ours = aggregate_rouge(per_example, RougeSettings())
    for name in ROUGE_TYPES:
        assert ours[name]["value"] == pytest.approx(theirs[name].mid.fmeasure, abs=2e-3)


def test_bad_input_is_refused_clearly(scorer):
    with pytest.raises(TypeError, match="prediction must be a string"):
        scorer.score("reference", None)
    with pytest.raises(ValueError, match="rouge_types"):
        RougeSettings(rouge_types=("rouge4",))
    with pytest.raises(ValueError, match="no per-example"):
        aggregate_rouge([], RougeSettings())
