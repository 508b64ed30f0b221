"""The lm-eval model ``setdlm``: any family of setdlm/families.py, on any lm-eval task.

Importing this module registers the model (lm-eval's own model names stay registered), the
filters and the metric of the paper's GSM8K task. Then, from Python::

    import setdlm.eval.harness
    lm_eval.simple_evaluate(model="setdlm", model_args="pretrained=<folder|key|hub id>", ...)

or from the command line through ``lm_eval_main(argv)`` (``lm-eval`` with this module imported).

Model args: ``pretrained`` (a model folder, a key like ``gsm8k:setdlm-smax8`` or a Hub id),
``tokenizer`` (default: the checkpoint's own), ``revision``, ``policy`` (a decoding policy
of setdlm/families.py; default the family's own), the decoding knobs ``threshold`` (τ),
``window`` (SetDLM W), ``block_size`` (the decoding block), ``fht_cache_order`` (each default to
the published checkpoint's paper setting, else to the policy's default), ``max_new_tokens`` (when
a request gives no ``max_gen_toks``), ``batch_size``, ``batching`` (auto, static or continuous:
how generate_until batches, as ``setdlm eval --batching``), ``device``, ``seed``, ``mc_samples``
(noise draws averaged per log-likelihood), ``greedy_check``, ``warmup`` and ``log_dir``.

generate_until: each request's ``until`` strings stop decoding (on generated text only) and
cut the returned text, as does the tokenizer's EOS; ``max_gen_toks`` is the budget. Requests
are batched through ``Family.generate`` (consecutive requests with equal settings), each with
its own seed from (seed, task, doc id, request index). Every request's speed (counted tokens,
latency, NFE, parallelism) is kept in ``generation_records`` and, with ``log_dir``, appended to
``<log_dir>/generations.jsonl`` with a ``speed.json`` summary (``setdlm.eval.timing``), so
quality and speed come from the same run. Our own generation keys (prefix ``setdlm_``, used by
the paper's GSM8K task files) are listed in ``EXTRA_GENERATION_KEYS``.

loglikelihood / loglikelihood_rolling use each family's eval-mode loss (``Family.loss``):
AR gives the exact log-likelihood; MDLM and BD3LM a draw of the negative NELBO (one t per
sequence / per block; its expectation is a lower bound on log p, and one draw can be 0 when no
scored token was masked); SetDLM the exact log-likelihood under one sampled staggered order
(its expectation is a lower bound on log E_order p). The stochastic ones average
``mc_samples`` draws seeded per request. The rules are in ``score_continuations``;
``is_greedy`` is defined in ``_greedy_matches``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import lm_eval.api.metrics  # noqa: F401  (the "mean" aggregation our metric uses)
import lm_eval.filters  # noqa: F401  (lm-eval's filters, which the GSM8K task files chain)
import lm_eval.models  # noqa: F401  (lm-eval's own model names: registering ours first hides them)
import torch
import yaml
from lm_eval.api.filter import Filter
from lm_eval.api.model import LM
from lm_eval.api.registry import register_filter, register_metric, register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from setdlm.checkpoints.zoo import load_pretrained, load_tokenizer_for
from setdlm.core.decoding import DecodeConfig
from setdlm.data.tokenizers import load_tokenizer
from setdlm.eval.fingerprint import sample_provenance
from setdlm.eval.paper_decoding import default_stop_cadence
from setdlm.eval.records import SampleLog, example_seed
from setdlm.eval.runner import pooled, resolve_batching
from setdlm.eval.timing import decoding_fields, summarize_speed, synchronized_timer
from setdlm.families import family as family_info
from setdlm.families import with_knobs
from setdlm.tasks import gsm8k
from setdlm.util.files import atomic_write_json
from setdlm.util.paths import data_dir, data_path
from setdlm.util.progress import progress_bar

log = logging.getLogger(__name__)

MODEL_NAME = "setdlm"
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default for generate_until
# Generation keys of our own, beyond lm-eval's until / max_gen_toks / do_sample / temperature /
# top_p: {key: meaning}.
EXTRA_GENERATION_KEYS = {
    "setdlm_until_stops": "false: `until` strings only cut the returned text, decoding goes on "
    "(the official harness model); default true (lm-eval's contract)",
    "setdlm_stop_strings": "more strings that stop decoding (on generated text)",
    "setdlm_stop_regexes": "regexes that stop decoding (on generated text)",
    "setdlm_stop_repeated_tokens": "stop after this many identical tokens in a row",
    "setdlm_stop_on_eos": "stop at the tokenizer's EOS (default true; the text is cut there)",
    "setdlm_fill_context": "true: the budget is the model length minus the prompt",
    "repetition_penalty": "the engine's repetition penalty on generated tokens",
}


# ---------------------------------------------------------------------------------- the model
@dataclass
class _Generation:
    """One generate_until request, resolved."""

    key: str
    task: str | None
    doc_id: int | None
    context: str
    prompt_ids: list[int]
    config: DecodeConfig
    cut_at: tuple[str, ...]
    seed: int


@register_model(MODEL_NAME)
class SetDLMHarnessLM(LM):
    def __init__(
        self,
        pretrained: str,
        tokenizer: str | None = None,
        revision: str | None = None,
        threshold: float = 1e6,
        policy: str | None = None,
        window: int | None = None,
        block_size: int | None = None,
        fht_cache_order: bool | None = None,
        stop_cadence: str | None = None,
        max_new_tokens: int = DEFAULT_MAX_GEN_TOKS,
        batch_size: int | str | None = 1,
        max_batch_size: int | None = None,  # lm-eval passes it; there is no automatic batch size
        batching: str = "auto",
        device: str | None = None,
        seed: int = 1234,
        mc_samples: int = 1,
        greedy_check: bool = True,
        warmup: int = 1,
        log_dir: str | None = None,
    ):
        super().__init__()
        del max_batch_size
        self.batch_size = _positive_int("batch_size", 1 if batch_size is None else batch_size)
        self.mc_samples = _positive_int("mc_samples", mc_samples)
        self.seed, self.warmup = int(seed), int(warmup)
        self.greedy_check = bool(greedy_check)
        self._device = _resolve_device(device)
        self.batching = resolve_batching(str(batching), self._device, self.batch_size)
        loaded = load_pretrained(str(pretrained), revision)
        self.model = loaded.model.to(self._device).eval()
        self.tokenizer = load_tokenizer(tokenizer) if tokenizer else load_tokenizer_for(loaded)
        self.source = loaded.source(str(pretrained))
        spec, family = loaded.spec, self.model.config.family
        base = DecodeConfig(
            max_new_tokens=_positive_int("max_new_tokens", max_new_tokens),
            confidence_threshold=float(threshold),
            stop_cadence=stop_cadence or default_stop_cadence(spec),
        )
        # Unset knobs take the published checkpoint's paper setting, else the policy default.
        base = with_knobs(base, family, policy, **(spec.decode_knobs() if spec else {}))
        knobs = {"window": window, "block_size": block_size, "fht_cache_order": fht_cache_order}
        self.base_decode = with_knobs(base, family, **knobs)
        self.prefix_token_id = self._prefix_token()
        self.generation_records: list[dict] = []
        self.log_dir = Path(log_dir) if log_dir else None

    # ------------------------------------------------------------------ what lm-eval asks for
    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True):
        """The tokenizer's chat template (Qwen3: thinking enabled, as the paper), or the plain
        format of ``gsm8k.render_chat`` for a tokenizer without one."""
        return gsm8k.render_chat(chat_history, self.tokenizer, add_generation_prompt).text

    @property
    def family(self) -> str:
        return self.model.config.family

    @property
    def length(self) -> int:
        return self.model.config.length

    def _prefix_token(self) -> int:
        """The token an empty context becomes (BOS, else EOS), as lm-eval's models do."""
        for token in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id):
            if token is not None:
                return token
        raise ValueError(f"tokenizer {self.tokenizer_name} has neither a BOS nor an EOS token")

    def _encode_context(self, text: str) -> list[int]:
        return gsm8k.encode_prompt(text, self.tokenizer) if text else [self.prefix_token_id]

    # ------------------------------------------------------------------ generate_until
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        jobs = [
            self._resolve(request, key)
            for request, key in zip(requests, request_keys(requests), strict=True)
        ]
        texts: list[str] = []
        bar = progress_bar(len(jobs), "generate_until", unit="request", enabled=not disable_tqdm)
        continuous = pooled(self.batching, self.batch_size)
        # A pool takes every consecutive request of one configuration; the warm-up requests
        # go first, in a pool of their own, so that none of the timed ones waits behind them.
        untimed = max(0, self.warmup - len(self.generation_records)) if continuous else 0
        size = None if continuous else self.batch_size
        groups = [
            *consecutive_batches(jobs[:untimed], size, lambda job: job.config),
            *consecutive_batches(jobs[untimed:], size, lambda job: job.config),
        ]
        for batch in groups:
            texts += self._generate_pool(batch) if continuous else self._generate(batch)
            bar.update(len(batch))
        bar.close()
        for request, text in zip(requests, texts, strict=True):
            self.cache_hook.add_partial("generate_until", request.args, text)
        if self.log_dir is not None:
            atomic_write_json(self.log_dir / "speed.json", self.speed_summary())
        return texts

    def _resolve(self, request, key: str) -> _Generation:
        context, settings = request.args[0], dict(request.args[1] or {})
        until = settings.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        new_tokens = settings.pop("max_gen_toks", self.base_decode.max_new_tokens)
        sample = bool(settings.pop("do_sample", False))
        temperature = settings.pop("temperature", None)
        if temperature is not None and float(temperature) == 0.0:
            sample = False  # lm-eval's way of asking for greedy decoding
        elif sample and temperature is not None and float(temperature) != 1.0:
            raise ValueError(f"{key}: the engine samples at temperature 1 only, got {temperature}")
        until_stops = bool(settings.pop("setdlm_until_stops", True))
        stop_on_eos = bool(settings.pop("setdlm_stop_on_eos", True))
        prompt_ids = self._encode_context(context)
        if settings.pop("setdlm_fill_context", False):
            new_tokens = gsm8k.budget(
                gsm8k.PROTOCOLS["accuracy"], len(prompt_ids), self.length, f"request {key}"
            )
        eos = self.tokenizer.eos_token_id
        top_p = settings.pop("top_p", None)
        config = self.base_decode.replace(
            max_new_tokens=_positive_int(f"{key}: max_gen_toks", new_tokens),
            do_sample=sample,
            top_p=1.0 if top_p is None else float(top_p),
            repetition_penalty=float(settings.pop("repetition_penalty", 1.0)),
            stop_strings=tuple(until if until_stops else [])
            + tuple(settings.pop("setdlm_stop_strings", ())),
            stop_regexes=tuple(settings.pop("setdlm_stop_regexes", ())),
            stop_repeated_tokens=int(settings.pop("setdlm_stop_repeated_tokens", 0)),
            eos_token_ids=(eos,) if stop_on_eos and eos is not None else (),
        )
        if settings:
            raise ValueError(
                f"{key}: generation settings {sorted(settings)} are not supported by the "
                f"{MODEL_NAME} model; it reads until, max_gen_toks, do_sample, temperature, "
                f"top_p and {sorted(EXTRA_GENERATION_KEYS)}"
            )
        return _Generation(
            key=key,
            task=getattr(request, "task_name", None),
            doc_id=getattr(request, "doc_id", None),
            context=context,
            prompt_ids=prompt_ids,
            config=config,
            cut_at=(*until, self.tokenizer.eos_token or ""),
            seed=example_seed(self.seed, key),
        )

    def _generate(self, batch: list[_Generation]) -> list[str]:
        with synchronized_timer(self._device) as elapsed:
            output = self.model.generate(
                [job.prompt_ids for job in batch],
                batch[0].config,
                seeds=[job.seed for job in batch],
                tokenizer=self.tokenizer,
            )
        texts = []
        for row, job in enumerate(batch):
            speed = decoding_fields(output, row, len(batch), call_seconds=elapsed["seconds"])
            texts.append(self._keep(job, output, row, speed))
        return texts

    def _generate_pool(self, batch: list[_Generation]) -> list[str]:
        """Decode ``batch`` through a pool of ``batch_size`` slots; each request is kept (and
        logged) as it leaves the pool, and the texts come back in request order."""
        texts: dict[int, str] = {}

        def finished(i: int, one) -> None:
            fields = decoding_fields(one, 0, self.batch_size, batching="continuous")
            texts[i] = self._keep(batch[i], one, 0, fields)

        self.model.generate(
            [job.prompt_ids for job in batch],
            batch[0].config,
            seeds=[job.seed for job in batch],
            tokenizer=self.tokenizer,
            batch_size=self.batch_size,
            on_finished=finished,
        )
        return [texts[i] for i in range(len(batch))]

    def _keep(self, job: _Generation, output, row: int, speed: dict) -> str:
        """Record one request's generation (and log it); return its cut text."""
        new_ids = output.new_token_ids[row]
        text = gsm8k.cut_text(self.tokenizer.decode(new_ids, skip_special_tokens=False), job.cut_at)
        record = {
            "id": job.key,
            "task": job.task,
            "doc_id": job.doc_id,
            "prompt": job.context,
            "prompt_tokens": len(job.prompt_ids),
            "output_text": text,
            "output_ids": new_ids,
            **speed,
            "warmup": len(self.generation_records) < self.warmup,
            "seed": job.seed,
            **sample_provenance(),
        }
        self.generation_records.append(record)
        if self.log_dir is not None:
            SampleLog(self.log_dir / "generations.jsonl").append(record)
        return text

    def speed_summary(self) -> dict:
        """Speed of the generate_until requests so far (warm-up requests excluded)."""
        return {
            "model": self.source,
            "family": self.family,
            "decode": self.base_decode.to_dict(),
            "batch_size": self.batch_size,
            "batching": self.batching,
            "requests": len(self.generation_records),
            **summarize_speed(self.generation_records),
        }

    # ------------------------------------------------------------------ log-likelihoods
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        keys = request_keys(requests)
        pairs = [self._encode_pair(*request.args[:2]) for request in requests]
        fitted = [self._fit(pair, key) for pair, key in zip(pairs, keys, strict=True)]
        scores = self.score_continuations(fitted, keys)
        greedy = self._greedy_matches(fitted) if self.greedy_check else [False] * len(fitted)
        results = list(zip(scores, greedy, strict=True))
        for request, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Whole-text log-likelihoods over lm-eval's disjoint windows: each window scores up to
        length - 1 new tokens after one token of context (the first after the prefix token)."""
        pairs, owners, keys = [], [], []
        for index, (request, key) in enumerate(zip(requests, request_keys(requests), strict=True)):
            tokens = self.tokenizer(request.args[0], add_special_tokens=False)["input_ids"]
            windows = get_rolling_token_windows(
                tokens, self.prefix_token_id, max_seq_len=self.length - 1, context_len=1
            )
            for number, window in enumerate(map(make_disjoint_window, windows)):
                pairs.append(window)
                owners.append(index)
                keys.append(f"{key}/window-{number}")
        totals = [0.0] * len(requests)
        for owner, score in zip(owners, self.score_continuations(pairs, keys), strict=True):
            totals[owner] += score
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of (context, continuation). Whitespace that ends the context moves to
        the continuation, and the continuation's ids are read off the encoding of the whole
        text when it extends the context's, so BPE merges match how the text is written."""
        stripped = context.rstrip()
        continuation = context[len(stripped) :] + continuation
        context_ids = self._encode_context(stripped)
        whole = self._encode_context(stripped + continuation)
        if stripped and whole[: len(context_ids)] == context_ids:
            return context_ids, whole[len(context_ids) :]
        return context_ids, self.tokenizer(continuation, add_special_tokens=False)["input_ids"]

    def _fit(self, pair: tuple[list[int], list[int]], key: str) -> tuple[list[int], list[int]]:
        """Context truncated from the left so that context + continuation fit the model
        length; a continuation that leaves no room for one context token is an error."""
        context, continuation = pair
        if not continuation:
            raise ValueError(f"{key}: the continuation encodes to no token")
        if len(continuation) > self.length - 1:
            raise ValueError(
                f"{key}: the continuation has {len(continuation)} tokens; a model of length "
                f"{self.length} scores at most {self.length - 1} after one context token "
                f"(use loglikelihood_rolling for long texts)"
            )
        return context[-(self.length - len(continuation)) :], continuation

    @torch.inference_mode()
    def score_continuations(self, pairs: list[tuple[list[int], list[int]]], keys: list[str]):
        """log p(continuation | context) of each (context, continuation) pair, which must fit
        the model length, through the family's eval-mode loss.

        Each pair is one row padded on the right to the model length (as in training: padding
        is invisible and never scored), the context marked as context (never noised, never
        scored). AR rows are exact and batched. The other families' rows are stochastic: each
        pair gets ``mc_samples`` copies in one batch, noise from a generator seeded by
        (seed, request key), and the mean of their log-likelihoods, so a score depends on
        neither batch size nor request order.
        """
        scores: list[float] = []
        if family_info(self.family).likelihood_exact:  # deterministic: batched, one draw
            for start in range(0, len(pairs), self.batch_size):
                chunk = pairs[start : start + self.batch_size]
                scores += self._row_log_likelihoods(chunk, keys[start : start + len(chunk)], None)
            return scores
        for pair, key in zip(pairs, keys, strict=True):
            generator = torch.Generator().manual_seed(example_seed(self.seed, key))
            draws = self._row_log_likelihoods(
                [pair] * self.mc_samples, [key] * self.mc_samples, generator
            )
            scores.append(sum(draws) / len(draws))
        return scores

    def _row_log_likelihoods(self, pairs, keys, generator) -> list[float]:
        batch = self._batch(pairs)
        output = self.model.loss(batch, generator=generator)
        counted = output.token_mask.sum(dim=-1).tolist()  # (B,)
        for (_, continuation), count, key in zip(pairs, counted, keys, strict=True):
            if int(count) != len(continuation):
                raise ValueError(
                    f"{key}: the {self.family} loss counted {int(count)} of the "
                    f"{len(continuation)} continuation tokens (official_compat models drop "
                    f"terms whose token is the pad id); the score would not be log p"
                )
        return (-output.nlls.double().sum(dim=-1)).tolist()  # (B,)

    def _batch(self, pairs) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask and context_mask, (B, length) each."""
        ids = torch.full((len(pairs), self.length), self.model.config.pad_token_id)
        attention = torch.zeros((len(pairs), self.length), dtype=torch.bool)
        context = torch.zeros_like(attention)
        for row, (prefix, continuation) in enumerate(pairs):
            tokens = prefix + continuation
            ids[row, : len(tokens)] = torch.tensor(tokens)
            attention[row, : len(tokens)] = True
            context[row, : len(prefix)] = True
        return {"input_ids": ids, "attention_mask": attention, "context_mask": context}

    def _greedy_matches(self, pairs) -> list[bool]:
        """Whether greedy decoding (this model's knobs, no stop rule, as many new tokens as
        the continuation) reproduces the continuation: lm-eval's is_greedy for AR, and the
        same definition for the diffusion families."""
        matches = [False] * len(pairs)
        by_length: dict[int, list[int]] = {}
        for index, (_, continuation) in enumerate(pairs):
            by_length.setdefault(len(continuation), []).append(index)
        for count, indices in by_length.items():
            config = self.base_decode.replace(max_new_tokens=count, do_sample=False)
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                output = self.model.generate([pairs[i][0] for i in chunk], config)
                for row, index in enumerate(chunk):
                    matches[index] = output.new_token_ids[row] == pairs[index][1]
        return matches


# -------------------------------------------------------------------------------- helpers
def request_keys(requests) -> list[str]:
    """A stable id per request: task/doc/index, plus an occurrence number for repeats (the same
    request repeated for sampling gets a different seed each time)."""
    seen: dict[str, int] = {}
    keys = []
    for position, request in enumerate(requests):
        task = getattr(request, "task_name", None)
        doc = getattr(request, "doc_id", None)
        base = (
            f"request-{position}" if task is None or doc is None else f"{task}/{doc}/{request.idx}"
        )
        occurrence = seen.get(base, 0)
        seen[base] = occurrence + 1
        keys.append(base if occurrence == 0 else f"{base}/repeat-{occurrence}")
    return keys


def consecutive_batches(items: list, size: int | None, key: Callable) -> Iterable[list]:
    """Consecutive items sharing ``key``, at most ``size`` at a time (None: no limit; order is
    kept)."""
    batch: list = []
    for item in items:
        if batch and (len(batch) == size or key(item) != key(batch[0])):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


def _positive_int(name: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1 or number != float(value):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


def _resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        log.warning("device %s was asked for but CUDA is not available: using the CPU", device)
        return torch.device("cpu")
    return torch.device(device)


# ------------------------------------------------------------- the paper's GSM8K task pieces
@register_filter("setdlm_gsm8k_rewrite_boxed")
class RewriteBoxedFilter(Filter):
    """The official harness model's rewrite ``gsm8k.rewrite_boxed`` ("...#### answer")."""

    def apply(self, resps, docs):
        return [[gsm8k.rewrite_boxed(text) for text in responses] for responses in resps]


