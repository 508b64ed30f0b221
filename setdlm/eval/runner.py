"""Run a decoding task: quality and speed from one resumable run.

A ``Task`` turns its dataset into ``Example``s (token ids to decode, the reference), says how
its outputs are decoded (stop rules, processors, budget) and scored. ``run_evaluation`` decodes
every example not yet in ``samples.jsonl`` with a per-example seed, scores it, appends its line,
and once all examples are present writes ``metrics.json``: quality (with definitions), speed
(shared timer), the resolved config and its hash, and the hardware/software fingerprint.
Results do not depend on batch size or on resuming: seeds come from (base seed, example id)
and a row's tokens never depend on the rest of its batch.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from setdlm.core.decoding import DecodeConfig
from setdlm.eval.fingerprint import hardware, run_provenance, sample_provenance, software_versions
from setdlm.eval.records import SampleLog, config_hash, example_seed
from setdlm.eval.timing import (
    decoding_fields,
    peak_memory_bytes,
    reset_peak_memory,
    summarize_speed,
    synchronized_timer,
)
from setdlm.util.errors import DataError, UserError
from setdlm.util.files import atomic_write_json
from setdlm.util.progress import progress_bar
from setdlm.util.validation import raise_for, warmup_errors


class ResultFolderTaken(UserError, ValueError):
    """An output folder that holds samples of another configuration."""


@dataclass(frozen=True)
class Example:
    id: str
    input_ids: list[int]  # the prompt, or an infilling input with mask ids
    prompt: str  # human-readable form of the input
    reference: Any
    meta: dict = field(default_factory=dict)
    # This example's generation budget when it is not the task's (AR infilling generates exactly
    # the span length); examples with different budgets never share a batch.
    max_new_tokens: int | None = None


class Task(ABC):
    name: str

    @abstractmethod
    def settings(self) -> dict:
        """Everything that defines the task's data and scoring (part of the result's hash)."""

    @abstractmethod
    def examples(self, tokenizer, model) -> list[Example]:
        """The examples to decode, in a fixed order, with unique ids."""

    def decode_config(self, base: DecodeConfig, tokenizer) -> DecodeConfig:
        """The task's stopping rules, processors and budget on top of the family's knobs."""
        return base

    def output_text(self, example: Example, new_ids: list[int], tokenizer) -> str:
        return tokenizer.decode(new_ids, skip_special_tokens=True)

    @abstractmethod
    def score(self, example: Example, text: str) -> dict[str, float]:
        """Per-example scores."""

    @abstractmethod
    def aggregate(self, records: list[dict]) -> dict[str, dict]:
        """Quality metrics: {name: {"value": float, "definition": str, ...}}."""


BATCHING = ("static", "continuous")
BATCHING_CHOICES = ("auto", *BATCHING)


def resolve_batching(choice: str, device, batch_size: int) -> str:
    """ "auto" is continuous batching on a GPU with a batch of more than one, else static (on a
    CPU a pool's gain is small and batch 1 keeps the paper's speed protocol)."""
    if choice not in BATCHING_CHOICES:
        raise ValueError(f"batching must be one of {BATCHING_CHOICES}, got {choice!r}")
    if choice != "auto":
        return choice
    return "continuous" if device.type == "cuda" and batch_size > 1 else "static"


@dataclass(frozen=True)
class RunSettings:
    seed: int = 1234
    batch_size: int = 1
    warmup_examples: int = 1  # the task's first examples are not timed (scheduled_batches)
    # "static": consecutive batches of batch_size examples, each decoded until its slowest row
    # is done; "continuous": a pool of batch_size slots over all the examples of one budget,
    # where a finished example's slot takes the next one (core/decoding/pool.py).
    batching: str = "static"

    def __post_init__(self):
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")

    @property
    def continuous(self) -> bool:
        return pooled(self.batching, self.batch_size)


def pooled(batching: str, batch_size: int) -> bool:
    """Whether examples go through a continuous-batching pool (a pool of one slot is batch 1)."""
    return batching == "continuous" and batch_size > 1


def generation_identity(
    task_name: str, task_settings: dict, model, model_source: str, decode, seed: int
) -> dict:
    """What a generation result depends on (hashed into its config hash)."""
    return {
        "task": task_name,
        "task_settings": task_settings,
        "model_config": model.config.to_dict(),
        "model_source": model_source,
        "weights_sha256": model.weights_sha256,
        "decode": decode.to_dict(),
        "seed": seed,
    }


def finished_metrics(out_dir: Path, digest: str) -> dict | None:
    """``out_dir``'s metrics.json when it is the finished result of configuration ``digest``."""
    metrics_path = out_dir / "metrics.json"
    if metrics_path.exists():
        finished = _folder_json(metrics_path)
        if finished.get("config_hash") == digest:
            return finished
    return None


