"""Tiny random-weight stand-ins of the published checkpoints, written into a local Hugging Face
cache, so that ``models.yaml`` keys resolve through the real loading code offline.

A rehearsal of the paper's matrix (workflows/config/paper-rehearsal.yaml) runs every key of the
published table through ``load_pretrained`` -> ``snapshot_download`` -> the official-layout
loader with ``HF_HUB_OFFLINE=1``. Nothing here is a trained model: every weight is random.
What is real is what the loader and the tasks depend on:

- the layout of an official Hub folder: ``config.json`` as the official save writes it (class
  names, flattened ``_target_``s, token ids, ``tokenization_config``, ``noise_config``) and
  ``pytorch_model.bin`` (the official save's weights file, read with ``weights_only``);
  GSM8K's Qwen3 backbone names its base model by Hub id (``Qwen/Qwen3-1.7B-Base``, whose
  ``config.json`` is then fetched from the cache, as the real one would be), CNN/DM's ships a
  relative ``qwen3_backbone/`` folder (the parity fixtures' layout);
- the OWT AR and MDLM folders have a ``DITLegacy`` backbone with no ``noise_config``: the Hub
  folders the official ``push_hf_models.py`` wrote from the mdlm/bd3lms Lightning files;
- each task's vocabulary, special tokens, mask token and model length (1024 / 768 / 1024 /
  128): GSM8K and CNN/DM the Qwen3 tokenizer (151,669 tokens, a 151,936-row backbone),
  OWT GPT-2 plus ``<|fim_middle|>`` (50,258), LM1B BERT's (30,522);
- the tokenizer repositories the table names, from the offline mirror
  (``SETDLM_DATA_DIR/tokenizers``).

What is cut: 2 layers of width 32 (Qwen3: 2 heads of 16, 1 key/value head). Weights come from
a generator seeded by the key and the revision, so the same files come out every time, and
each repository's commit is derived from its files (``commit_of``). ``TWO_REVISIONS`` keys get
a second, older revision with other weights, which ``main`` does not point at: pinning one of
them is the only way to load it.

The cache layout is huggingface_hub's (``hub/models--<org>--<name>/{blobs, refs/main,
snapshots/<commit>/...}``, snapshot files are relative links to their blob).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy

from setdlm.checkpoints.zoo import LEGACY_FAMILIES, PUBLISHED, PublishedModel
from setdlm.util.errors import DataError
from setdlm.util.files import atomic_write_bytes

# The stand-ins' size: small enough that the whole paper DAG runs on 2 CPU cores.
HIDDEN, LAYERS, HEADS = 32, 2, 2
COND_DIM = 16  # DiT's noise-conditioning width (adaLN)
QWEN3_KV_HEADS, QWEN3_INTERMEDIATE = 1, 64
QWEN3_BACKBONE_VOCAB = 151936  # the Qwen3 base models' embedding rows (the tokenizer has 151,669)
# Keys whose repository holds two revisions: main (variant 1) and an older one (variant 0).
TWO_REVISIONS = ("owt:setdlm-smax32",)
# The tokenizer repositories of the table (zoo.TASKS) -> their folder in the offline mirror.
TOKENIZER_MIRROR = {
    "Qwen/Qwen3-1.7B-Base": "qwen3",
    "Qwen/Qwen3-0.6B-Base": "qwen3",
    "gpt2": "gpt2",
    "bert-base-uncased": "bert-base-uncased",
}
# The config.json of the tokenizer repositories that are not Qwen3 base models (their models'
# weights are never loaded: the type tells AutoTokenizer what it reads).
MODEL_CONFIGS = {
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257},
    "bert-base-uncased": {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": 30522,
    },
}
# GSM8K's backbone config names its base model on the Hub; CNN/DM's ships it in the folder.
BACKBONE_BY_HUB_ID = ("gsm8k",)
QWEN3_TASKS = ("gsm8k", "cnndm")
WEIGHTS = "pytorch_model.bin"
COMMIT_SALT = b"setdlm stand-in checkpoint\n"
# The official config classes' model_type (SetDLM is saved with BD3LMConfig).
MODEL_TYPES = {"ar": "ar", "mdlm": "mdlm", "bd3lm": "bd3lm", "setdlm": "bd3lm"}


@dataclass(frozen=True)
class TaskTokens:
    """A task's token ids, read from its tokenizer (never typed in)."""

    pad: int
    bos: int
    eos: int
    mask: int
    vocab: int  # the tokenizer's ids plus an added mask row, where the mask is not in it
    backbone_vocab: int  # rows of the embedding and output layer


