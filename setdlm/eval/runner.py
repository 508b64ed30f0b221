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
from setdlm.util.files import atomic_write_json, atomic_write_text, sha256_file
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
    # The speed subset: the warm-up and then this many examples are decoded one at a time, and
    # only those are timed (the paper's batch-1 protocol); the others are decoded in batches of
    # batch_size, counted (NFE, parallelism, tokens) but not timed. Per-example seeds make
    # their tokens those of batch 1. None: every example after the warm-up is timed, decoded
    # at batch_size.
    timed_examples: int | None = None
    # (index, count): decode only the index-th of count contiguous slices of the examples, into
    # a shard folder (shard.json, no metrics): one point spread over several jobs, merged by
    # ``merge_shards`` into the samples the whole run would have written. None: every example.
    shard: tuple[int, int] | None = None

    def __post_init__(self):
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")
        if self.timed_examples is not None and self.timed_examples < 1:
            raise ValueError(f"timed_examples must be at least 1, got {self.timed_examples}")
        if self.shard is not None and not 0 <= self.shard[0] < self.shard[1]:
            raise ValueError(f"shard must be (index, count) with 0 <= index < count: {self.shard}")


def pooled(batching: str, batch_size: int) -> bool:
    """Whether examples go through a continuous-batching pool (a pool of one slot is batch 1)."""
    return batching == "continuous" and batch_size > 1


def generation_identity(
    task_name: str,
    task_settings: dict,
    model,
    model_source: str,
    decode,
    seed: int,
    model_revision: dict | None = None,
) -> dict:
    """What a generation result depends on (hashed into its config hash); a Hub checkpoint's
    ``model_revision`` (its commit, pinned or not) only where there is one, so that the
    identities of results computed from folders stay as they were."""
    identity = {
        "task": task_name,
        "task_settings": task_settings,
        "model_config": model.config.to_dict(),
        "model_source": model_source,
        "weights_sha256": model.weights_sha256,
        "decode": decode.to_dict(),
        "seed": seed,
    }
    return identity | ({"model_revision": model_revision} if model_revision else {})


# ---------------------------------------------------------------------------------- shards
SHARD_MARKER = "shard.json"


def shard_examples(examples: list, shard: tuple[int, int] | None) -> list:
    """The ``index``-th of ``count`` contiguous slices of the examples (all of them for None):
    in task order, so that the shards' samples, one after the other, are the task's."""
    if shard is None:
        return examples
    index, count = shard
    return examples[index * len(examples) // count : (index + 1) * len(examples) // count]


def finish_shard(mine: list, log, out_dir: Path, digest: str, shard: tuple[int, int]) -> dict:
    """``shard.json`` once every example of the shard is in its log, exactly these."""
    records = log.load()
    wanted = [e.id for e in mine]
    missing = [i for i in wanted if i not in records]
    if missing:
        raise RuntimeError(f"{out_dir}: {len(missing)} example(s) missing, e.g. {missing[:3]}")
    strays = sorted(set(records) - set(wanted))
    if strays:
        raise RuntimeError(f"{out_dir}: samples of other shards, e.g. {strays[:3]}")
    marker = {"config_hash": digest, "shard": list(shard), "examples": wanted}
    atomic_write_json(out_dir / SHARD_MARKER, marker)
    return marker


def merge_shards(out_dir: Path, shard_dirs: list[Path]) -> int:
    """The samples of a point's finished shards (in shard order) as ``out_dir``'s own
    samples.jsonl and run.json: then ``run_evaluation`` on ``out_dir`` decodes nothing and
    writes the point's metrics, as it does for a run that was interrupted after its last
    example. Every shard must be of one configuration and the shards together every slice of
    it once. Returns the number of samples."""
    markers = [_folder_json(folder / SHARD_MARKER) for folder in shard_dirs]
    digests = {marker["config_hash"] for marker in markers}
    if len(digests) != 1:
        raise ResultFolderTaken(
            f"{out_dir}: its shards are of several configurations ({sorted(digests)}); rerun them"
        )
    slices = [tuple(marker["shard"]) for marker in markers]
    count = len(shard_dirs)
    if slices != [(index, count) for index in range(count)]:
        raise ResultFolderTaken(
            f"{out_dir}: shards {slices} are not the slices 0..{count - 1} of {count}"
        )
    lines = []
    for folder, marker in zip(shard_dirs, markers, strict=True):
        records = SampleLog(folder / "samples.jsonl").load()
        lines += [records[example_id] for example_id in marker["examples"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in lines)
    atomic_write_text(out_dir / "samples.jsonl", text)
    atomic_write_json(out_dir / "run.json", _folder_json(shard_dirs[0] / "run.json"))
    return len(lines)


def finished_result(out_dir: Path, digest: str, shard: tuple[int, int] | None) -> dict | None:
    """The finished result of configuration ``digest`` in ``out_dir``: its metrics.json, or
    for a shard its shard.json."""
    if shard is None:
        return finished_metrics(out_dir, digest)
    marker = out_dir / SHARD_MARKER
    if marker.exists():
        finished = _folder_json(marker)
        if finished["config_hash"] == digest and finished.get("shard") == list(shard):
            return finished
    return None


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
    model_revision: dict | None = None,
) -> dict:
    out_dir = Path(out_dir)
    decode = task.decode_config(decode, tokenizer)
    identity = generation_identity(
        task.name, task.settings(), model, model_source, decode, settings.seed, model_revision
    )
    digest = config_hash(identity)
    finished = finished_result(out_dir, digest, settings.shard)
    if finished is not None:
        return finished
    examples = task.examples(tokenizer, model)
    check_examples(task, examples, settings)
    claim_folder(out_dir, identity, digest)
    log = SampleLog(out_dir / "samples.jsonl")
    done = log.load()
    mine = shard_examples(examples, settings.shard)
    pending = [example for example in mine if example.id not in done]
    device = model.device
    reset_peak_memory(device)
    schedule = scheduled_batches(examples, pending, settings)
    if schedule.rewarm:  # untimed, discarded
        _decode(model, schedule.rewarm, decode, settings, tokenizer, pooled=False)
    bar = progress_bar(len(mine), f"{task.name} {out_dir.name}", len(mine) - len(pending))

    def save(example: Example, output, row: int, size: int, timing: dict, timed: bool) -> None:
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
                "warmup": example.id in schedule.warm_ids,
                "timed": timed,
                **sample_provenance(),
            }
        )
        bar.update(1)

    for batch in schedule.batches:
        if batch.pooled:  # each example is saved as soon as it leaves the pool
            _decode(
                model,
                batch.examples,
                decode,
                settings,
                tokenizer,
                pooled=True,
                on_finished=lambda i, one, batch=batch: save(
                    batch.examples[i],
                    one,
                    0,
                    settings.batch_size,
                    {"batching": "continuous"},
                    batch.timed,
                ),
            )
            continue
        with synchronized_timer(device) as elapsed:
            output = _decode(model, batch.examples, decode, settings, tokenizer, pooled=False)
        for row, example in enumerate(batch.examples):
            timing = {"call_seconds": elapsed["seconds"]}
            save(example, output, row, len(batch.examples), timing, batch.timed)
    bar.close()
    if settings.shard is not None:
        return finish_shard(mine, log, out_dir, digest, settings.shard)
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
        # the log these metrics were computed from, as ``load`` left it: while it is unchanged
        # a workflow's start need not parse it again (setdlm/results/reader.incomplete_samples)
        "samples_sha256": sha256_file(log.path),
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


