"""Unconditional generation (SPEC 5.3): samples from a BOS prompt, scored with MAUVE against
reference text, generative perplexity and unigram entropy.

Each sample is decoded from the single-BOS prompt with nucleus sampling and a repetition
penalty, stopped by the rules of ``sample_rules`` (first EOS online in the engine; low
confidence and window entropy applied to its output), and regenerated while it is too short
or too repetitive, up to a maximum number of attempts. Sample ``i`` has the runner's
per-example seed (base seed, its id); attempt ``a > 0`` derives its seed from (sample seed,
a), so a sample never depends on batch size, resumption or the other samples.

The runner's ``Task`` interface decodes every example once, so regeneration runs in
``run_unconditional``, which keeps the runner's format and helpers: ``run.json`` (which
configuration the samples belong to), ``samples.jsonl`` (one line per finished sample, with
every attempt; resumable, torn last line dropped) and ``metrics.json`` (written atomically once
every sample is present). Scoring settings (featurizer, evaluator, references) are not part
of the samples' identity: a finished folder can be scored again with other ones, and
``metrics.json`` then holds the latest scoring with its identity.

Texts compared by MAUVE (SPEC 8.2 item 6): the paper decodes its references (1,024-token
chunks) with special tokens, but its generations BOS-prefixed and EOS-truncated. The default
("clean") decodes both without special tokens; "paper" reproduces the paper's texts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from setdlm.core.decoding import DecodeConfig
from setdlm.eval.fingerprint import sample_provenance
from setdlm.eval.gen_ppl import (
    DEFAULT_EVALUATOR,
    CausalScorer,
    PerplexitySettings,
    generative_perplexity,
    load_evaluator,
    unigram_entropy,
)
from setdlm.eval.intervals import bootstrap_95, scored_means
from setdlm.eval.mauve_score import (
    BOOTSTRAP_BASE_SEED,
    BOOTSTRAP_RNG_SEED,
    DEFAULT_FEATURIZER,
    EMPTY_POLICIES,
    OFFLINE_FEATURIZER,
    Featurizer,
    MauveSettings,
    apply_empty_policy,
    bootstrap_subsets,
    load_featurizer,
    mauve_bootstrap,
    mauve_from_features,
)
from setdlm.eval.records import SampleLog, config_hash, example_seed
from setdlm.eval.runner import (
    Example,
    RunSettings,
    Task,
    claim_folder,
    finish_run,
    finish_shard,
    finished_result,
    generation_identity,
    scheduled_batches,
    shard_examples,
)
from setdlm.eval.timing import (
    decoding_fields,
    reset_peak_memory,
    synchronized_timer,
)
from setdlm.families import family as family_info
from setdlm.tasks import arithmetic
from setdlm.tasks.likelihood import arithmetic_rows, prepared_documents
from setdlm.tasks.sample_rules import EntropyStop, LowConfidenceStop, Rejection, apply_stop_rules
from setdlm.util.errors import DataError
from setdlm.util.hub import hub_offline, load_hub_dataset, unreachable
from setdlm.util.progress import progress_bar
from setdlm.util.validation import SettingError

TEXT_PROTOCOLS = {
    "clean": "generations and references both decoded without special tokens",
    "paper": "references decoded with special tokens; generations BOS-prefixed, cut before "
    "their EOS and decoded with special tokens (the paper's texts, SPEC 8.2 item 6)",
}
OWT_HUB_ID = "Skylion007/openwebtext"
OWT_VALID_SPLIT = "train[-100000:]"  # the paper's OWT validation documents (SPEC 4)
REFERENCE_SOURCES = {
    "owt": f"OpenWebText validation ({OWT_HUB_ID}, {OWT_VALID_SPLIT}; Hub)",
    "wikitext2": "WikiText-2 test, held-out articles (data mirror offline, else Hub)",
    **{
        version: f"{version} test problems (setdlm/tasks/arithmetic.py, problem seed 0), one "
        "per EOS-filled row as the models were trained"
        for version in arithmetic.GRAMMARS
    },
}
# An arithmetic reference pool with no limit: this many test problems (the generator has no end).
ARITHMETIC_POOL = 1000


# --------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class GenerationSettings:
    """What defines the samples (part of their identity). Defaults: the paper's (SPEC 5.3)."""

    num_samples: int = 1000
    max_new_tokens: int = 1023  # after the BOS prompt, filling a 1,024-token model
    top_p: float = 0.95
    repetition_penalty: float = 1.05
    low_confidence_stop: LowConfidenceStop | None = LowConfidenceStop()
    entropy_stop: EntropyStop | None = EntropyStop()
    rejection: Rejection = Rejection()
    # Arithmetic models (references arithmetic-<n>): each sample is judged as a problem of
    # this generator version (valid, correct) and against the model's training problems
    # (novel; ``training_problems`` is their arithmetic.identity, None: novelty not scored).
    grammar: str | None = None
    training_problems: dict | None = None

    def __post_init__(self):
        if self.num_samples < 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"num_samples and max_new_tokens must be >= 1, got {self.num_samples}, "
                f"{self.max_new_tokens}"
            )
        if self.grammar is not None:
            arithmetic.grammar(self.grammar)

    @classmethod
    def table4(cls, family: str, **changes) -> GenerationSettings:
        """Paper Table 4's per-family decoding (``table4_decode_overrides``): AR p = 0.90, no
        repetition penalty, stop confidence 0.005; BD3LM and SetDLM p = 0.95, penalty 1.05,
        stop confidence 0.01. Table 4 has no MDLM row: MDLM, like every family that does not
        decode left to right, gets the diffusion values."""
        if family_info(family).left_to_right:
            top_p, penalty, confidence = 0.90, 1.00, 0.005
        else:
            top_p, penalty, confidence = 0.95, 1.05, 0.01
        paper = cls(
            top_p=top_p,
            repetition_penalty=penalty,
            low_confidence_stop=LowConfidenceStop(threshold=confidence),
        )
        return dataclasses.replace(paper, **changes)

    def to_dict(self) -> dict:
        # The judge's settings only when set: samples from before they existed keep their hash.
        judged = ("grammar", "training_problems")
        return {k: v for k, v in asdict(self).items() if k not in judged or v is not None}


