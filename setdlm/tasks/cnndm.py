"""CNN/DailyMail summarization (SPEC 5.2): the paper's prompt, decoding rules and ROUGE.

data -> prompt (BOS + article cut to 512 tokens + EOS + the "Summary:" tokens) -> decoding
(180 new tokens, repetition penalty 1.2 on the generated tokens, exponential length penalty on
EOS from 80 generated tokens on, factor 1.1, stop at the first generated EOS) -> text (decoded
with special tokens, cut at the EOS text, stripped) -> ROUGE-1/2/L/Lsum F1 against the
highlights.

Data: the test split of ``abisee/cnn_dailymail`` 3.0.0 (11,490 articles) from the Hub, or,
when ``SETDLM_DATA_DIR`` is set, its ``cnn_dailymail/test_sample100.jsonl`` (100 test articles,
PTB-tokenized: smoke tests only, ROUGE not comparable with Hub-text numbers).

The prompt is built from token ids, so it is the same for any tokenizer: the article is
tokenized alone (no special tokens added) and cut to ``max_article_tokens``, and the target
prompt is tokenized alone and appended, as the official script does with
``tokenizer.encode("Summary:")``. Training used "Summary: " + highlights; the trailing space is
dropped because the tokenizer merges it into the next token. BOS and EOS are the model's
(``<|endoftext|>`` for both in the paper's runs): EOS is the tokenizer's or ``eos_token``, and a
model trained with another EOS id is refused; BOS is the model's, else the tokenizer's, else EOS.

Stopping (SPEC 8.2 item 3): the official criterion is the regex literally ``r'<|endoftext|>'``
(an alternation of "r'<", "endoftext" and ">'") needing 3 matches in the decoded prompt plus
generation; the prompt holds two (its BOS and EOS), so it stops at the first generated EOS.
``stop="first_eos"`` (default) says exactly that. ``stop="official_pattern"`` also stops at the
first generated text matching that alternation, which reproduces the official rule whenever the
article itself holds none of the three strings. The official SetDLM sampler checks the rule
only every W steps and keeps up to W - 1 tokens past the stop; the text is the same after the
cut at EOS, and here no family counts tokens past its stop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from setdlm.core.decoding import DecodeConfig
from setdlm.data.jsonl import read_jsonl
from setdlm.eval.generated_text import flag_counts, output_flags, text_before_eos
from setdlm.eval.rouge import RougeScorer, RougeSettings, aggregate_rouge
from setdlm.eval.runner import Example, Task
from setdlm.util.errors import DataError
from setdlm.util.files import sha256_file
from setdlm.util.hub import load_hub_dataset
from setdlm.util.paths import data_dir, data_path

HUB_DATASET = ("abisee/cnn_dailymail", "3.0.0")
OFFLINE_FILE = ("cnn_dailymail", "test_sample100.jsonl")
# The full test split, as `setdlm data prepare` writes it from the Hub: read instead of the
# 100-article sample when the data folder holds it.
FULL_TEST_FILE = ("cnn_dailymail", "test.jsonl")
PAPER_MODEL_LENGTH = 768
OFFICIAL_STOP_PATTERN = "r'<|endoftext|>'"  # the YAML value, quotes and r included


@dataclass(frozen=True)
class CnnDmSettings:
    max_article_tokens: int = 512
    target_prompt: str = "Summary:"
    max_new_tokens: int = 180
    repetition_penalty: float = 1.2  # on the generated tokens, as the official processors
    length_penalty: tuple[int, float] | None = (80, 1.1)  # (start, factor) on EOS
    stop: Literal["first_eos", "official_pattern"] = "first_eos"
    # Special tokens by their text; None = the model's own ids (model.config), else the
    # tokenizer's, and BOS falls back to EOS (the official maybe_add_missing_special_tokens).
    bos_token: str | None = None
    eos_token: str | None = None
    limit: int | None = None  # the first N test articles (None: all)
    rouge: RougeSettings = field(default_factory=RougeSettings)

    def __post_init__(self):
        if self.max_article_tokens < 1 or self.max_new_tokens < 1:
            raise ValueError("max_article_tokens and max_new_tokens must be >= 1")
        if self.stop not in ("first_eos", "official_pattern"):
            raise ValueError(f"stop must be 'first_eos' or 'official_pattern', got {self.stop!r}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {self.limit}")


def settings_for_model_length(
    length: int, tokenizer, base: CnnDmSettings = CnnDmSettings()
) -> CnnDmSettings:
    """The paper's settings shrunk to a model shorter than the paper's 768 positions.

    The summary budget and the length penalty's start scale with the length; the article gets
    what is left after BOS, EOS, the target prompt and the summary (at most the paper's 512).
    At length 768 this returns the paper's settings unchanged.
    """
    scale = length / PAPER_MODEL_LENGTH
    new_tokens = max(1, round(base.max_new_tokens * scale))
    prompt_tokens = len(tokenizer.encode(base.target_prompt, add_special_tokens=False))
    article_tokens = min(base.max_article_tokens, length - new_tokens - 2 - prompt_tokens)
    if article_tokens < 1:
        raise ValueError(f"a model of length {length} cannot hold any article")
    penalty = base.length_penalty
    if penalty is not None:
        penalty = (max(1, round(penalty[0] * scale)), penalty[1])
    return replace(
        base,
        max_article_tokens=article_tokens,
        max_new_tokens=new_tokens,
        length_penalty=penalty,
    )


# ------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Article:
    id: str
    article: str
    highlights: str


def offline_file() -> Path:
    """The data folder's full test split if it has one, else its 100-article sample."""
    full = data_dir().joinpath(*FULL_TEST_FILE)
    return full if full.is_file() else data_path(*OFFLINE_FILE)


def data_source() -> dict:
    """Where the test articles come from, with the file hash when it is the local mirror."""
    if data_dir() is not None:
        path = offline_file()
        return {"source": path.relative_to(data_dir()).as_posix(), "sha256": sha256_file(path)}
    return {"source": f"hub:{HUB_DATASET[0]}", "config": HUB_DATASET[1], "split": "test"}


def load_test_articles() -> list[Article]:
    """The test articles in dataset order, from the local mirror or the Hub."""
    if data_dir() is not None:
        return read_articles_jsonl(offline_file())
    instead = "set SETDLM_DATA_DIR to the offline data folder (e.g. ../shared/data)"
    rows = load_hub_dataset(*HUB_DATASET, split="test", instead=instead)
    return [Article(r["id"], r["article"], r["highlights"]) for r in rows]


def read_articles_jsonl(path: Path) -> list[Article]:
    """Articles from a JSON-lines file with ``doc_id``, ``article`` and ``highlights``."""
    articles, seen = [], set()
    for number, row in read_jsonl(path, required=("doc_id", "article", "highlights")):
        if row["doc_id"] in seen:
            raise DataError(f"{path}:{number}: duplicate doc_id {row['doc_id']!r}")
        seen.add(row["doc_id"])
        articles.append(Article(row["doc_id"], row["article"], row["highlights"]))
    if not articles:
        raise DataError(f"{path} holds no articles")
    return articles


# ----------------------------------------------------------------------------------- prompt
def build_prompt(
    article: str,
    tokenizer,
    *,
    bos_token_id: int,
    eos_token_id: int,
    max_article_tokens: int,
    target_prompt: str,
) -> list[int]:
    """[BOS] + the article's first ``max_article_tokens`` tokens + [EOS] + target prompt."""
    article_ids = tokenizer.encode(article, add_special_tokens=False)[:max_article_tokens]
    prompt_ids = tokenizer.encode(target_prompt, add_special_tokens=False)
    return [bos_token_id, *article_ids, eos_token_id, *prompt_ids]


def _token_id(tokenizer, text: str, role: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(text)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"{role} token {text!r} is not in the tokenizer's vocabulary")
    return token_id


# ------------------------------------------------------------------------------------- task
class CnnDmTask(Task):
    name = "cnndm"

    def __init__(self, settings: CnnDmSettings = CnnDmSettings()):
        self.config = settings
        self.scorer = RougeScorer(settings.rouge)

    def settings(self) -> dict:
        values = asdict(self.config) | {"rouge": self.config.rouge.to_dict()}
        return values | {"data": data_source()}

    def eos_id(self, tokenizer) -> int:
        """The EOS the decoding stops at and the length penalty favours."""
        if self.config.eos_token is not None:
            return _token_id(tokenizer, self.config.eos_token, "eos")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token: set CnnDmSettings.eos_token")
        return tokenizer.eos_token_id

    def bos_id(self, tokenizer, model) -> int:
        if self.config.bos_token is not None:
            return _token_id(tokenizer, self.config.bos_token, "bos")
        for candidate in (model.config.bos_token_id, tokenizer.bos_token_id):
            if candidate is not None:
                return candidate
        return self.eos_id(tokenizer)  # the official convention: BOS = EOS when missing

    def examples(self, tokenizer, model) -> list[Example]:
        eos = self.eos_id(tokenizer)
        if model.config.eos_token_id is not None and model.config.eos_token_id != eos:
            raise ValueError(
                f"the model was trained with EOS id {model.config.eos_token_id} but the "
                f"tokenizer's EOS is {eos} ({tokenizer.decode([eos])!r}): pass the model's EOS "
                f"text as CnnDmSettings.eos_token"
            )
        bos = self.bos_id(tokenizer, model)
        articles = load_test_articles()[: self.config.limit]
        examples = []
        for article in articles:
            ids = build_prompt(
                article.article,
                tokenizer,
                bos_token_id=bos,
                eos_token_id=eos,
                max_article_tokens=self.config.max_article_tokens,
                target_prompt=self.config.target_prompt,
            )
            self._check_fits(article.id, len(ids), model.config.length)
            examples.append(
                Example(
                    id=article.id,
                    input_ids=ids,
                    prompt=tokenizer.decode(ids, skip_special_tokens=False),
                    reference=article.highlights,
                )
            )
        return examples

    def _check_fits(self, example_id: str, prompt_length: int, model_length: int) -> None:
        """Prompt plus summary budget must fit the model, as 517 + 180 fits 768 in the paper."""
        needed = prompt_length + self.config.max_new_tokens
        if needed > model_length:
            raise ValueError(
                f"CNN/DM example {example_id}: prompt of {prompt_length} tokens + "
                f"{self.config.max_new_tokens} new tokens = {needed} does not fit the model's "
                f"length {model_length}; lower max_article_tokens (by at least "
                f"{needed - model_length}) or max_new_tokens, e.g. with "
                f"settings_for_model_length({model_length}, tokenizer)"
            )

    def decode_config(self, base: DecodeConfig, tokenizer) -> DecodeConfig:
        official = self.config.stop == "official_pattern"
        return base.replace(
            max_new_tokens=self.config.max_new_tokens,
            repetition_penalty=self.config.repetition_penalty,
            repetition_context="generated",
            length_penalty=self.config.length_penalty,
            eos_token_ids=(self.eos_id(tokenizer),),
            stop_strings=(),
            stop_regexes=(OFFICIAL_STOP_PATTERN,) if official else (),
            stop_repeated_tokens=0,
        )

    def output_text(self, example: Example, new_ids: list[int], tokenizer) -> str:
        return text_before_eos(new_ids, tokenizer, self.eos_id(tokenizer))

    def score(self, example: Example, text: str) -> dict[str, float]:
        return self.scorer.score(example.reference, text) | output_flags(text)

    def aggregate(self, records: list[dict]) -> dict[str, dict]:
        per_example = [r["scores"] for r in records]
        return aggregate_rouge(per_example, self.config.rouge) | flag_counts(records)


# ---------------------------------------------- `setdlm eval cnndm`, one point
def run_point(args, loaded, tokenizer, base: DecodeConfig, out: Path, settings) -> dict:
    """One point of `setdlm eval cnndm`: the paper's settings, fitted to a model shorter than
    the paper's (setdlm/eval/point.py runs it)."""
    from setdlm.eval.paper_decoding import paper_decode_config
    from setdlm.eval.point import evaluate

    model = loaded.model
    eos = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
    task_settings = CnnDmSettings(limit=args.limit, stop=args.stop, eos_token=eos)
    if model.config.length < 768:
        task_settings = settings_for_model_length(model.config.length, tokenizer, task_settings)
    decode = paper_decode_config("cnndm", loaded.spec or model, base)
    return evaluate(CnnDmTask(task_settings), decode, args, loaded, tokenizer, out, settings)
