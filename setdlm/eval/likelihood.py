"""Held-out likelihood as an evaluation run: NLL / PPL / bits per token and per byte.

The text is chunked like the training data (BOS + ``length - 1`` tokens, EOS between documents):
WikiText-2's held-out articles from the local mirror or the Hub, OpenWebText's last 100k
documents (the official valid split) or LM1B's test split from the Hub. Per-sequence terms are
appended to ``samples.jsonl`` (resumable) and ``metrics.json`` holds the aggregate, what the
number measures for this family (exact NLL, NELBO or one-order bound), the number of
Monte-Carlo draws, the config hash and the fingerprint. The noise of a batch is drawn from
(seed, first sequence id), so results are reproducible for a given seed and batch size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from setdlm.data.jsonl import read_jsonl
from setdlm.data.loader import collate
from setdlm.data.text import ChunkedLMDataset, load_wikitext2
from setdlm.eval.fingerprint import hardware, run_provenance, sample_provenance, software_versions
from setdlm.eval.heldout_nll import sequence_terms, summarize
from setdlm.eval.records import SampleLog, config_hash, example_seed
from setdlm.eval.runner import claim_folder, finished_metrics, run_times
from setdlm.util.files import atomic_write_json
from setdlm.util.hub import load_hub_dataset
from setdlm.util.paths import data_dir
from setdlm.util.progress import progress_bar

HELDOUT_SETS = ("wikitext2", "owt", "lm1b")
# Copies of the Hub sets that `setdlm data prepare` writes into a data folder (one {"text"} per
# line): read instead of the Hub when SETDLM_DATA_DIR holds them.
PREPARED_FILES = {"owt": ("openwebtext", "valid.jsonl"), "lm1b": ("lm1b", "test.jsonl")}


def prepared_documents(name: str) -> list[str] | None:
    """The documents of a prepared copy of ``name`` in the data folder, or None."""
    root = data_dir()
    if root is None or name not in PREPARED_FILES:
        return None
    path = root.joinpath(*PREPARED_FILES[name])
    if not path.is_file():
        return None
    return [row["text"] for _, row in read_jsonl(path, required=("text",))]


def heldout_documents(name: str) -> list[str]:
    if name == "wikitext2":
        return load_wikitext2().heldout
    prepared = prepared_documents(name)
    if prepared is not None:
        return prepared
    instead = f"prepare a copy (`setdlm data prepare --dataset {name}`) or use wikitext2"
    if name == "owt":  # the official valid split: the last 100k training documents
        return load_hub_dataset("Skylion007/openwebtext", split="train[-100000:]", instead=instead)[
            "text"
        ]
    if name == "lm1b":
        return load_hub_dataset("lm1b", split="test", instead=instead)["text"]
    raise ValueError(f"unknown held-out set {name!r}; choose from {HELDOUT_SETS}")


def quality_metrics(result) -> dict[str, dict]:
    """The result in the shared ``{name: {"value", "definition"}}`` form of metrics.json."""
    per_token = f"{result.measured}, nats per counted token"
    return {
        "nll": {"value": result.nll, "definition": per_token},
        "perplexity": {"value": result.perplexity, "definition": f"exp of the {per_token}"},
        "bits_per_token": {"value": result.bits_per_token, "definition": "nll / ln 2"},
        "bits_per_byte": {
            "value": result.bits_per_byte,
            "definition": "total NLL / ln 2 / UTF-8 bytes of the counted tokens",
        },
        "tokens": {"value": result.tokens, "definition": "counted tokens"},
        "sequences": {"value": result.sequences, "definition": "held-out chunks"},
    }


def run_likelihood(
    model,
    tokenizer,
    data: str,
    out_dir: str | Path,
    num_samples: int = 1,
    seed: int = 0,
    batch_size: int = 8,
    limit: int | None = None,
    model_source: str = "",
) -> dict:
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    out_dir = Path(out_dir)
    identity = {
        "task": "likelihood",
        "data": data,
        "limit": limit,
        "num_samples": num_samples,
        "seed": seed,
        "batch_size": batch_size,
        "model_config": model.config.to_dict(),
        "model_source": model_source,
        "weights_sha256": model.weights_sha256,
    }
    digest = config_hash(identity)
    finished = finished_metrics(out_dir, digest)
    if finished is not None:
        return finished
    chunks = ChunkedLMDataset(heldout_documents(data), tokenizer, model.config.length)
    claim_folder(out_dir, identity, digest)
    count = len(chunks) if limit is None else min(limit, len(chunks))
    ids = [f"{data}-{i}" for i in range(count)]
    log = SampleLog(out_dir / "samples.jsonl")
    done = log.load()
    model.eval()
    bar = progress_bar(count, f"likelihood {data}", sum(i in done for i in ids), "sequence")
    for start in range(0, count, batch_size):
        batch_ids = ids[start : start + batch_size]
        if all(i in done for i in batch_ids):
            continue
        batch = collate([chunks[i] for i in range(start, start + len(batch_ids))])
        generator = torch.Generator().manual_seed(example_seed(seed, batch_ids[0]))
        terms = sequence_terms(model, batch, generator, num_samples, tokenizer)
        # A batch cut short by a kill is recomputed whole (its randomness is the batch's), and
        # only the examples not yet in the log are written: no id twice, the same values.
        for example_id, term in zip(batch_ids, terms, strict=True):
            if example_id not in done:
                log.append({"id": example_id, **term, **sample_provenance()})
        bar.update(sum(i not in done for i in batch_ids))
    bar.close()
    records = log.load()
    result = summarize([records[i] for i in ids], model.config.family, num_samples)
    metrics = {
        "task": "likelihood",
        "examples": count,
        "quality": quality_metrics(result),
        "config": identity,
        "config_hash": digest,
        "times": run_times(out_dir),
        **run_provenance([records[i] for i in ids]),
        "hardware": hardware(model.device),
        "software": software_versions(),
    }
    metrics_path = out_dir / "metrics.json"
    atomic_write_json(metrics_path, metrics)
    return json.loads(metrics_path.read_text())