TAKE_ANOTHER = "use another output folder (or delete it to start over)"


def _folder_json(path: Path) -> dict:
    """A JSON object of the output folder (run.json, metrics.json). One that is not JSON, or
    not an object, is no evaluation's: it is refused, not overwritten."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # not JSON, or not UTF-8 text
        raise ResultFolderTaken(f"{path}: not valid JSON ({error}); {TAKE_ANOTHER}") from None
    if not isinstance(value, dict) or "config_hash" not in value:
        raise ResultFolderTaken(
            f"{path}: not written by `setdlm eval` (no config_hash); {TAKE_ANOTHER}"
        )
    return value


def run_evaluation(
    task: Task,
    model,
    tokenizer,
    decode: DecodeConfig,
    out_dir: str | Path,
    settings: RunSettings = RunSettings(),
    model_source: str = "",
) -> dict:
    out_dir = Path(out_dir)
    decode = task.decode_config(decode, tokenizer)
    identity = generation_identity(
        task.name, task.settings(), model, model_source, decode, settings.seed
    )
    digest = config_hash(identity)
    finished = finished_metrics(out_dir, digest)
    if finished is not None:
        return finished
    examples = task.examples(tokenizer, model)
    check_examples(task, examples, settings)
    claim_folder(out_dir, identity, digest)
    log = SampleLog(out_dir / "samples.jsonl")
    done = log.load()
    pending = [example for example in examples if example.id not in done]
    device = model.device
    reset_peak_memory(device)
    batches, warm_ids, rewarm = scheduled_batches(examples, pending, settings)
    if rewarm:  # untimed, discarded
        _decode(model, batches[0][: settings.batch_size], decode, settings, tokenizer)
    bar = progress_bar(len(examples), f"{task.name} {out_dir.name}", len(examples) - len(pending))

    def save(example: Example, output, row: int, size: int, timing: dict) -> None:
        text = task.output_text(example, output.new_token_ids[row], tokenizer)
        log.append(
            {
                "id": example.id,
                "prompt": example.prompt,
                "reference": example.reference,
                "output_text": text,
                "output_ids": output.new_token_ids[row],
                "scores": task.score(example, text),
                **decoding_fields(output, row, size, **timing),
                "warmup": example.id in warm_ids,
                **sample_provenance(),
            }
        )
        bar.update(1)

    for batch in batches:
        if settings.continuous:  # each example is saved as soon as it leaves the pool
            _decode(
                model,
                batch,
                decode,
                settings,
                tokenizer,
                on_finished=lambda i, one, batch=batch: save(
                    batch[i], one, 0, settings.batch_size, {"batching": "continuous"}
                ),
            )
            continue
        with synchronized_timer(device) as elapsed:
            output = _decode(model, batch, decode, settings, tokenizer)
        for row, example in enumerate(batch):
            save(example, output, row, len(batch), {"call_seconds": elapsed["seconds"]})
    bar.close()
    return finish_run(task, examples, log, out_dir, identity, digest, settings, device)


def check_examples(task: Task, examples: list, settings: RunSettings) -> None:
    """Refuse a run that would score nothing, or time nothing, before anything is written."""
    if not examples:
        raise DataError(
            f"{task.name}: no examples to evaluate (the data file is empty, or every example "
            "was skipped or filtered out)"
        )
    raise_for(
        warmup_errors(
            settings.warmup_examples,
            len(examples),
            "warmup (--warmup)",
            f"the {task.name} examples",
        )
    )


def finish_run(
    task, examples, log, out_dir, identity, digest, settings, device, extra: dict | None = None
) -> dict:
    """Write ``metrics.json`` once every example is in the log; return it as read back."""
    records = log.load()
    missing = [e.id for e in examples if e.id not in records]
    if missing:
        raise RuntimeError(f"{out_dir}: {len(missing)} example(s) missing, e.g. {missing[:3]}")
    ordered = [records[e.id] for e in examples]
    metrics = {
        "task": task.name,
        "examples": len(ordered),
        "quality": task.aggregate(ordered),
        "speed": summarize_speed(ordered) | {"peak_memory": peak_memory_bytes(device)},
        "config": identity,
        "config_hash": digest,
        **(extra or {}),
        "run": dataclasses.asdict(settings),
        "times": run_times(Path(out_dir)),
        **run_provenance(ordered),
        "hardware": hardware(device),
        "software": software_versions(),
    }
    metrics_path = Path(out_dir) / "metrics.json"
    atomic_write_json(metrics_path, metrics)
    return json.loads(metrics_path.read_text())  # what a later call reads back, exactly


def scheduled_batches(
    examples: list, pending: list, settings: RunSettings
) -> tuple[list[list], set[str], bool]:
    """The batches still to decode, the warm-up ids, and whether to warm up first.

    Warm-up is a property of the examples: the first ``warmup_examples`` of the task, decoded
    in batches of their own (untimed), whichever process decodes them. A process that resumes
    past them has to warm up by decoding its first batch once, untimed and discarded (the
    same seeds give the same tokens), so that its timed examples, NFE and token counts are
    those of an undisturbed run.
    """
    warm_ids = {example.id for example in examples[: settings.warmup_examples]}
    size = None if settings.continuous else settings.batch_size  # a pool takes them all
    warm = list(_batches([e for e in pending if e.id in warm_ids], size))
    timed = list(_batches([e for e in pending if e.id not in warm_ids], size))
    return warm + timed, warm_ids, bool(timed) and not warm


def _decode(
    model, batch: list[Example], decode: DecodeConfig, settings: RunSettings, tokenizer, **pool
):
    """Decode ``batch``: as one static batch, or through a pool of ``settings.batch_size``
    slots (``pool`` then holds its ``on_finished``)."""
    seeds = [example_seed(settings.seed, example.id) for example in batch]
    budget = batch[0].max_new_tokens
    config = decode if budget is None else decode.replace(max_new_tokens=budget)
    if settings.continuous:
        pool["batch_size"] = settings.batch_size
    return model.generate(
        [e.input_ids for e in batch], config, seeds=seeds, tokenizer=tokenizer, **pool
    )


def _batches(examples: list[Example], size: int | None):
    """Consecutive examples, at most ``size`` per batch (None: no limit), one generation
    budget per batch."""
    batch: list[Example] = []
    for example in examples:
        full = size is not None and len(batch) == size
        if batch and (full or example.max_new_tokens != batch[0].max_new_tokens):
            yield batch
            batch = []
        batch.append(example)
    if batch:
        yield batch


def claim_folder(out_dir: Path, identity: dict, digest: str) -> None:
    """Record which configuration this folder's samples belong to; refuse to mix two."""
    run_path = out_dir / "run.json"
    foreign = [name for name in FOLDER_RESULT_FILES if (out_dir / name).exists()]
    if not run_path.exists() and foreign:
        # results of no evaluation this command can tell: appending to them would mix them
        raise ResultFolderTaken(
            f"{out_dir} holds {', '.join(foreign)} but no run.json (results of no known "
            f"evaluation); {TAKE_ANOTHER}"
        )
    if run_path.exists():
        existing = _folder_json(run_path)
        # A folder claimed by a run that wrote no sample yet (it stopped on a bad input) holds
        # nothing to protect: the corrected run takes it over.
        if existing["config_hash"] != digest and SampleLog(out_dir / "samples.jsonl").load():
            raise ResultFolderTaken(
                f"{out_dir} holds samples of configuration {existing['config_hash']}, not "
                f"{digest}: use another output folder (or delete it to start over)"
            )
        if existing["config_hash"] == digest:
            return
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        run_path, {"config_hash": digest, "config": identity, "started_at": utc_now()}
    )


# What an evaluation writes beside run.json, its claim on the folder.
FOLDER_RESULT_FILES = ("samples.jsonl", "metrics.json", "throughput.json")


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def run_times(out_dir: Path) -> dict:
    """When the evaluation of this folder started (its claim, kept across resumes) and
    finished (now): MLflow shows these as the run's start and duration."""
    run_path = out_dir / "run.json"
    claimed = json.loads(run_path.read_text()) if run_path.exists() else {}
    return {"started_at": claimed.get("started_at"), "finished_at": utc_now()}
