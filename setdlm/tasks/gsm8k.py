"""GSM8K with the paper's protocol (SPEC 5.1), as a runner ``Task`` and as pieces for lm-eval.

Data: the test split of ``openai/gsm8k`` (config ``main``, 1,319 problems) from the Hub, or its
offline copy ``SETDLM_DATA_DIR/gsm8k/test.jsonl`` (same rows, same order).

Prompt: one user turn, "Please reason step by step, and put your final answer within
$\\boxed{}$. {question}", rendered with the tokenizer's chat template (Qwen3:
``add_generation_prompt=True, enable_thinking=True``). A tokenizer without a chat template (the
tiny byte-level BPE) gets the plain format ``PLAIN_FORMAT`` instead; which one ran is recorded.

Stopping: the first *generated* ``\\boxed{...}`` (our stop rules only read generated text, so
the official "2 matches" of a regex that also matched the prompt's ``\\boxed{}`` become one),
8 identical tokens in a row, the tokenizer's EOS, and in the "accuracy" protocol
``<|im_end|>``. Budgets: "pareto" 1024 new tokens; "accuracy" the model length minus the prompt.

Scoring (all reported, each with its definition):
- ``paper_exact``: the paper script's own accuracy. The answer is the text between the first
  "boxed{" and the next "}", compared by exact string equality with the part of the reference
  after "### " (no normalization at all);
- ``strict_match`` / ``flexible_extract``: lm-eval's gsm8k ``exact_match`` under its two filters,
  computed by lm-eval's own filter and metric code with the settings read from lm-eval's own
  ``gsm8k.yaml``, on the text rewritten as the official harness model did ("...#### answer").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from setdlm.core.decoding import DecodeConfig
from setdlm.data.jsonl import read_jsonl
from setdlm.eval.intervals import scored_means
from setdlm.eval.runner import Example, Task
from setdlm.tasks.problem import Problem
from setdlm.util.errors import DataError
from setdlm.util.hub import load_hub_dataset
from setdlm.util.paths import data_dir, data_path
from setdlm.util.validation import SettingError

HUB_ID, HUB_CONFIG = "openai/gsm8k", "main"
TEST_SIZE = 1319
INSTRUCTION = "Please reason step by step, and put your final answer within $\\boxed{}$."
# The official stop regex; it only ever reads generated text here.
BOXED_STOP_REGEX = r"\\boxed\{.*?\}"
REPEATED_TOKENS_STOP = 8
IM_END = "<|im_end|>"
# Where the official harness model cut its decoded text: lm-eval's gsm8k `until` strings and
# Llama's end of turn (the tokenizer's EOS text is added at run time).
CUT_STRINGS = ("Question:", "</s>", IM_END, "<|eot_id|>")
# The fallback prompt for tokenizers without a chat template (lm-eval's "\nAnswer:" cue).
PLAIN_FORMAT = "{user}\nAnswer:"
NO_BOXED_ANSWER = "[no boxed answer]"
# What tokenizers decode invalid UTF-8 bytes to (a byte-level BPE can stop mid-character).
REPLACEMENT_CHARACTER = "\ufffd"


@dataclass(frozen=True)
class Protocol:
    """One of the paper's two GSM8K decoding protocols (SPEC 5.1, 8.2 item 7)."""

    name: str
    max_new_tokens: int | None  # None: fill the model's context (model length - prompt)
    stop_on_im_end: bool


PROTOCOLS = {
    "pareto": Protocol("pareto", max_new_tokens=1024, stop_on_im_end=False),
    "accuracy": Protocol("accuracy", max_new_tokens=None, stop_on_im_end=True),
}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown GSM8K protocol {name!r}; known: {sorted(PROTOCOLS)}")
    return PROTOCOLS[name]