def task_tokens(task: str, tokenizer, mask_token: str) -> TaskTokens:
    """The ids a task's checkpoints were trained with (SPEC 4, the parity fixtures' recipes)."""
    mask = tokenizer.convert_tokens_to_ids(mask_token)
    size = len(tokenizer)
    if mask is None or mask == tokenizer.unk_token_id:  # GPT-2: the mask is an added last row
        mask, size = size, size + 1
    if task in QWEN3_TASKS:  # the base models' <|endoftext|> is BOS, EOS and padding
        eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        return TaskTokens(eos, eos, eos, mask, size, QWEN3_BACKBONE_VOCAB)
    if task == "lm1b":  # BERT: [PAD], [CLS] ... [SEP]
        return TaskTokens(
            tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, mask, size, size
        )
    eos = tokenizer.eos_token_id  # GPT-2's <|endoftext|> is BOS, EOS and padding
    return TaskTokens(eos, eos, eos, mask, size, size)


# ---------------------------------------------------------------------------- config.json
def official_config(spec: PublishedModel, tokens: TaskTokens) -> dict:
    """The ``config.json`` the official save writes for ``spec`` (a stand-in's architecture)."""
    from setdlm.families import family as family_info

    info = family_info(spec.family)
    ids = {
        "bos_token_id": tokens.bos,
        "eos_token_id": tokens.eos,
        "mask_token_id": tokens.mask,
        "pad_token_id": tokens.pad,
        "pad_vocab_size_multiple": 1,
        "vocab_size": tokens.vocab,
    }
    config = {
        "architectures": [info.title],
        "model_type": MODEL_TYPES[spec.family],
        "backbone_config": _backbone_config(spec, tokens),
        "length": spec.length,
        "tokenization_config": ids,
        **ids,
        "keep_clean_bos": spec.keep_clean_bos,
        "train_on_context": False,
        "torch_dtype": "float32",
    }
    legacy = spec.task == "owt" and spec.family in LEGACY_FAMILIES
    if info.schedule == "linear" and not legacy:  # the legacy MDLM saved none (linear)
        config["noise_config"] = {"_target_": "noise_schedule_noise_schedules.LinearNoise"}
    else:
        config["noise_config"] = None
    if spec.block_size is not None:  # BD3LM S
        config["block_size"] = config["eval_block_size"] = spec.block_size
    if spec.d is not None:  # SetDLM: one block over the model, the staggered schedule
        config["block_size"] = config["eval_block_size"] = spec.length
        config["noise_config"] = {
            "_target_": "noise_schedule_noise_schedules.StaggeredNoise",
            "block_size": spec.length,
            "desired_block_size": spec.d,
            "eps": 0.001,
            "length": spec.length,
            "max_block_size": 2 * spec.d,
        }
    return config


def _backbone_config(spec: PublishedModel, tokens: TaskTokens) -> dict:
    from setdlm.families import family as family_info

    causal = family_info(spec.family).dit["causal_attention"]
    if spec.task in QWEN3_TASKS:
        return {
            "_target_": "backbone_automodel.AutoModelFromPreTrained",
            "attn_implementation": "sdpa",
            "automodel_cls": "AutoModelForCausalLM",
            "keep_top_layers": False,
            "num_layers": -1,
            "pretrained_model_name_or_path": (
                spec.tokenizer if spec.task in BACKBONE_BY_HUB_ID else "qwen3_backbone"
            ),
            "reinit_model": True,
            "revision": None,
            "trust_remote_code": True,
            "use_causal_mask": causal,
        }
    legacy = spec.task == "owt" and spec.family in LEGACY_FAMILIES
    return {
        "_target_": "backbone_dit_legacy.DITLegacy" if legacy else "backbone_dit.DIT",
        # adaLN as the published runs: MDLM's on, the others' off (their run names say so)
        "adaln": spec.family == "mdlm",
        "attn_backend": "flash_attn" if legacy and causal else "sdpa",
        "block_size": spec.block_size or spec.length,
        "causal_attention": causal,
        "cond_dim": COND_DIM,
        "dropout": 0.1,
        "hidden_size": HIDDEN,
        "length": spec.length,
        "n_heads": HEADS,
        "num_layers": LAYERS,
        "pretrained_model_name_or_path": None,
        "tie_word_embeddings": True,
        "vocab_size": tokens.backbone_vocab,
    }