@dataclass(frozen=True)
class ScoringSettings:
    """How finished samples are scored (not part of the samples' identity)."""

    references: str = "owt"
    reference_revision: str | None = None  # Hub revision of the OWT dataset (None: default)
    num_references: int = 1000  # the single-run MAUVE uses the first ones
    reference_pool_limit: int | None = None  # bootstrap pool: every chunk of the split (None)
    text_protocol: str = "clean"
    featurizer: str = DEFAULT_FEATURIZER
    featurizer_batch_size: int | None = None  # None: the featurizer's default
    mauve: MauveSettings = MauveSettings()
    mauve_seed: int = 1234
    empty_policy: str = "drop"
    empty_placeholder: str = "."
    bootstrap_subsets: int = 5  # 0 skips the bootstrap
    bootstrap_rng_seed: int = BOOTSTRAP_RNG_SEED
    bootstrap_base_seed: int = BOOTSTRAP_BASE_SEED
    evaluator: str | None = DEFAULT_EVALUATOR  # None skips gen-PPL
    perplexity: PerplexitySettings = PerplexitySettings()
    compute_mauve: bool = True  # False: no featurizer pass, no MAUVE (`--no-mauve`)

    def __post_init__(self):
        for name, value, allowed in (
            ("references", self.references, REFERENCE_SOURCES),
            ("text_protocol", self.text_protocol, TEXT_PROTOCOLS),
            ("empty_policy", self.empty_policy, EMPTY_POLICIES),
        ):
            if value not in allowed:
                raise ValueError(
                    f"scoring setting {name}={value!r} is not one of {sorted(allowed)}"
                )
        if self.num_references < 2:
            raise ValueError(f"num_references must be >= 2, got {self.num_references}")

    def to_dict(self) -> dict:
        values = asdict(self)
        if self.compute_mauve:  # added later: the identities of points that compute it stay
            del values["compute_mauve"]
        return values


