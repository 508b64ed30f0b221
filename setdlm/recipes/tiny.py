"""The embedded default job: train the four tiny families on WikiText-2 and decode with each.

Everything runs on a laptop CPU in a few minutes and goes through the same code as the paper's
runs: a byte-level BPE trained on the data, the shared trainer (resumable: rerunning the job
continues where it stopped and skips finished families), held-out likelihood before and after
training, our model folders, and the shared decoding engine with counted NFE and parallelism.
Results land in ``<out>/<family>/`` (metrics.json, samples.jsonl, model/) and ``<out>/summary.md``.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from setdlm.checkpoints.folders import load_model, save_model
from setdlm.core.decoding import DecodeConfig
from setdlm.core.family import ModelConfig, default_schedule
from setdlm.data.loader import collate
from setdlm.data.text import ChunkedLMDataset, PaddedRowsDataset, load_wikitext2
from setdlm.data.tokenizers import SpecialTokens, load_tokenizer, train_bpe_tokenizer
from setdlm.eval.heldout_nll import evaluate_likelihood
from setdlm.families import FAMILY_NAMES, build_model, with_knobs
from setdlm.families import family as family_info
from setdlm.recipes.tiny_settings import CORPORA, TinySettings, corpus_identity  # noqa: F401
from setdlm.tasks import arithmetic
from setdlm.train import TrainConfig, latest_checkpoint, load_weights, train
from setdlm.util.files import atomic_write_json, atomic_write_text


def model_config(family: str, tokenizer, settings: TinySettings) -> ModelConfig:
    info = family_info(family)
    backbone = {
        "vocab_size": len(tokenizer),
        "hidden_size": settings.hidden_size,
        "n_heads": settings.n_heads,
        "num_layers": settings.num_layers,
        "cond_dim": settings.hidden_size // 2,
        "dropout": 0.0,
        **info.dit,  # adaLN (the LM1B recipe, conditioned on sigma = 0) and causal attention
        "length": settings.length,
    }
    return ModelConfig(
        family=family,
        length=settings.length,
        vocab_size=len(tokenizer),
        mask_token_id=tokenizer.mask_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        backbone_kind="dit",
        backbone=backbone,
        block_size=settings.block_size if "block_size" in info.settings else None,
        schedule=default_schedule(family, settings.length, settings.block_size),
        keep_clean_bos=info.keep_clean_bos,  # chunks start with BOS, as in the LM1B/OWT runs
    )


def run_tiny(
    out: str | Path,
    settings: TinySettings | None = None,
    families: tuple[str, ...] = FAMILY_NAMES,
    log=print,
    write_summary: bool = True,
    heldout_chunks: int | None = None,
) -> dict:
    """Train and decode each of ``families`` into ``<out>/<family>/`` (a family already done
    there is read back), then the summary of them (unless ``write_summary`` is False: a caller
    training the families in parts writes it once they are all done). The held-out likelihood
    is measured on the first ``heldout_chunks`` held-out chunks (None: all 952; the test suite
    measures fewer, where two passes over all of them cost more than the training)."""
    settings = settings or TinySettings()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts = load_wikitext2()
    tokenizer = tiny_tokenizer(out / "tokenizer", texts.train, settings)
    train_set = ChunkedLMDataset(texts.train, tokenizer, settings.length)
    heldout = ChunkedLMDataset(texts.heldout, tokenizer, settings.length)
    log(
        f"WikiText-2: {len(train_set)} training chunks, {len(heldout)} held-out chunks of "
        f"{settings.length} tokens; BPE vocabulary {len(tokenizer)}"
    )
    summary = {}
    for family in families:
        summary[family] = _run_family(
            family, out / family, tokenizer, train_set, heldout, settings, log, heldout_chunks
        )
    if write_summary:
        log(write_tiny_summary(out, summary))
    return summary


def write_tiny_summary(out: Path, summary: dict) -> str:
    """``<out>/summary.json`` and ``summary.md`` (family -> its metrics); returns the table."""
    atomic_write_json(out / "summary.json", summary)
    table = summary_table(summary)
    atomic_write_text(out / "summary.md", table + "\n")
    return table


def corpus_documents(settings: TinySettings) -> list[str]:
    """The training documents of the settings' corpus."""
    if settings.corpus == "arithmetic":
        problems = arithmetic.generate(
            "train", settings.problems, settings.problems_seed, settings.generator
        )
        return [problem.text for problem in problems]
    return load_wikitext2().train


def training_set(settings: TinySettings, tokenizer, documents):
    """WikiText-2 as full chunks across documents; arithmetic problems one per padded row."""
    if settings.corpus == "arithmetic":
        return PaddedRowsDataset(documents, tokenizer, settings.length)
    return ChunkedLMDataset(documents, tokenizer, settings.length)


def tiny_tokenizer(folder: Path, documents, settings: TinySettings):
    """The tiny byte-level BPE trained on ``documents`` (deterministic), or ``folder``'s."""
    if (folder / "tokenizer.json").exists():
        return load_tokenizer(folder)
    return train_bpe_tokenizer(documents, settings.vocab_size, SpecialTokens(), folder)