def qwen3_architecture(tokens: TaskTokens) -> dict:
    """A tiny Qwen3 ``config.json``: the base model's vocabulary and ids, 2 layers of 32."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tokens.bos,
        "eos_token_id": tokens.eos,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": QWEN3_INTERMEDIATE,
        "max_position_embeddings": 32768,
        "max_window_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": QWEN3_KV_HEADS,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": tokens.backbone_vocab,
    }


# ---------------------------------------------------------------------------------- weights
def random_weights(config: dict, architecture: dict | None, seed: int) -> bytes:
    """``pytorch_model.bin`` of the model ``config`` describes, every parameter drawn from a
    generator seeded with ``seed`` (sorted by name: the same bytes on every machine)."""
    import torch

    from setdlm.checkpoints.folders import config_from_official
    from setdlm.families import build_model

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if architecture is not None:  # where config_from_official reads the backbone from
            reference = config["backbone_config"]["pretrained_model_name_or_path"]
            (folder / reference).mkdir(parents=True)
            (folder / reference / "config.json").write_text(json.dumps(architecture))
        model_config = config_from_official(config, folder)
    torch.manual_seed(seed)  # construction; every parameter is redrawn below anyway
    model = build_model(model_config)
    # numpy's generator, not torch's: its normal draws are the same numbers on every CPU,
    # where torch's vectorised ones may differ by a rounding between instruction sets
    generator = numpy.random.default_rng(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            parameter.copy_(torch.from_numpy(_draw(name, tuple(parameter.shape), generator)))
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    buffer = io.BytesIO()
    torch.save(state, buffer)  # tied tensors (Qwen3's embedding and output) are stored once
    return buffer.getvalue()


def _draw(name: str, shape: tuple[int, ...], generator) -> numpy.ndarray:
    """Weights with varied, non-degenerate logits: matrices ~ N(0, 1/fan_in), norm scales
    near 1, biases and the rest small. The DiT zero-initialises its output layer and adaLN
    gates, which would make every logit equal (every decision a tie)."""
    values = generator.standard_normal(shape, dtype=numpy.float32)  # (*shape,)
    if len(shape) >= 2:
        return values / numpy.float32(shape[-1] ** 0.5)
    if "norm" in name and name.endswith("weight"):
        return 1 + numpy.float32(0.1) * values
    return numpy.float32(0.1) * values


def lightning_checkpoint(spec: PublishedModel, tokens: TaskTokens) -> bytes:
    """An OWT AR or MDLM stand-in as the mdlm/bd3lms codebase saved it, a Lightning ``.ckpt``
    (what ``setdlm import-legacy`` reads): ``state_dict`` under ``backbone._orig_mod.<name>``
    with other (training) weights, and the Hub folder's weights as ``ema.shadow_params`` in
    the backbone's parameter order, which the official evaluation and the import use."""
    import torch

    from setdlm.checkpoints.folders import config_from_official, load_state
    from setdlm.families import build_model

    if not (spec.task == "owt" and spec.family in LEGACY_FAMILIES):
        raise ValueError(f"{spec.key}: only the OWT AR and MDLM were Lightning files")
    config = official_config(spec, tokens)
    evaluated = torch.load(io.BytesIO(random_weights(config, None, _seed(spec.key, 1))))
    trained = torch.load(io.BytesIO(random_weights(config, None, _seed(spec.key, 2))))
    model = build_model(config_from_official(config, Path(".")))
    load_state(model, evaluated, spec.key)
    ema = [parameter.detach().clone() for _, parameter in model.backbone.named_parameters()]
    state = {name.replace("backbone.", "backbone._orig_mod.", 1): t for name, t in trained.items()}
    state |= {"sampling_eps_min": torch.tensor(1e-3), "sampling_eps_max": torch.tensor(1.0)}
    buffer = io.BytesIO()
    torch.save({"state_dict": state, "ema": {"shadow_params": ema}, "epoch": 20}, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------------------ repositories
def checkpoint_files(spec: PublishedModel, tokens: TaskTokens, variant: int) -> dict[str, bytes]:
    """The files of one revision of ``spec``'s stand-in repository."""
    config = official_config(spec, tokens)
    architecture = qwen3_architecture(tokens) if spec.task in QWEN3_TASKS else None
    files = {"config.json": _json_bytes(config)}
    if architecture is not None and spec.task not in BACKBONE_BY_HUB_ID:
        files["qwen3_backbone/config.json"] = _json_bytes(architecture)
    files[WEIGHTS] = random_weights(config, architecture, _seed(spec.key, variant))
    return files


def tokenizer_files(
    repo_id: str, mirror: Path, tokens: TaskTokens | None = None
) -> dict[str, bytes]:
    """The files of a tokenizer repository, from the offline mirror's folder (its files as
    they are) and a ``config.json``, without which transformers 5's ``AutoTokenizer`` does not
    load a Hub id: a Qwen3 base model's is the stand-ins' tiny architecture (GSM8K's backbone
    config names it by Hub id), GPT-2's and BERT's name their model type. Where the mirror has
    raw vocabularies only (GPT-2, BERT), ``tokenizer.json`` and ``tokenizer_config.json`` are
    the ones transformers writes for them, as their Hub repositories have both."""
    from setdlm.data.tokenizers import load_tokenizer

    source = mirror / TOKENIZER_MIRROR[repo_id]
    if not source.is_dir():
        raise DataError(f"{source}: no tokenizer folder for {repo_id} in the offline mirror")
    files = {
        path.name: path.read_bytes()
        for path in sorted(source.iterdir())
        if path.is_file() and not path.name.startswith("LICENSE")
    }
    if "tokenizer.json" not in files:
        with tempfile.TemporaryDirectory() as scratch:
            load_tokenizer(source).save_pretrained(scratch)
            written = json.loads((Path(scratch) / "tokenizer_config.json").read_text())
            files["tokenizer.json"] = (Path(scratch) / "tokenizer.json").read_bytes()
        for where_saved in ("is_local", "local_files_only"):  # how it was saved, not what it is
            written.pop(where_saved, None)
        files["tokenizer_config.json"] = _json_bytes(written)
    if tokens is not None:
        files["config.json"] = _json_bytes(qwen3_architecture(tokens))
    else:
        files["config.json"] = _json_bytes(MODEL_CONFIGS[repo_id])
    return files


def commit_of(files: dict[str, bytes]) -> str:
    """A 40-hex-digit commit derived from a revision's files (names and contents)."""
    digest = hashlib.sha1(COMMIT_SALT)
    for name in sorted(files):
        digest.update(f"{name}\0{hashlib.sha256(files[name]).hexdigest()}\n".encode())
    return digest.hexdigest()


def write_repo(hub_cache: Path, repo_id: str, revisions: list[dict[str, bytes]]) -> list[str]:
    """Write ``revisions`` (oldest first; the last is main) into the cache; their commits."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    commits = []
    for files in revisions:
        commit = commit_of(files)
        snapshot = repo / "snapshots" / commit
        staging = snapshot.with_name(f".{commit}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        for name, data in files.items():
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            if not blob.is_file():
                atomic_write_bytes(blob, data)
            link = staging / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
        shutil.rmtree(snapshot, ignore_errors=True)
        staging.rename(snapshot)
        commits.append(commit)
    atomic_write_bytes(repo / "refs" / "main", commits[-1].encode())
    return commits


def _json_bytes(value) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def _seed(key: str, variant: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{key}#{variant}".encode()).digest()[:8], "little") >> 1


# ------------------------------------------------------------------------------------ cache
@dataclass(frozen=True)
class CacheEntry:
    repo_id: str
    key: str | None  # the published key (None: a tokenizer repository)
    commits: tuple[str, ...]  # oldest first; the last is main


def build_cache(
    hf_home: Path,
    mirror: Path,
    keys: Iterable[str] | None = None,
    two_revisions: Iterable[str] = TWO_REVISIONS,
    log=print,
) -> list[CacheEntry]:
    """Write the stand-ins of ``keys`` (None: every published key) and the tokenizer
    repositories they name into ``hf_home/hub``. Rewriting gives the same files and commits."""
    from setdlm.data.tokenizers import load_tokenizer

    hub_cache = Path(hf_home) / "hub"
    specs = [PUBLISHED[key] for key in (sorted(PUBLISHED) if keys is None else keys)]
    two = set(two_revisions)
    tokenizers = {spec.tokenizer for spec in specs}
    loaded = {}
    for name in sorted(tokenizers):
        if name not in TOKENIZER_MIRROR:
            raise DataError(f"no offline tokenizer for {name} (known: {sorted(TOKENIZER_MIRROR)})")
        loaded[name] = load_tokenizer(mirror / TOKENIZER_MIRROR[name])
    tokens = {
        spec.task: task_tokens(spec.task, loaded[spec.tokenizer], spec.mask_token) for spec in specs
    }
    entries = []
    for name in sorted(tokenizers):
        task = next(spec.task for spec in specs if spec.tokenizer == name)
        base = tokens[task] if task in QWEN3_TASKS else None
        commits = write_repo(hub_cache, name, [tokenizer_files(name, mirror, base)])
        entries.append(CacheEntry(name, None, tuple(commits)))
        log(f"{name}: {commits[-1]} (tokenizer)")
    for spec in specs:
        variants = (0, 1) if spec.key in two else (1,)
        revisions = [checkpoint_files(spec, tokens[spec.task], v) for v in variants]
        commits = write_repo(hub_cache, spec.hub_id, revisions)
        entries.append(CacheEntry(spec.hub_id, spec.key, tuple(commits)))
        older = f" (older revision {commits[0]})" if len(commits) > 1 else ""
        log(f"{spec.key} {spec.hub_id}: {commits[-1]}{older}")
    return entries


def manifest(entries: list[CacheEntry]) -> dict:
    """What a cache holds, as JSON: repository -> key, main commit, every commit."""
    return {
        entry.repo_id: {"key": entry.key, "main": entry.commits[-1], "commits": list(entry.commits)}
        for entry in entries
    }