# ------------------------------------------------------------------------------------ task
class UnconditionalTask(Task):
    """Samples from a BOS prompt. Run it with ``run_unconditional`` (which regenerates
    rejected samples); ``run_evaluation`` would decode each sample once, without rejection.

    ``featurizer`` and ``evaluator`` may be given already loaded (to score several runs without
    reloading them); they must be the ones the scoring settings name.
    """

    name = "unconditional"

    def __init__(
        self,
        generation: GenerationSettings = GenerationSettings(),
        scoring: ScoringSettings = ScoringSettings(),
        featurizer: Featurizer | None = None,
        evaluator: CausalScorer | None = None,
    ):
        for given, wanted, what in (
            (featurizer, scoring.featurizer, "featurizer"),
            (evaluator, scoring.evaluator, "evaluator"),
        ):
            if given is not None and given.identity["name"] != wanted:
                raise ValueError(
                    f"the {what} given is {given.identity['name']!r}, but the scoring settings "
                    f"name {wanted!r}"
                )
        self.generation, self.scoring = generation, scoring
        self.featurizer, self.evaluator = featurizer, evaluator
        self._prepared = None  # (tokenizer, model) once examples() has run
        self._judge = None  # arithmetic.SampleJudge of generation.grammar, from examples()

    def settings(self) -> dict:
        return {"generation": self.generation.to_dict(), "scoring": self.scoring.to_dict()}

    def examples(self, tokenizer, model) -> list[Example]:
        bos = tokenizer.bos_token_id
        if bos is None:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} has no BOS token to prompt with"
            )
        if 1 + self.generation.max_new_tokens > model.config.length:
            raise ValueError(
                f"BOS + max_new_tokens={self.generation.max_new_tokens} exceeds the model length "
                f"{model.config.length}; lower max_new_tokens"
            )
        self._refuse_unreachable_scorers()
        if self.scoring.compute_mauve:  # the references are MAUVE's
            self._refuse_short_reference_pool(tokenizer, model.config.length)
        self._prepared = (tokenizer, model)
        if self.generation.grammar is not None and self._judge is None:
            generation = self.generation
            training = generation.training_problems
            self._judge = _judge(generation.grammar, tuple(sorted((training or {}).items())))
        prompt = tokenizer.decode([bos], skip_special_tokens=False)
        return [
            Example(id=f"sample-{i:05d}", input_ids=[bos], prompt=prompt, reference=None)
            for i in range(self.generation.num_samples)
        ]

    def _refuse_unreachable_scorers(self) -> None:
        """Before any sample is generated: the references, MAUVE featurizer and gen-PPL
        evaluator must be loadable here, or the run would fail after generating them all."""
        scoring, problems = self.scoring, []
        owt_offline = hub_offline(datasets=True) and prepared_documents("owt") is None
        if scoring.compute_mauve and scoring.references == "owt" and owt_offline:
            problems.append(
                "--references owt (references: owt) loads OpenWebText from the Hub, which is "
                "offline here; use --references wikitext2 (offline copy)"
            )
        if (
            scoring.compute_mauve
            and scoring.featurizer != OFFLINE_FEATURIZER
            and unreachable(scoring.featurizer)
        ):
            problems.append(
                f"--featurizer {scoring.featurizer} (featurizer:) is neither a folder nor in the "
                f"Hugging Face cache, and the Hub is offline; use --featurizer "
                f"{OFFLINE_FEATURIZER} (packaged; its MAUVE is not comparable with gpt2-large's)"
            )
        if scoring.evaluator is not None and unreachable(scoring.evaluator):
            problems.append(
                f"--evaluator {scoring.evaluator} (evaluator:) is neither a folder nor in the "
                "Hugging Face cache, and the Hub is offline; use --evaluator FOLDER (a causal "
                "model folder, e.g. an AR model trained here) or --evaluator none"
            )
        if problems:
            raise SettingError("cannot score offline:\n  " + "\n  ".join(problems))

    def _refuse_short_reference_pool(self, tokenizer, length: int) -> None:
        """Before any sample is generated: the references must hold ``num_references`` chunks
        of the model's length, or MAUVE would fail after every sample was generated. Only as
        many documents as that takes are tokenized."""
        scoring = self.scoring
        try:
            pool = load_reference_pool(
                scoring.references,
                tokenizer,
                length,
                scoring.num_references,
                scoring.reference_revision,
            )
            chunks = len(pool.chunks)
        except ValueError:  # not even one chunk of the model's length
            chunks = 0
        if chunks < scoring.num_references:
            raise SettingError(
                f"--num-references {scoring.num_references} (num_references:): the "
                f"{scoring.references} references hold {chunks} chunks of {length} tokens; "
                f"expected at most {chunks}"
            )

    def decode_config(self, base: DecodeConfig, tokenizer) -> DecodeConfig:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no EOS token to stop at")
        return base.replace(
            max_new_tokens=self.generation.max_new_tokens,
            do_sample=True,
            top_p=self.generation.top_p,
            repetition_penalty=self.generation.repetition_penalty,
            eos_token_ids=(tokenizer.eos_token_id,),
        )

    def output_text(self, example: Example, new_ids: list[int], tokenizer) -> str:
        return tokenizer.decode(new_ids, skip_special_tokens=True)

    def score(self, example: Example, text: str) -> dict[str, float]:
        # U+FFFD marks bytes that do not decode as UTF-8 (a byte-level BPE can end mid-character).
        scores = {"characters": len(text), "invalid_utf8_output": float("\ufffd" in text)}
        if self._judge is not None:
            scores |= self._judge.scores(text)
        return scores

    def aggregate(self, records: list[dict]) -> dict[str, dict]:
        if self._prepared is None:
            raise RuntimeError("aggregate() needs examples(tokenizer, model) to have run first")
        tokenizer, model = self._prepared
        if self.featurizer is None and self.scoring.compute_mauve:
            self.featurizer = _featurizer(
                self.scoring.featurizer, model.device, self.scoring.featurizer_batch_size
            )
        if self.evaluator is None and self.scoring.evaluator is not None:
            self.evaluator = _evaluator(self.scoring.evaluator, model.device)
        return score_samples(
            records,
            tokenizer,
            model,
            self.generation,
            self.scoring,
            self.featurizer,
            self.evaluator,
        )