# --------------------------------------------------------------------------------------- data
def load_gsm8k(split: str = "test", source: str = "auto", limit: int | None = None):
    """The problems of a split, in dataset order; ``limit`` keeps the first ones.

    source: "local" reads ``SETDLM_DATA_DIR/gsm8k/<split>.jsonl``; "hub" loads ``openai/gsm8k``
    (config ``main``) with ``datasets``; "auto" is local when ``SETDLM_DATA_DIR`` is set.
    """
    if limit is not None and limit < 0:
        raise SettingError(f"limit must be >= 0 or None, got {limit}")
    if source == "auto":
        source = "local" if data_dir() is not None else "hub"
    if source == "local":
        path = data_path("gsm8k", f"{split}.jsonl")
        numbered = read_jsonl(path, limit=limit)
        rows = [row for _, row in numbered]
        places = [f"{path}:{number}" for number, _ in numbered]  # file and line
    elif source == "hub":
        instead = "set SETDLM_DATA_DIR to the offline data folder (e.g. ../shared/data)"
        rows = load_hub_dataset(HUB_ID, HUB_CONFIG, split=split, instead=instead)
        rows = rows.select(range(min(limit, len(rows)))) if limit is not None else rows
        path = f"{HUB_ID} ({HUB_CONFIG}, {split})"
        places = [f"{path}, row {index}" for index in range(len(rows))]
    else:
        raise ValueError(f"source must be 'auto', 'local' or 'hub', got {source!r}")
    problems = []
    for index, (row, where) in enumerate(zip(rows, places, strict=True)):
        for key in ("question", "answer"):
            if not isinstance(row.get(key), str):
                raise DataError(f"{where}: expected a string field {key!r}, got {row.get(key)!r}")
        reference_answer(row["answer"], where)  # fail now, not after hours of decoding
        problems.append(Problem(f"{split}-{index}", row["question"], row["answer"]))
    if not problems:
        raise DataError(
            f"{path}: no GSM8K problems in it (expected JSON lines with a question and an answer)"
        )
    return problems


# ------------------------------------------------------------------------------------- prompt
@dataclass(frozen=True)
class Prompt:
    text: str
    template: str  # "chat" (the tokenizer's chat template) or "plain" (PLAIN_FORMAT)


def user_turn(question: str) -> str:
    return f"{INSTRUCTION} {question}"


def render_chat(messages: list[dict], tokenizer, add_generation_prompt: bool = True) -> Prompt:
    """The messages as the model's prompt text: the chat template when the tokenizer has one,
    else the plain format (turns separated by blank lines, then the "\\nAnswer:" cue)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=True,  # Qwen3; other templates ignore unknown variables
        )
        return Prompt(text, "chat")
    user = "\n\n".join(message["content"] for message in messages)
    return Prompt(PLAIN_FORMAT.format(user=user) if add_generation_prompt else user, "plain")


def build_prompt(question: str, tokenizer) -> Prompt:
    return render_chat([{"role": "user", "content": user_turn(question)}], tokenizer)


def encode_prompt(text: str, tokenizer) -> list[int]:
    """Token ids of a prompt, with the tokenizer's BOS in front when it has one (as
    ``setdlm generate`` does; Qwen3 has none) and the text does not already start with it."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    if bos is not None and ids[:1] != [bos]:
        ids = [bos, *ids]
    return ids


# ----------------------------------------------------------------------------------- stopping
def stop_settings(proto: Protocol, tokenizer, stop_on_eos: bool = True) -> dict:
    """DecodeConfig fields of the protocol's stop rules (all read generated text only)."""
    return {
        "stop_regexes": (BOXED_STOP_REGEX,),
        "stop_repeated_tokens": REPEATED_TOKENS_STOP,
        "stop_strings": (IM_END,) if proto.stop_on_im_end else (),
        "eos_token_ids": (tokenizer.eos_token_id,)
        if stop_on_eos and tokenizer.eos_token_id is not None
        else (),
    }


def budget(proto: Protocol, prompt_length: int, model_length: int, where: str = "") -> int:
    """New tokens one example may generate under the protocol."""
    if proto.max_new_tokens is not None:
        return proto.max_new_tokens
    room = model_length - prompt_length
    if room <= 0:
        raise ValueError(
            f"{where}: a prompt of {prompt_length} tokens leaves no room in the model length "
            f"{model_length} (the 'accuracy' protocol generates length - prompt tokens)"
        )
    return room


def cut_text(text: str, strings) -> str:
    """``text`` up to the earliest occurrence of any of ``strings``."""
    end = len(text)
    for string in strings:
        if string:
            found = text.find(string)
            if found != -1:
                end = min(end, found)
    return text[:end]


def answer_text(new_ids: list[int], tokenizer) -> str:
    """The decoded generation (special tokens kept, as the official harness decoded it) cut at
    ``CUT_STRINGS`` and the tokenizer's EOS text."""
    text = tokenizer.decode(new_ids, skip_special_tokens=False)
    return cut_text(text, (*CUT_STRINGS, tokenizer.eos_token or ""))