@register_filter("setdlm_gsm8k_boxed_answer")
class BoxedAnswerFilter(Filter):
    """The paper script's answer: the first box's content (``gsm8k.boxed_answer``)."""

    def apply(self, resps, docs):
        return [
            [gsm8k.boxed_answer(text) or gsm8k.NO_BOXED_ANSWER for text in responses]
            for responses in resps
        ]


@register_metric(
    metric="gsm8k_paper_exact",
    higher_is_better=True,
    output_type="generate_until",
    aggregation="mean",
)
def gsm8k_paper_exact(references, predictions, **kwargs) -> float:
    """Exact string equality with the reference after '### ' (the paper script's metric)."""
    return float(predictions[0] == gsm8k.reference_answer(references[0]))


# ------------------------------------------------------------------------ offline task files
GSM8K_LOCAL_TASK = "gsm8k_local"
PAPER_TASKS = {name: f"gsm8k_setdlm_{name}" for name in gsm8k.PROTOCOLS}


def write_task(folder: str | Path, task: str, base_file: str | Path, **fields) -> Path:
    """``<folder>/<task>.yaml``: the task file ``base_file`` (included, by absolute path) with
    ``fields`` replacing its top-level keys; not tagged, so that no group picks it up."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"include": str(Path(base_file).resolve()), "task": task, "tag": [], **fields}
    path = folder / f"{task}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return path


def local_dataset_fields(data_files: dict[str, str | Path]) -> dict:
    """Fields that make a task read local JSON-lines files (absolute paths: relative ones
    would resolve against the process's working folder)."""
    files = {}
    for split, file in data_files.items():
        path = Path(file).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"data file for split {split!r} not found: {path}")
        files[split] = str(path)
    return {"dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": files}}