# One process scores several points (a τ sweep): what every point of it shares is loaded or
# computed once. Each is a pure function of its key (a loaded model is used read-only).
@functools.cache
def _featurizer(name: str, device, batch_size: int | None) -> Featurizer:
    return load_featurizer(name, device, batch_size)


@functools.cache
def _evaluator(name: str, device) -> CausalScorer:
    return load_evaluator(name, device)


@functools.cache
def _judge(version: str, training: tuple) -> arithmetic.SampleJudge:
    return arithmetic.SampleJudge(version, dict(training) or None)


_REFERENCE_FEATURES: dict[tuple[str, str], np.ndarray] = {}


def _reference_features(featurizer: Featurizer, texts: list[str]) -> np.ndarray:
    """The featurizer's features of the reference texts, computed once per process."""
    key = (featurizer.identity_string, _digest(texts))
    if key not in _REFERENCE_FEATURES:
        _REFERENCE_FEATURES[key] = featurizer.features(texts)
    return _REFERENCE_FEATURES[key]


# ----------------------------------------------------------------------------- decoding loop
def attempt_seed(sample_seed: int, attempt: int) -> int:
    """Attempt 0 uses the sample's own seed; a regeneration derives one from (seed, attempt)."""
    return sample_seed if attempt == 0 else example_seed(sample_seed, f"attempt-{attempt}")


def run_unconditional(
    task: UnconditionalTask,
    model,
    tokenizer,
    decode: DecodeConfig,
    out_dir: str | Path,
    settings: RunSettings | None = None,
    model_source: str = "",
    model_revision: dict | None = None,
) -> dict:
    """Generate every sample not yet in ``samples.jsonl`` (with rejection), then score them."""
    out_dir = Path(out_dir)
    settings = settings or RunSettings()
    generation = task.generation
    decode = task.decode_config(decode, tokenizer)
    sample_identity = generation_identity(
        task.name, generation.to_dict(), model, model_source, decode, settings.seed, model_revision
    )
    identity = sample_identity | {"scoring": task.scoring.to_dict()}
    digest = config_hash(identity)
    finished = finished_result(out_dir, digest, settings.shard)
    if finished is not None:
        return finished
    examples = task.examples(tokenizer, model)  # checks the settings against the model
    claim_folder(out_dir, sample_identity, config_hash(sample_identity))

    log = SampleLog(out_dir / "samples.jsonl")
    done = log.load()
    mine = shard_examples(examples, settings.shard)
    pending = [example for example in mine if example.id not in done]
    device = model.device
    reset_peak_memory(device)
    bar = progress_bar(len(mine), "unconditional", len(mine) - len(pending), "sample")
    schedule = scheduled_batches(examples, pending, settings)
    if schedule.rewarm:  # untimed, discarded
        _generate_with_rejection(
            model, tokenizer, decode, schedule.rewarm, generation, settings, pooled=False
        )

    for batch in schedule.batches:  # a sample is saved as soon as its last attempt is in

        def save(example: Example, attempts: list[dict], timed=batch.timed) -> None:
            warmup = example.id in schedule.warm_ids
            log.append(_record(task, example, attempts, tokenizer, warmup, timed))
            bar.update(1)

        _generate_with_rejection(
            model, tokenizer, decode, batch.examples, generation, settings, batch.pooled, save
        )
    bar.close()
    if settings.shard is not None:
        return finish_shard(mine, log, out_dir, digest, settings.shard)

    extra = {"samples_config_hash": config_hash(sample_identity)}
    return finish_run(task, examples, log, out_dir, identity, digest, settings, device, extra)


# on_final(sample, every attempt of it), called once its last attempt is in
FinalCallback = Callable[[Example, list[dict]], None]