# ---------------------------------------------------------------------------------- answers
def boxed_answer(text: str) -> str | None:
    """The text between the first "boxed{" and the next "}" (None without a "boxed{").

    This is the official extraction, nested braces included: ``\\boxed{\\frac{1}{2}}`` gives
    ``\\frac{1``. A "boxed{" with no closing brace gives the rest of the text.
    """
    if "boxed{" not in text:
        return None
    return text.split("boxed{", 1)[1].split("}", 1)[0]


def rewrite_boxed(text: str) -> str:
    """The official harness model's rewrite before lm-eval scores: the text before the first
    "boxed{", then "#### " and the boxed answer; every "$\\" removed. Unchanged without a box."""
    answer = boxed_answer(text)
    if answer is None:
        return text
    return (text.split("boxed{", 1)[0] + "#### " + answer).replace("$\\", "")


def reference_answer(answer: str, where: str = "reference") -> str:
    """The gold answer as the paper's script read it: the text after the first "### "."""
    if "### " not in answer:
        raise DataError(f"{where}: the answer has no '#### <number>' line: {answer[-80:]!r}")
    return answer.split("### ")[1]


def paper_exact(text: str, answer: str) -> float:
    predicted = boxed_answer(text)
    return float(predicted is not None and predicted == reference_answer(answer))


@functools.cache
def lm_eval_gsm8k_config() -> dict:
    """lm-eval's own gsm8k task file (its filters and exact_match settings)."""
    import yaml

    return yaml.safe_load(lm_eval_task_file("gsm8k/gsm8k.yaml").read_text())


def lm_eval_task_file(relative: str) -> Path:
    """A task file shipped with the installed lm-eval, e.g. "gsm8k/gsm8k.yaml"."""
    import lm_eval

    path = Path(lm_eval.__file__).parent / "tasks" / relative
    if not path.is_file():
        raise FileNotFoundError(f"lm-eval {lm_eval.__version__} ships no task file {path}")
    return path


def lm_eval_filter_chains() -> dict[str, list[tuple[str, dict]]]:
    """{filter name: [(registered filter, its arguments), ...]} from lm-eval's gsm8k.yaml."""
    chains = {}
    for entry in lm_eval_gsm8k_config()["filter_list"]:
        steps = [
            (s["function"], {k: v for k, v in s.items() if k != "function"})
            for s in entry["filter"]
        ]
        chains[entry["name"]] = steps
    return chains


def lm_eval_exact_match_settings() -> dict:
    """The keyword arguments lm-eval's gsm8k passes to its exact_match metric."""
    for entry in lm_eval_gsm8k_config()["metric_list"]:
        if entry["metric"] == "exact_match":
            return {
                k: v
                for k, v in entry.items()
                if k not in ("metric", "aggregation", "higher_is_better")
            }
    raise ValueError("lm-eval's gsm8k.yaml has no exact_match metric")


def lm_eval_scores(text: str, answer: str) -> dict[str, float]:
    """lm-eval's gsm8k exact_match under each of its filters, on the rewritten text."""
    import lm_eval.filters  # noqa: F401  (registers lm-eval's filters)
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.api.registry import get_filter

    rewritten = rewrite_boxed(text)
    scores = {}
    for name, steps in lm_eval_filter_chains().items():
        responses = [[rewritten]]  # one document with one response
        for function, arguments in steps:
            responses = get_filter(function)(**arguments).apply(responses, [{"answer": answer}])
        (prediction,) = list(responses)
        result = exact_match_hf_evaluate(
            predictions=[prediction], references=[answer], **lm_eval_exact_match_settings()
        )
        scores[name] = float(result["exact_match"])
    return scores


def score_output(text: str, answer: str) -> dict[str, float]:
    """Every per-example score and 0/1 flag of one generation (any string, even garbage)."""
    harness_scores = lm_eval_scores(text, answer)
    return {
        "paper_exact": paper_exact(text, answer),
        "strict_match": harness_scores["strict-match"],
        "flexible_extract": harness_scores["flexible-extract"],
        "has_boxed": float(boxed_answer(text) is not None),
        "empty_output": float(not text.strip()),
        "invalid_utf8_output": float(REPLACEMENT_CHARACTER in text),
    }