def write_gsm8k_tasks(folder: str | Path, source: str = "auto") -> list[str]:
    """Write the GSM8K task files into ``folder`` (an lm-eval ``include_path``); returns the
    task names.

    - ``gsm8k_local`` (only with local data): lm-eval's own gsm8k task, reading
      ``SETDLM_DATA_DIR/gsm8k/{train,test}.jsonl``;
    - ``gsm8k_setdlm_pareto`` / ``gsm8k_setdlm_accuracy``: the paper's protocol. 0-shot, the
      boxed instruction as the user turn (run with ``apply_chat_template``, as the paper's
      config did), decoding until the first generated box or 8 repeated tokens (accuracy: also
      ``<|im_end|>``, budget = length - prompt; pareto: 1024 tokens), lm-eval's ``until``
      strings only cutting the text as in the official model, then lm-eval's strict-match and
      flexible-extract on the rewritten text plus the paper's own extraction (filter
      ``paper-boxed``, metric ``gsm8k_paper_exact``).

    source: "local" (the data folder), "hub" (openai/gsm8k) or "auto" (local when
    ``SETDLM_DATA_DIR`` is set).
    """
    if source == "auto":
        source = "local" if data_dir() is not None else "hub"
    if source not in ("local", "hub"):
        raise ValueError(f"source must be 'auto', 'local' or 'hub', got {source!r}")
    base = gsm8k.lm_eval_task_file("gsm8k/gsm8k.yaml")
    dataset = {}
    names = []
    if source == "local":
        dataset = local_dataset_fields(
            {split: data_path("gsm8k", f"{split}.jsonl") for split in ("train", "test")}
        )
        write_task(folder, GSM8K_LOCAL_TASK, base, **dataset)
        names.append(GSM8K_LOCAL_TASK)
    builtin = gsm8k.lm_eval_gsm8k_config()
    filters = [
        {
            "name": entry["name"],
            "filter": [{"function": "setdlm_gsm8k_rewrite_boxed"}, *entry["filter"]],
        }
        for entry in builtin["filter_list"]
    ]
    filters.append(
        {
            "name": "paper-boxed",
            "filter": [{"function": "setdlm_gsm8k_boxed_answer"}, {"function": "take_first"}],
        }
    )
    metrics = [
        *builtin["metric_list"],
        {"metric": "gsm8k_paper_exact", "aggregation": "mean", "higher_is_better": True},
    ]
    for name, task in PAPER_TASKS.items():
        proto = gsm8k.PROTOCOLS[name]
        generation = {
            "until": list(gsm8k.CUT_STRINGS),
            "do_sample": False,
            "setdlm_until_stops": False,
            "setdlm_stop_regexes": [gsm8k.BOXED_STOP_REGEX],
            "setdlm_stop_repeated_tokens": gsm8k.REPEATED_TOKENS_STOP,
        }
        if proto.stop_on_im_end:
            generation["setdlm_stop_strings"] = [gsm8k.IM_END]
        if proto.max_new_tokens is None:
            generation["setdlm_fill_context"] = True
        else:
            generation["max_gen_toks"] = proto.max_new_tokens
        write_task(
            folder,
            task,
            base,
            **dataset,
            num_fewshot=0,
            doc_to_text=f"{gsm8k.INSTRUCTION} {{{{question}}}}",
            generation_kwargs=generation,
            filter_list=filters,
            metric_list=metrics,
            metadata={"version": builtin["metadata"]["version"], "protocol": name},
        )
        names.append(task)
    return names


# ------------------------------------------------------------------------------ command line
def lm_eval_main(argv: list[str] | None = None) -> int:
    """The ``lm-eval`` command line with the ``setdlm`` model registered (by this module)."""
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        sys.argv = saved
    return 0