@dataclass(frozen=True)
class Batch:
    """Examples decoded together: one static batch, or all of them through the pool."""

    examples: list[Example]
    timed: bool  # its time is speed the metrics report (not a warm-up, not outside the subset)
    pooled: bool = False  # through the continuous-batching pool of batch_size slots


@dataclass(frozen=True)
class Schedule:
    batches: list[Batch]
    warm_ids: set[str]
    # Decoded once before the batches, untimed and discarded: a process that resumes past the
    # warm-up warms up on the first example it will time.
    rewarm: list[Example]


def scheduled_batches(examples: list, pending: list, settings: RunSettings) -> Schedule:
    """The batches still to decode, in order: the warm-up, the timed examples, the rest.

    Warm-up is a property of the examples: the first ``warmup_examples`` of the task, decoded
    in batches of their own (untimed), whichever process decodes them. A process that resumes
    past them warms up by decoding its first timed batch once, untimed and discarded (the same
    seeds give the same tokens), so that its timed examples are timed as an undisturbed run's.

    With a speed subset (``settings.timed_examples``), the warm-up and the next
    ``timed_examples`` examples are decoded one at a time, the paper's batch-1 protocol, and
    the rest in batches of ``batch_size`` (or the pool), untimed. Without one, every example is
    decoded at ``batch_size`` and all but the warm-up are timed.
    """
    warm_ids = {example.id for example in examples[: settings.warmup_examples]}
    subset = settings.timed_examples
    after_warmup = [e.id for e in examples[settings.warmup_examples :]]
    timed_ids = set(after_warmup if subset is None else after_warmup[:subset])
    # the warm-up and the timed examples: one at a time with a subset, else as all the others
    size = 1 if subset is not None else settings.batch_size
    pooled = pooled_run(settings) and subset is None
    warm = [e for e in pending if e.id in warm_ids]
    timed = [e for e in pending if e.id in timed_ids]
    rest = [e for e in pending if e.id not in warm_ids and e.id not in timed_ids]
    batches = [Batch(group, False, pooled) for group in _batches(warm, None if pooled else size)]
    batches += [Batch(group, True, pooled) for group in _batches(timed, None if pooled else size)]
    rest_pooled = pooled_run(settings)
    rest_size = None if rest_pooled else settings.batch_size
    batches += [Batch(group, False, rest_pooled) for group in _batches(rest, rest_size)]
    first_timed = next((b for b in batches if b.timed), None)
    rewarm = [] if warm or first_timed is None else first_timed.examples[:size]
    return Schedule(batches, warm_ids, rewarm)


def pooled_run(settings: RunSettings) -> bool:
    """Whether the examples that are decoded together go through the continuous pool."""
    return pooled(settings.batching, settings.batch_size)


def _decode(
    model,
    batch: list[Example],
    decode: DecodeConfig,
    settings: RunSettings,
    tokenizer,
    pooled: bool,
    **pool,
):
    """Decode ``batch``: as one static batch, or (``pooled``) through a pool of
    ``settings.batch_size`` slots (``pool`` then holds its ``on_finished``)."""
    seeds = [example_seed(settings.seed, example.id) for example in batch]
    budget = batch[0].max_new_tokens
    config = decode if budget is None else decode.replace(max_new_tokens=budget)
    if pooled:
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
FOLDER_RESULT_FILES = ("samples.jsonl", "metrics.json", "throughput.json", SHARD_MARKER)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def run_times(out_dir: Path) -> dict:
    """When the evaluation of this folder started (its claim, kept across resumes) and
    finished (now): MLflow shows these as the run's start and duration."""
    run_path = out_dir / "run.json"
    claimed = json.loads(run_path.read_text()) if run_path.exists() else {}
    return {"started_at": claimed.get("started_at"), "finished_at": utc_now()}
