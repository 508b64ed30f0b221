"""ROCStories infilling (SPEC 5.4, paper Table 2): fill masked story sentences, score with ROUGE.

data -> story (the 4 input sentences + the right ending) -> segments (prefix, middle, suffix)
-> input (BOS + prefix + MASK * m + suffix + EOS, each segment tokenized alone, m = the gold
middle's token count: the oracle length) -> decoding -> text (the span's tokens decoded, cut
at the EOS text, stripped) -> ROUGE-1/2/L F1 against the middle text.

- infill-1 masks sentence 3: prefix "s1 s2", middle "s3", suffix " s4 s5";
- infill-3 masks sentences 2-4: prefix "s1", middle "s2 s3 s4", suffix " s5".

The diffusion families decode the masked span in place, seeing both contexts (SetDLM caches
every visible token of both sides first, then slides its window over the span). AR sees only
BOS + prefix and generates exactly m tokens (``Example.max_new_tokens``), as the official
script does by cutting the input at its first mask.

Repetition penalty (SPEC 8.2 item 7), ``repetition=``:
- "paper" (default): 1.2 for both variants over every visible token, right context included
  (``repro_paper_infill_rouge_tput_h100.sh``);
- "script_default": the shell defaults 1.1 (infill-1) / 1.5 (infill-3). The official script
  then penalizes the tokens left of the decoding window (left context and span so far); the
  engine offers only "generated" or "visible", so this option keeps "visible" and differs from
  the script in also penalizing right-context tokens.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from setdlm.core.decoding import DecodeConfig
from setdlm.data.mirror import read_text
from setdlm.eval.generated_text import flag_counts, output_flags, text_before_eos
from setdlm.eval.rouge import RougeScorer, RougeSettings, aggregate_rouge
from setdlm.eval.runner import Example, Task
from setdlm.families import family as family_info
from setdlm.util.errors import DataError
from setdlm.util.files import sha256_file
from setdlm.util.paths import data_path

ROCSTORIES_FILE = ("rocstories", "cloze_test_val__spring2016.csv")
COLUMNS = (
    "InputStoryid",
    "InputSentence1",
    "InputSentence2",
    "InputSentence3",
    "InputSentence4",
    "RandomFifthSentenceQuiz1",
    "RandomFifthSentenceQuiz2",
    "AnswerRightEnding",
)
# The masked sentences of each variant, numbered 1-5.
MASKED_SENTENCES = {"infill-1": (3,), "infill-3": (2, 3, 4)}
PAPER_REPETITION_PENALTY = 1.2
SCRIPT_DEFAULT_REPETITION_PENALTY = {"infill-1": 1.1, "infill-3": 1.5}


# ------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Story:
    id: str
    sentences: tuple[str, ...]  # the 4 input sentences and the right ending


def read_stories(path: str | Path) -> list[Story]:
    """A Story Cloze CSV's stories in file order, each ending with its right ending."""
    path = Path(path)
    try:
        text = read_text(path)  # UTF-8, or refused naming the file
    except OSError as error:
        raise DataError(f"{path}: cannot read it ({error.strerror or error})") from None
    with io.StringIO(text, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = sorted(set(COLUMNS) - set(reader.fieldnames or ()))
        if missing:
            raise DataError(f"{path}: missing columns {missing}")
        stories = []
        for line, row in enumerate(reader, start=2):  # line 1 is the header
            choice = row["AnswerRightEnding"]
            if choice not in ("1", "2"):
                raise DataError(f"{path}:{line}: AnswerRightEnding must be 1 or 2, got {choice!r}")
            sentences = [row[f"InputSentence{i}"] for i in range(1, 5)]
            sentences.append(row[f"RandomFifthSentenceQuiz{choice}"])
            story_id = row["InputStoryid"]
            if any(not (s or "").strip() for s in sentences):
                raise DataError(f"{path}:{line}: story {story_id} has an empty sentence")
            stories.append(Story(story_id, tuple(sentences)))
    if not stories:
        raise DataError(f"{path} holds no stories")
    return stories


class Segments(NamedTuple):
    prefix: str
    middle: str  # the masked sentence(s): the reference text
    suffix: str


def split_story(story: Story, variant: str) -> Segments:
    """The variant's prefix, middle and suffix; the spaces between sentences are SPEC 5.4's."""
    if variant not in MASKED_SENTENCES:
        raise ValueError(f"variant must be one of {sorted(MASKED_SENTENCES)}, got {variant!r}")
    masked = MASKED_SENTENCES[variant]
    first, last = masked[0] - 1, masked[-1]  # 0-based slice of the masked sentences
    sentences = story.sentences
    return Segments(
        prefix=" ".join(sentences[:first]),
        middle=" ".join(sentences[first:last]),
        suffix=" " + " ".join(sentences[last:]),
    )


class InfillInput(NamedTuple):
    input_ids: list[int]  # BOS + prefix + MASK * m + suffix + EOS
    span_start: int  # index of the first mask
    span_length: int  # m, the token count of the gold middle


def build_infill_input(
    segments: Segments, tokenizer, *, bos_token_id: int, eos_token_id: int, mask_token_id: int
) -> InfillInput:
    """Tokenize each segment alone (no special tokens added) and mask the middle's positions."""
    prefix, middle, suffix = (tokenizer.encode(text, add_special_tokens=False) for text in segments)
    ids = [bos_token_id, *prefix, *[mask_token_id] * len(middle), *suffix, eos_token_id]
    return InfillInput(ids, 1 + len(prefix), len(middle))


# ------------------------------------------------------------------------------------- task
@dataclass(frozen=True)
class InfillSettings:
    variant: Literal["infill-1", "infill-3"] = "infill-1"
    repetition: Literal["paper", "script_default"] = "paper"
    limit: int | None = None  # the first N stories (that fit, with too_long="skip")
    # A story whose input is longer than the model: "error", or "skip" it (counted). Decided on
    # the full input for every family, so all families score the same stories.
    too_long: Literal["error", "skip"] = "error"
    csv_path: str | None = None  # None: SETDLM_DATA_DIR/rocstories/cloze_test_val__spring2016.csv
    # Special tokens by their text; None = the model's ids, else the tokenizer's (BOS: else EOS).
    bos_token: str | None = None
    eos_token: str | None = None
    rouge: RougeSettings = field(
        default_factory=lambda: RougeSettings(rouge_types=("rouge1", "rouge2", "rougeL"))
    )

    def __post_init__(self):
        if self.variant not in MASKED_SENTENCES:
            raise ValueError(f"variant must be one of {sorted(MASKED_SENTENCES)}")
        if self.repetition not in ("paper", "script_default"):
            raise ValueError(
                f"repetition must be 'paper' or 'script_default', not {self.repetition}"
            )
        if self.too_long not in ("error", "skip"):
            raise ValueError(f"too_long must be 'error' or 'skip', got {self.too_long!r}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {self.limit}")

    @property
    def repetition_penalty(self) -> float:
        if self.repetition == "paper":
            return PAPER_REPETITION_PENALTY
        return SCRIPT_DEFAULT_REPETITION_PENALTY[self.variant]

    def stories_path(self) -> Path:
        return Path(self.csv_path) if self.csv_path else data_path(*ROCSTORIES_FILE)


class InfillTask(Task):
    def __init__(self, settings: InfillSettings = InfillSettings()):
        self.config = settings
        self.name = f"rocstories-{settings.variant}"
        self.scorer = RougeScorer(settings.rouge)
        # Stories too long for the model (too_long="skip"), among those read before the limit.
        self.skipped: list[str] = []

    def settings(self) -> dict:
        path = self.config.stories_path()
        return asdict(self.config) | {
            "rouge": self.config.rouge.to_dict(),
            "repetition_penalty": self.config.repetition_penalty,
            "repetition_context": "visible",
            "span_length": "oracle (token count of the gold middle)",
            "ar_input": "BOS + prefix; generates exactly the span length",
            "data": {"file": path.name, "sha256": sha256_file(path)},
        }

    def examples(self, tokenizer, model) -> list[Example]:
        bos, eos = self._special_ids(tokenizer, model)
        mask = model.config.mask_token_id
        left_context_only = family_info(model.config.family).left_to_right
        self.skipped = []
        examples = []
        for story in read_stories(self.config.stories_path()):
            if self.config.limit is not None and len(examples) == self.config.limit:
                break
            segments = split_story(story, self.config.variant)
            full = build_infill_input(
                segments, tokenizer, bos_token_id=bos, eos_token_id=eos, mask_token_id=mask
            )
            if not self._fits(story.id, len(full.input_ids), model.config.length):
                continue
            if left_context_only:  # BOS + prefix, then exactly the span's number of tokens
                input_ids = full.input_ids[: full.span_start]
                prompt, budget = tokenizer.decode(input_ids), full.span_length
            else:  # decoded in place: the span's masks are the budget
                input_ids, prompt, budget = full.input_ids, _readable(full, tokenizer), None
            examples.append(
                Example(
                    id=story.id,
                    input_ids=input_ids,
                    prompt=prompt,
                    reference=segments.middle,
                    meta={"span_length": full.span_length, "eos_token_id": eos},
                    max_new_tokens=budget,
                )
            )
        return examples

    def _special_ids(self, tokenizer, model) -> tuple[int, int]:
        """(BOS, EOS): the settings' tokens, else the model's ids, else the tokenizer's."""
        eos = _first_known(
            _id_of(tokenizer, self.config.eos_token),
            model.config.eos_token_id,
            tokenizer.eos_token_id,
        )
        if eos is None:
            raise ValueError("neither the model nor the tokenizer has an EOS id: set eos_token")
        bos = _first_known(
            _id_of(tokenizer, self.config.bos_token),
            model.config.bos_token_id,
            tokenizer.bos_token_id,
            eos,  # the official convention: BOS = EOS when the tokenizer has none
        )
        return bos, eos

    def _fits(self, story_id: str, length: int, model_length: int) -> bool:
        if length <= model_length:
            return True
        if self.config.too_long == "skip":
            self.skipped.append(story_id)
            return False
        raise DataError(
            f"ROCStories story {story_id}: its {self.config.variant} input has {length} tokens, "
            f"more than the model's length {model_length}; skip such stories with "
            "--skip-too-long (setdlm eval infill) or skip_too_long: true (workflow task)"
        )

    def decode_config(self, base: DecodeConfig, tokenizer) -> DecodeConfig:
        return base.replace(
            max_new_tokens=0,  # the budget is per example: the span length (AR) or the masks
            repetition_penalty=self.config.repetition_penalty,
            repetition_context="visible",
            length_penalty=None,
            eos_token_ids=(),  # no stop rule: the span is always filled to its oracle length
            stop_strings=(),
            stop_regexes=(),
            stop_repeated_tokens=0,
        )

    def output_text(self, example: Example, new_ids: list[int], tokenizer) -> str:
        return text_before_eos(new_ids, tokenizer, example.meta["eos_token_id"])

    def score(self, example: Example, text: str) -> dict[str, float]:
        return self.scorer.score(example.reference, text) | output_flags(text)

    def aggregate(self, records: list[dict]) -> dict[str, dict]:
        per_example = [r["scores"] for r in records]
        skipped = {
            "skipped_too_long": {
                "value": len(self.skipped),
                "definition": "stories left out because their input exceeds the model length",
            }
        }
        return aggregate_rouge(per_example, self.config.rouge) | flag_counts(records) | skipped


def _readable(infill: InfillInput, tokenizer) -> str:
    """The input as text, its run of masks shortened to one marker."""
    ids, start, length = infill
    left = tokenizer.decode(ids[:start], skip_special_tokens=False)
    right = tokenizer.decode(ids[start + length :], skip_special_tokens=False)
    return f"{left}[{length} masks]{right}"


def _id_of(tokenizer, text: str | None) -> int | None:
    if text is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(text)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"special token {text!r} is not in the tokenizer's vocabulary")
    return token_id


def _first_known(*ids: int | None) -> int | None:
    return next((i for i in ids if i is not None), None)


# ---------------------------------------------- `setdlm eval infill`, one point
def run_point(args, loaded, tokenizer, base: DecodeConfig, out: Path, settings) -> dict:
    """One point of `setdlm eval infill`: the variant's stories, the paper's decoding settings,
    and the infill cache where the policy infills from both contexts (setdlm/eval/point.py runs
    it)."""
    from setdlm.eval.paper_decoding import paper_decode_config
    from setdlm.eval.point import evaluate
    from setdlm.families import with_knobs

    task = InfillTask(
        InfillSettings(
            variant=args.variant,
            repetition=args.repetition,
            limit=args.limit,
            too_long="skip" if args.skip_too_long else "error",
        )
    )
    decode = paper_decode_config("infill", loaded.spec or loaded.model, base)
    if args.infill_cache != "full":  # the policies that infill from both contexts have it
        decode = with_knobs(decode, loaded.model.config.family, infill_cache=args.infill_cache)
    return evaluate(task, decode, args, loaded, tokenizer, out, settings)