def _generate_with_rejection(
    model,
    tokenizer,
    decode,
    batch,
    generation,
    settings,
    pooled: bool,
    on_final: FinalCallback | None = None,
) -> dict:
    """Every attempt of every sample of ``batch``: the rejected ones are decoded again together
    (one static batch, or, ``pooled``, a continuous-batching pool of ``settings.batch_size``
    slots), until each is accepted or out of attempts. Returns {id: [attempt, ...]}."""
    sample_seeds = {e.id: example_seed(settings.seed, e.id) for e in batch}
    attempts: dict[str, list[dict]] = {e.id: [] for e in batch}
    regenerate: set[str] = set()  # the samples of this round to decode again

    def judge(example: Example, attempt: dict) -> None:  # as soon as the attempt is done
        attempts[example.id].append(attempt)
        tries = len(attempts[example.id])
        if attempt["rejected"] is not None and tries < generation.rejection.max_attempts:
            regenerate.add(example.id)
        elif on_final is not None:
            on_final(example, attempts[example.id])

    active = list(batch)
    while active:
        seeds = [attempt_seed(sample_seeds[e.id], len(attempts[e.id])) for e in active]
        regenerate.clear()
        _decode_round(model, tokenizer, decode, active, seeds, generation, settings, pooled, judge)
        active = [e for e in active if e.id in regenerate]
    return attempts


def _decode_round(
    model, tokenizer, decode, samples, seeds, generation, settings, pooled: bool, judge
) -> None:
    """One attempt of each of ``samples``, each handed to ``judge(sample, attempt)`` as soon as
    it is done: when it leaves the pool, or at the end of the static batch."""
    prompts = [e.input_ids for e in samples]
    if pooled:
        size = settings.batch_size
        model.generate(
            prompts,
            decode,
            seeds=seeds,
            tokenizer=tokenizer,
            batch_size=size,
            on_finished=lambda i, one: judge(
                samples[i], _attempt(one, 0, seeds[i], decode, generation, size, None)
            ),
        )
        return
    with synchronized_timer(model.device) as elapsed:
        output = model.generate(prompts, decode, seeds=seeds, tokenizer=tokenizer)
    for row, sample in enumerate(samples):
        call = elapsed["seconds"]
        judge(sample, _attempt(output, row, seeds[row], decode, generation, len(samples), call))


def _attempt(output, row: int, seed: int, decode, generation, batch_size: int, call_seconds):
    """One attempt of a sample: row ``row`` of ``output`` with the sample rules applied, and
    its cost (``call_seconds``: a static batch's decoding call; None: timed by the pool)."""
    confidences = getattr(output, "new_token_confidences", None)
    kept, reason = apply_stop_rules(
        output.new_token_ids[row],
        output.stopped[row],
        decode.eos_token_ids,
        None if confidences is None else confidences[row],
        generation.low_confidence_stop,
        generation.entropy_stop,
    )
    batching = "static" if call_seconds is not None else "continuous"
    cost = decoding_fields(output, row, batch_size, call_seconds=call_seconds, batching=batching)
    return {
        "seed": seed,
        "output_ids": kept,
        "stop_reason": reason,
        "rejected": generation.rejection.verdict(kept),
        "decoded_tokens": cost.pop("generated_tokens"),
        **{key: value for key, value in cost.items() if key != "stopped"},
    }


def _record(task, example, attempts: list[dict], tokenizer, warmup: bool, timed: bool) -> dict:
    """One ``samples.jsonl`` line: the last attempt's sample, and the cost of all attempts (how
    it was batched: as its first attempt was)."""
    final, first = attempts[-1], attempts[0]
    ids = final["output_ids"]
    text = task.output_text(example, ids, tokenizer)
    steps = sum(a["steps"] for a in attempts)
    committed = sum(a["parallelism"] * a["steps"] for a in attempts)
    return {
        "id": example.id,
        "prompt": example.prompt,
        "reference": example.reference,
        "seed": attempts[0]["seed"],
        "output_text": text,
        "output_ids": ids,
        "stop_reason": final["stop_reason"],
        "accepted": final["rejected"] is None,
        "scores": task.score(example, text)
        | {"unigram_entropy": unigram_entropy(ids), "length": len(ids)},
        # Speed fields cover every attempt: what producing this sample cost.
        "generated_tokens": sum(a["decoded_tokens"] for a in attempts),
        "content_tokens": sum(a["content_tokens"] for a in attempts),
        "stopped": final["stop_reason"] != "max_new_tokens",
        "nfe": sum(a["nfe"] for a in attempts),
        "steps": steps,
        "positions_evaluated": sum(a["positions_evaluated"] for a in attempts),
        "parallelism": committed / steps if steps else 0.0,
        "latency_seconds": sum(a["latency_seconds"] for a in attempts),
        "seconds": sum(a["seconds"] for a in attempts),
        "batch_size": first["batch_size"],
        "batching": first["batching"],
        "warmup": warmup,
        "timed": timed,
        **sample_provenance(),
        "attempts": [{k: v for k, v in a.items() if k != "output_ids"} for a in attempts],
    }


# ------------------------------------------------------------------------------ references
@dataclass(frozen=True)
class ReferencePool:
    chunks: torch.Tensor  # (N, L) token ids: BOS + the next L - 1 tokens of the stream
    info: dict