def _run_family(
    family, folder, tokenizer, train_set, heldout, settings, log, heldout_chunks=None
) -> dict:
    metrics_path = folder / "metrics.json"
    if metrics_path.exists():
        log(f"[{family}] already done: {metrics_path}")
        return json.loads(metrics_path.read_text())
    model = build_tiny_model(family, tokenizer, settings)
    config = model.config
    measured = len(heldout) if heldout_chunks is None else min(heldout_chunks, len(heldout))
    eval_batches = [
        collate([heldout[i] for i in range(start, min(start + 16, measured))])
        for start in range(0, measured, 16)
    ]
    before = evaluate_likelihood(model, eval_batches, seed=1234, tokenizer=tokenizer)
    started = time.perf_counter()
    result = train(model, train_set, tiny_train_config(settings), folder / "train")
    train_seconds = time.perf_counter() - started
    load_weights(model, latest_checkpoint(folder / "train" / "checkpoints"), use_ema=True)
    after = evaluate_likelihood(model, eval_batches, seed=1234, tokenizer=tokenizer)
    save_model(model, folder / "model")
    tokenizer.save_pretrained(folder / "model")  # a model folder is self-contained
    model = load_model(folder / "model")  # decode what was saved, as any user would
    losses = [json.loads(line) for line in result.losses_path.read_text().splitlines()]
    log(
        f"[{family}] held-out {before.measured}: {before.nll:.3f} -> {after.nll:.3f} nats/token "
        f"({settings.steps} steps, {train_seconds:.0f} s)"
    )
    decoding, samples = _decode(family, model, tokenizer, heldout, settings)
    atomic_write_text(
        folder / "samples.jsonl", "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
    )
    metrics = {
        "family": family,
        "model_config_digest": config.digest(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train": {
            "steps": result.final_step,
            "seconds": round(train_seconds, 2),
            "first_logged_loss": losses[0]["loss"],
            "last_logged_loss": losses[-1]["loss"],
        },
        "heldout_before": before.to_dict(),
        "heldout_after": after.to_dict(),
        "decoding": decoding,
    }
    atomic_write_json(metrics_path, metrics)
    return metrics


def build_tiny_model(family: str, tokenizer, settings: TinySettings):
    """A freshly initialized tiny model (the same weights for the same settings and seed)."""
    torch.manual_seed(settings.seed)
    return build_model(model_config(family, tokenizer, settings))


def tiny_train_config(settings: TinySettings) -> TrainConfig:
    """How every tiny model is trained (the tiny job and the workflow's ``setdlm train``)."""
    return TrainConfig(
        max_steps=settings.steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        warmup_steps=settings.warmup_steps,
        schedule="cosine",
        final_lr_fraction=settings.final_lr_fraction,
        ema_decay=settings.ema_decay,
        checkpoint_every=max(1, settings.steps // 4),
        log_every=10,
        seed=settings.seed,
    )


def _decode(family, model, tokenizer, heldout, settings):
    prompts = [
        heldout[i]["input_ids"][: settings.prompt_tokens].tolist()
        for i in range(min(settings.num_prompts, len(heldout)))
    ]
    info = family_info(family)
    base = DecodeConfig(max_new_tokens=settings.new_tokens, eos_token_ids=(tokenizer.eos_token_id,))
    base = with_knobs(base, family, **info.decoding_knobs("bench", {"mdlm_block": 8}))
    thresholds = (1e6,) if info.left_to_right else settings.thresholds
    decoding, samples = [], []
    for threshold in thresholds:
        config = replace(base, confidence_threshold=threshold)
        output = model.generate(prompts, config)
        tokens = sum(output.num_generated)
        decoding.append(
            {
                "confidence_threshold": threshold,
                "generated_tokens": tokens,
                "nfe": output.nfe,
                "parallelism": sum(output.parallelism) / len(output.parallelism),
                "seconds": round(output.wall_seconds, 4),
                "tokens_per_second": round(tokens / output.wall_seconds, 1),
                "seconds_in_forwards": round(output.forward_seconds, 4),
            }
        )
        for prompt, new in zip(prompts, output.new_token_ids, strict=True):
            samples.append(
                {
                    "family": family,
                    "confidence_threshold": threshold,
                    "prompt": tokenizer.decode(prompt[1:]),
                    "output": tokenizer.decode(new),
                    "new_token_ids": new,
                }
            )
    return decoding, samples


def summary_table(summary: dict) -> str:
    lines = [
        "| family | held-out NLL before | after | measured "
        "| decoding (τ: tok/s, NFE, parallelism) |",
        "|---|---|---|---|---|",
    ]
    for family, metrics in summary.items():
        runs = "; ".join(
            f"{d['confidence_threshold']:g}: {d['tokens_per_second']}, {d['nfe']}, "
            f"{d['parallelism']:.2f}"
            for d in metrics["decoding"]
        )
        lines.append(
            f"| {family} | {metrics['heldout_before']['nll']:.3f} | "
            f"{metrics['heldout_after']['nll']:.3f} | {metrics['heldout_after']['measured']} | "
            f"{runs} |"
        )
    return "\n".join(lines)