METRIC_DEFINITIONS = {
    "paper_exact": "the paper script's accuracy: the text between the first 'boxed{' and the "
    "next '}' equals the reference text after '### ' exactly (no normalization)",
    "strict_match": "lm-eval gsm8k exact_match, filter strict-match (first '#### <number>' of "
    "the rewritten text '...#### <boxed answer>'), ignoring case, commas, '$', everything up "
    "to '#### ' and a trailing '.'",
    "flexible_extract": "lm-eval gsm8k exact_match, filter flexible-extract (the last "
    "number-like string of the rewritten text), same normalization as strict_match",
    "has_boxed": "share of outputs containing 'boxed{'",
    "empty_output": "share of outputs that are empty or whitespace after the cut (scored 0)",
    "invalid_utf8_output": "share of outputs whose bytes were not valid UTF-8 (decoded with "
    "U+FFFD; scored as decoded)",
}


# --------------------------------------------------------------------------------------- task
class GSM8KTask(Task):
    """The paper's GSM8K protocol for ``run_evaluation``.

    max_new_tokens replaces the protocol's budget (for tiny runs; recorded in the settings).
    stop_on_eos stops at the tokenizer's EOS (the text is cut there anyway); False reproduces
    the official diffusion samplers, which generated on until the box or the budget.
    """

    name = "gsm8k"

    def __init__(
        self,
        protocol: str = "pareto",
        limit: int | None = None,
        split: str = "test",
        source: str = "auto",
        max_new_tokens: int | None = None,
        stop_on_eos: bool = True,
    ):
        self.protocol = get_protocol(protocol)
        self.limit, self.split, self.source = limit, split, source
        self.max_new_tokens = max_new_tokens
        self.stop_on_eos = stop_on_eos
        self.templates_used: set[str] = set()

    def settings(self) -> dict:
        return {
            "protocol": self.protocol.name,
            "split": self.split,
            "source": self.source,
            "limit": self.limit,
            "max_new_tokens": self.max_new_tokens or self.protocol.max_new_tokens or "fill",
            "instruction": INSTRUCTION,
            "plain_format": PLAIN_FORMAT,
            "stop_regex": BOXED_STOP_REGEX,
            "stop_repeated_tokens": REPEATED_TOKENS_STOP,
            "stop_on_im_end": self.protocol.stop_on_im_end,
            "stop_on_eos": self.stop_on_eos,
            "cut_strings": list(CUT_STRINGS),
        }

    def examples(self, tokenizer, model) -> list[Example]:
        examples = []
        for problem in load_gsm8k(self.split, self.source, self.limit):
            prompt = build_prompt(problem.question, tokenizer)
            self.templates_used.add(prompt.template)
            ids = encode_prompt(prompt.text, tokenizer)
            new_tokens = self.max_new_tokens or budget(
                self.protocol, len(ids), model.config.length, f"gsm8k {problem.id}"
            )
            examples.append(
                Example(
                    id=problem.id,
                    input_ids=ids,
                    prompt=prompt.text,
                    reference=problem.answer,
                    meta={"prompt_template": prompt.template},
                    max_new_tokens=new_tokens,
                )
            )
        return examples

    def decode_config(self, base: DecodeConfig, tokenizer) -> DecodeConfig:
        return base.replace(**stop_settings(self.protocol, tokenizer, self.stop_on_eos))

    def output_text(self, example: Example, new_ids: list[int], tokenizer) -> str:
        return answer_text(new_ids, tokenizer)

    def score(self, example: Example, text: str) -> dict[str, float]:
        return score_output(text, example.reference)

    def aggregate(self, records: list[dict]) -> dict[str, dict]:
        template = ",".join(sorted(self.templates_used)) or "unknown"
        quality = scored_means(records, METRIC_DEFINITIONS)
        for name, definition in METRIC_DEFINITIONS.items():
            quality[name] |= {
                "definition": definition,
                "protocol": self.protocol.name,
                "prompt_template": template,
            }
        return quality


# ---------------------------------------------- `setdlm eval gsm8k`, one point
def run_point(args, loaded, tokenizer, base: DecodeConfig, out: Path, settings) -> dict:
    """One point of `setdlm eval gsm8k`: the protocol's task, the paper's decoding settings for
    the model (setdlm/eval/point.py runs it)."""
    from setdlm.eval.paper_decoding import paper_decode_config
    from setdlm.eval.point import evaluate

    task = GSM8KTask(protocol=args.protocol, limit=args.limit, max_new_tokens=args.max_new_tokens)
    decode = paper_decode_config("gsm8k", loaded.model, base)
    return evaluate(task, decode, args, loaded, tokenizer, out, settings)