def load_reference_pool(
    source: str, tokenizer, length: int, limit: int | None, revision: str | None = None
) -> ReferencePool:
    """Held-out documents, chunked like the training data (``ChunkedLMDataset``: one token
    stream with EOS after each document, wrapped into BOS + ``length - 1`` token chunks); the
    first ``limit`` chunks, or all of them."""
    if source in arithmetic.GRAMMARS:
        return _arithmetic_reference_pool(source, tokenizer, length, limit)
    from setdlm.data.text import first_chunks

    if source == "wikitext2":
        from setdlm.data.text import load_wikitext2

        documents = load_wikitext2().heldout
    elif source == "owt" and (prepared := prepared_documents("owt")) is not None:
        documents = prepared  # `setdlm data prepare`'s copy of the same split
    elif source == "owt":
        instead = "use the references wikitext2 (--references wikitext2; offline copy)"
        split = load_hub_dataset(
            OWT_HUB_ID, split=OWT_VALID_SPLIT, revision=revision, instead=instead
        )
        documents = split["text"]
    else:
        raise ValueError(f"reference source {source!r} is not one of {sorted(REFERENCE_SOURCES)}")
    chunks, used = first_chunks(documents, tokenizer, length, limit)
    chunks = chunks.input_ids[:limit]  # (N, L)
    info = {
        "source": source,
        "description": REFERENCE_SOURCES[source],
        "revision": revision,
        "documents": len(documents),
        "documents_tokenized": used,
        "chunk_tokens": length,
        "pool_size": len(chunks),
        "tokenizer": tokenizer.name_or_path,
    }
    return ReferencePool(chunks, info)


def _arithmetic_reference_pool(version: str, tokenizer, length: int, limit: int | None):
    """The first ``limit`` test problems of ``version``, one per row as the models were
    trained (BOS, the problem, EOS, EOS fill): the text MAUVE compares samples with, the rows
    likelihood-arithmetic scores."""
    count = ARITHMETIC_POOL if limit is None else limit
    chunks = arithmetic_rows(tokenizer, length, count, 0, version).input_ids  # (N, L)
    info = {
        "source": version,
        "description": REFERENCE_SOURCES[version],
        "revision": None,
        "documents": count,
        "documents_tokenized": count,
        "chunk_tokens": length,
        "pool_size": len(chunks),
        "tokenizer": tokenizer.name_or_path,
    }
    return ReferencePool(chunks, info)


def reference_text(chunk, tokenizer, protocol: str) -> str:
    # the chunk's BOS is ours, not part of the text stream; ids as Python ints (a tensor's
    # elements one by one would cost the tokenizer a conversion each)
    body = torch.as_tensor(chunk)[1:].tolist()
    return tokenizer.decode(body, skip_special_tokens=protocol == "clean")


def generation_text(ids: list[int], tokenizer, protocol: str) -> str:
    if protocol == "clean":
        return tokenizer.decode(ids, skip_special_tokens=True)
    return tokenizer.decode([tokenizer.bos_token_id, *ids], skip_special_tokens=False)


# --------------------------------------------------------------------------------- scoring
def score_samples(
    records,
    tokenizer,
    model,
    generation: GenerationSettings,
    scoring: ScoringSettings,
    featurizer: Featurizer,
    evaluator: CausalScorer | None,
) -> dict:
    """Quality metrics of finished samples: {name: {"value", "definition", ...}}."""
    ids = [r["output_ids"] for r in records]
    quality = {}
    if scoring.compute_mauve:
        quality = _mauve_metrics(ids, tokenizer, model.config.length, scoring, featurizer)
    if evaluator is not None:
        texts = [r["output_text"] for r in records]
        quality["gen_ppl"] = _gen_ppl_metric(texts, evaluator, scoring.perplexity)
    entropies = [unigram_entropy(tokens) for tokens in ids]
    lengths = [len(tokens) for tokens in ids]
    quality["unigram_entropy"] = {
        "value": statistics.mean(entropies),
        "std": statistics.pstdev(entropies),
        "bootstrap_95": bootstrap_95({"entropy": entropies})["entropy"],
        "definition": "mean over samples of the entropy (nats) of the sample's token-id "
        "frequencies (generated tokens kept, EOS excluded)",
    }
    quality["length"] = {
        "value": statistics.mean(lengths),
        "std": statistics.pstdev(lengths),
        "definition": "mean number of kept generated tokens per sample (EOS excluded)",
    }
    if generation.grammar is not None:
        quality |= _arithmetic_metrics(records, generation)
    quality["rejection"] = _rejection_metric(records, generation)
    quality["stop_reasons"] = {
        "value": len(records),
        "counts": _counts(r["stop_reason"] for r in records),
        "definition": "why each kept sample ended (eos, low_confidence, entropy, max_new_tokens)",
    }
    quality["empty_outputs"] = {
        "value": sum(not r["output_text"] for r in records),
        "definition": "samples whose text (special tokens removed) is empty: no kept token, or "
        "only special ones; MAUVE handles them by its empty-text policy, gen-PPL scores none "
        "of their tokens",
    }
    quality["invalid_utf8_outputs"] = {
        "value": int(sum(r["scores"]["invalid_utf8_output"] for r in records)),
        "definition": "samples whose bytes are not valid UTF-8 (decoded with U+FFFD); "
        "scored as decoded",
    }
    return quality


def _mauve_metrics(ids, tokenizer, length: int, scoring: ScoringSettings, featurizer) -> dict:
    # "paper" texts always hold the BOS marker, so only "clean" texts can be empty.
    generations = [generation_text(tokens, tokenizer, scoring.text_protocol) for tokens in ids]
    policy = apply_empty_policy(generations, scoring.empty_policy, scoring.empty_placeholder)
    if len(policy.texts) < 2:
        raise DataError(
            f"MAUVE needs at least 2 generations, but {len(policy.empty)} of {len(ids)} are empty "
            f"and empty_policy={scoring.empty_policy!r} leaves {len(policy.texts)}; the samples "
            "are kept in samples.jsonl (expected more samples, or a model that writes text)"
        )
    pool = load_reference_pool(
        scoring.references,
        tokenizer,
        length,
        scoring.reference_pool_limit,
        scoring.reference_revision,
    )
    if len(pool.chunks) < scoring.num_references:
        raise ValueError(
            f"{pool.info['description']}: {len(pool.chunks)} chunks of {length} "
            f"tokens, fewer than num_references={scoring.num_references}"
        )
    first = list(range(scoring.num_references))
    subsets = bootstrap_subsets(
        len(pool.chunks),
        scoring.num_references,
        scoring.bootstrap_subsets,
        scoring.bootstrap_rng_seed,
    )
    # Featurize each needed chunk once; the single run and the subsets pick rows of it.
    needed = sorted(set(first).union(*subsets))
    row_of = {index: row for row, index in enumerate(needed)}
    texts = [reference_text(pool.chunks[i], tokenizer, scoring.text_protocol) for i in needed]
    reference_features = _reference_features(featurizer, texts)  # (len(needed), d)
    generation_features = featurizer.features(policy.texts)  # (generations kept, d)

    references = pool.info | {
        "num_references": scoring.num_references,
        "decoding": TEXT_PROTOCOLS[scoring.text_protocol],
        "sha256_first": _digest([texts[row_of[i]] for i in first]),
    }
    common = {
        "featurizer": featurizer.identity | {"id": featurizer.identity_string},
        "text_protocol": scoring.text_protocol,
        "mauve_settings": scoring.mauve.to_dict(),
        "empty_generations": {"policy": scoring.empty_policy, "count": len(policy.empty)},
        "mauve_text_version": importlib.metadata.version("mauve-text"),
    }
    single = mauve_from_features(
        reference_features[[row_of[i] for i in first]],
        generation_features,
        scoring.mauve_seed,
        scoring.mauve,
    )
    quality = {
        "mauve": {
            "value": single["mauve"],
            "definition": "MAUVE (mauve-text; P = references, Q = generations) of the samples "
            f"against the first {scoring.num_references} reference chunks, features from "
            f"{featurizer.identity_string}; not comparable across featurizers",
            **single,
            **common,
            "references": references,
        }
    }
    if subsets:
        boot = mauve_bootstrap(
            reference_features,
            generation_features,
            [[row_of[i] for i in subset] for subset in subsets],
            scoring.bootstrap_base_seed,
            scoring.mauve,
        )
        quality["mauve_bootstrap"] = {
            "value": boot["mean"],
            "definition": f"mean (and std, ddof 0) of MAUVE over {len(subsets)} reference subsets "
            f"of {scoring.num_references} chunks drawn without replacement from the pool "
            f"(numpy default_rng({scoring.bootstrap_rng_seed})); run i seeded "
            f"{scoring.bootstrap_base_seed} + i",
            **boot,
            **common,
            "references": references | {"subsets_sha256": _digest(map(str, subsets))},
        }
    return quality


def _arithmetic_metrics(records, generation: GenerationSettings) -> dict:
    """Validity, correctness and novelty of samples judged as problems of the generator
    (per-sample 0/1 scores, each mean with its bootstrap interval over samples), and why the
    others are not valid or not correct."""
    version, training = generation.grammar, generation.training_problems
    definitions = {
        "valid": f"the sample reads as a problem of {version}'s grammar (setdlm/tasks/"
        "arithmetic.py judge_sample: names, objects, start, operations and their bounds), "
        "with a solution of its shape (one 'a op b = c' line per operation, then '#### n')",
        "correct": "valid, and every solution step and the final answer right for the "
        "problem it states (+ and x steps in either operand order where the grammar allows)",
    }
    if training is not None:
        definitions["novel"] = (
            f"valid, and its question is none of the model's {training['count']} training "
            f"problems ({training['generator']}, seed {training['seed']}; exact match)"
        )
    quality = scored_means(records, definitions)
    for name, definition in definitions.items():
        quality[name]["definition"] = f"{definition}; fraction of {len(records)} samples"
    verdicts = [arithmetic.judge_sample(r["output_text"], version) for r in records]
    quality["judged_reasons"] = {
        "value": sum(not v.correct for v in verdicts),
        # "question" / "solution" (their details vary by sample), "wrong: step k" as it is
        "counts": _counts(
            v.reason if v.reason.startswith("wrong") else v.reason.split(":")[0]
            for v in verdicts
            if v.reason
        ),
        "definition": "samples not correct, by why: question (not of the grammar), solution "
        "(not of its shape) or wrong (a step or the final answer)",
    }
    return quality


def _digest(texts) -> str:
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()


def _gen_ppl_metric(texts: list[str], evaluator: CausalScorer, settings) -> dict:
    result = generative_perplexity(evaluator, texts, settings)
    context = min(settings.context, evaluator.max_context)
    return {
        "value": result["perplexity"],
        "definition": "exp(total NLL / total scored tokens) of the generated texts, re-tokenized "
        "by the evaluator, scored with a sliding window, EOS tokens excluded",
        "evaluator": evaluator.identity,
        "settings": settings.to_dict()
        | {"effective_context": context, "effective_stride": min(settings.stride, context)},
        **{k: v for k, v in result.items() if k != "per_text"},
    }


def _rejection_metric(records, generation: GenerationSettings) -> dict:
    attempts = [a for r in records for a in r["attempts"]]
    reasons = _counts(a["rejected"] for a in attempts if a["rejected"] is not None)
    return {
        "value": sum(reasons.values()),
        "attempts": len(attempts),
        "rejected_by_reason": reasons,
        "samples_regenerated": sum(len(r["attempts"]) > 1 for r in records),
        "samples_out_of_attempts": sum(not r["accepted"] for r in records),
        "policy": generation.rejection.to_dict(),
        "definition": "attempts rejected (and regenerated while attempts remain): unigram "
        f"entropy < {generation.rejection.entropy_below} nats or at most "
        f"{generation.rejection.length_at_most} kept tokens; a sample out of attempts keeps "
        "its last one",
    }


def _counts(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


# ---------------------------------------------- `setdlm eval unconditional`, one point
def run_point(args, loaded, tokenizer, base: DecodeConfig, out: Path, settings) -> dict:
    """One point of `setdlm eval unconditional`: its generation and scoring settings from the
    command line (Table 4's with ``--table4``; a generator's grammar and training problems with
    ``--references arithmetic-<n>``), sampled and scored by run_unconditional."""
    from setdlm.eval.point import with_options
    from setdlm.tasks.arithmetic_task import training_problems

    family = loaded.model.config.family
    changes = {
        "num_samples": args.samples,
        "max_new_tokens": args.max_new_tokens or loaded.model.config.length - 1,
        "rejection": Rejection(*args.reject),  # ENTROPY,LENGTH,ATTEMPTS, by the schema's rules
    }
    if args.references in arithmetic.GRAMMARS:  # samples judged as problems of that generator
        changes["grammar"] = args.references
        changes["training_problems"] = training_problems(args.model)
    if args.top_p is not None:
        changes["top_p"] = args.top_p
    if args.repetition_penalty is not None:
        changes["repetition_penalty"] = args.repetition_penalty
    if not args.confidence_stop:
        changes["low_confidence_stop"] = None
    if not args.entropy_stop:
        changes["entropy_stop"] = None
    generation = (
        GenerationSettings.table4(family, **changes)
        if args.table4
        else GenerationSettings(**changes)
    )
    scoring = ScoringSettings(
        references=args.references,
        num_references=args.num_references,
        text_protocol=args.text_protocol,
        featurizer=args.featurizer,
        evaluator=None if args.evaluator == "none" else args.evaluator,
        bootstrap_subsets=args.bootstrap_subsets,
        compute_mauve=args.mauve,
    )
    return run_unconditional(
        UnconditionalTask(generation, scoring),
        loaded.model,
        tokenizer,
        with_options(base, loaded.model, args),
        out,
        settings,
        model_source=loaded.source(args.model),
        model_revision=loaded.revision_record(),
    )
