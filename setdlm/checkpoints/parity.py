"""Exact parity with the official implementation, on fixture folders in the official layout.

Each folder holds an official checkpoint (config.json + model.safetensors), the recorded
randomness of its loss forwards and the runs of its sampler (reference.json), and the exact
backbone call of its eval loss (reference_tensors.safetensors). ``check_case`` replays all of
it through our code with ``official_compat`` on and returns one ``Check`` per comparison.

Decoding must match exactly (ids, forward counts, parallelism). Floating-point quantities are
compared at the nominal tolerances (logits 1e-6 absolute, losses 1e-5 relative), except that a
float32 result cannot be expected to agree with another float32 result more closely than
either agrees with the exact value: the same formulas summed in a different order (16 SIMD
lanes on the AVX-512 machine that recorded the fixtures, 8 on an AVX2 one) differ by that
much. So each quantity is also computed in float64, and the tolerance grows by four times the
distance between our float32 and float64 results: both float32 results sit about that far
from the exact value, in different directions element by element, and the largest of many
such differences runs to a few times one of them. The line says when this widened the
tolerance noticeably; ``strict=True`` keeps the nominal tolerances.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from setdlm.checkpoints.folders import config_from_official, load_state, read_weights
from setdlm.core import masks
from setdlm.core.decoding import DecodeConfig
from setdlm.core.schedules import LinearSchedule, StaggeredSchedule
from setdlm.families import build_model, with_knobs
from setdlm.families import family as family_info
from setdlm.util.errors import DataError
from setdlm.util.files import read_json

LOGITS_ATOL = 1e-6
LOSS_RTOL = 1e-5
# The policies whose canvas runs on to the model length, padded (as the official MDLM's).
MASK_PADDED_CANVAS = ("semi-ar",)


@dataclass(frozen=True)
class Check:
    case: str
    quantity: str
    max_difference: float
    tolerance: float
    passed: bool
    note: str = ""

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        over = ""
        if not self.passed and 0 < self.tolerance < math.inf > self.max_difference:
            over = f"{self.max_difference / self.tolerance:.3g}x the tolerance"
        notes = [text for text in (over, self.note) if text]
        note = f"  [{'; '.join(notes)}]" if notes else ""
        return (
            f"{self.case:20s} {self.quantity:64s} max diff {self.max_difference:9.3g}  "
            f"tol {self.tolerance:8.2g}  {verdict}{note}"
        )


NOISE_FACTOR = 4


def _tolerance(nominal: float, float32_error: float | None, strict: bool) -> tuple[float, str]:
    """The nominal tolerance widened by our own float32 rounding error (strict: nominal, and
    the note says what the widened tolerance would be)."""
    if float32_error is None:
        return nominal, ""
    widened = nominal + NOISE_FACTOR * float32_error
    if strict:
        return nominal, f"ours vs float64 {float32_error:.2g}, widened tol {widened:.2g}"
    note = ""
    if NOISE_FACTOR * float32_error > 0.1 * nominal:
        note = f"+ float32 noise: ours vs float64 {float32_error:.2g}"
    return widened, note


class FixtureError(DataError):
    """An official-parity fixture with a file missing, unreadable or without an entry."""


FIXTURE_FILES = "reference.json, config.json, model.safetensors, reference_tensors.safetensors"


def fixture_cases(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).iterdir() if (p / "reference.json").exists())


def check_case(folder: Path, strict: bool = False) -> list[Check]:
    folder = Path(folder)
    reference = read_fixture_json(folder / "reference.json")
    config_file = folder / "config.json"
    with malformed(config_file):
        official = config_from_official(read_fixture_json(config_file), folder)
    config = dataclasses.replace(official, official_compat=True)
    weights = read_weights(folder)
    case = folder.name
    eval_model = _loaded(config, weights, folder).eval()
    train_model = _loaded(_without_dropout(config), weights, folder).train()
    with malformed(folder / "reference.json"):
        checks = [_backbone_logits(case, eval_model, folder, reference, strict)]
        checks += _loss(case, eval_model, reference, "eval_loss", strict)
        checks += _loss(case, train_model, reference, "train_loss", strict)
        for run in reference["generation"]:
            checks += _generation(case, eval_model, run)
    return checks


def read_fixture_json(path: Path) -> dict:
    """A fixture's JSON object, or a FixtureError naming the file."""
    value = read_json(path, FixtureError, f"a fixture folder holds {FIXTURE_FILES}")
    if not isinstance(value, dict):
        raise FixtureError(f"{path}: expected a JSON object, got a {type(value).__name__}")
    return value


@contextlib.contextmanager
def malformed(path: Path):
    """An entry a fixture file lacks or holds in another shape (a KeyError deep in a check)
    becomes an error naming the file; SETDLM_TRACEBACK=1 still shows where it was read."""
    try:
        yield
    except (KeyError, IndexError, TypeError) as error:
        raise FixtureError(
            f"{path}: a malformed fixture ({type(error).__name__}: {error}); expected the "
            "entries the official exporter writes (the fixtures' README)"
        ) from error


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (OSError, SafetensorError) as error:
        raise FixtureError(f"{path}: not a readable safetensors file ({error})") from None


def _loaded(config, weights, folder):
    model = build_model(config)
    load_state(model, weights, str(folder))
    return model


def _in_float64(model):
    return copy.deepcopy(model).double()


# ------------------------------------------------------------------------------ backbone
def _backbone_logits(case, model, folder, reference, strict) -> Check:
    recorded = _read_tensors(folder / "reference_tensors.safetensors")
    call = reference["backbone_forward"]
    input_ids = recorded[call["input_ids_key"]]
    batch, length = input_ids.shape
    positions = recorded.get(call.get("position_ids_key") or "", None)
    if positions is None:
        positions = torch.arange(length)
    allowed = recorded.get(call.get("attention_key") or "", None)
    if allowed is not None and allowed.ndim == 4:
        allowed = allowed[:, 0].bool()
    elif family_info(model.config.family).dit["causal_attention"]:
        # The official AR backbones run causally and ignore the (B, L) padding mask they get.
        allowed = masks.causal_mask(length).expand(batch, -1, -1)
    else:
        allowed = None
    positions = positions.expand(batch, -1)
    with torch.no_grad():
        logits = model.backbone(input_ids, positions, allowed)
        exact = _in_float64(model).backbone(input_ids, positions, allowed)
    difference = (logits - recorded[call["logits_key"]]).abs().max().item()
    tolerance, note = _tolerance(LOGITS_ATOL, (logits - exact).abs().max().item(), strict)
    return Check(
        case, "backbone logits (abs)", difference, tolerance, difference <= tolerance, note
    )


# ------------------------------------------------------------------------------ losses
def _without_dropout(config):
    """The train-loss fixtures were recorded with dropout forced to 0."""
    if config.backbone_kind == "dit":
        return dataclasses.replace(config, backbone={**config.backbone, "dropout": 0.0})
    return config


def _loss(case, model, reference, key, strict) -> list[Check]:
    inputs, recorded = reference["loss_inputs"], reference[key]
    batch = {
        "input_ids": torch.tensor(inputs["input_ids"]),
        "attention_mask": torch.tensor(inputs["attention_mask"]),
    }
    if inputs.get("context_mask") is not None:
        batch["context_mask"] = torch.tensor(inputs["context_mask"])
    schedule = family_info(model.config.family).schedule
    randomness = {}  # the recorded noise of the family's loss: t and x_t, or the order
    if schedule == "linear":
        randomness = {"t": torch.tensor(inputs["t"]), "x_t": torch.tensor(recorded["x_t"])}
    elif schedule == "staggered":
        randomness = {"order": torch.tensor(recorded["perm_indices"])}
    exact_model = _in_float64(model).train(model.training)
    with torch.no_grad():
        ours = model.loss(batch, randomness=randomness)
        exact = exact_model.loss(batch, randomness=randomness)
    mode = recorded["mode"]
    ordered = schedule == "staggered"  # log-probs recorded in the sampled order
    log_probs_key = "target_logprobs_permuted_order" if ordered else "target_logprobs"
    quantities = [
        ("loss", ours.loss, exact.loss, recorded["loss"]),
        ("per-token nlls", ours.nlls, exact.nlls, recorded["nlls"]),
        (
            "per-token log-probs",
            ours.extras["target_log_probs"],
            exact.extras["target_log_probs"],
            recorded[log_probs_key],
        ),
    ]
    return [
        _compare(case, f"{mode} {name}", value, value64, torch.tensor(theirs), strict)
        for name, value, value64, theirs in quantities
    ]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs() / b.abs().clamp(min=1.0)).max().item()


def _compare(case, quantity, ours, ours_float64, theirs, strict) -> Check:
    if ours.shape != theirs.shape:
        name = f"{quantity} shape {tuple(ours.shape)} vs {tuple(theirs.shape)}"
        return Check(case, name, math.inf, LOSS_RTOL, False)
    difference = _relative(ours, theirs)
    tolerance, note = _tolerance(LOSS_RTOL, _relative(ours, ours_float64), strict)
    return Check(case, f"{quantity} (rel)", difference, tolerance, difference <= tolerance, note)


# ------------------------------------------------------------------------------ decoding
def decode_config_from_official(
    run: dict, family: str, mask_token_id: int | None = None
) -> tuple[DecodeConfig, dict]:
    """Our DecodeConfig (and policy options) for one recorded official generation call.

    Settings our official_compat decoding does not reproduce are refused by name.
    """
    passed = run["generation_config_passed"]
    policy = family_info(family).default_policy
    if "block_size" in policy.knobs and passed.get("align_inputs_to_blocks") is False:
        raise ValueError("block decoding is reproduced with align_inputs_to_blocks=true only")
    pad = passed.get("pad_token_id")
    padded = policy.name in MASK_PADDED_CANVAS
    if padded and mask_token_id is not None and pad is not None and pad != mask_token_id:
        raise ValueError(
            f"{policy.name} decoding is reproduced with the canvas padded by the mask token "
            f"only (pad_token_id={pad}, mask={mask_token_id})"
        )
    overrides = run.get("model_config_overrides") or {}
    processors = run.get("logits_processor") or []
    repetition = 1.0
    for processor in processors:
        if processor["class"] != "RepetitionPenaltyLogitsProcessor":
            raise ValueError(f"unsupported official logits processor {processor['class']}")
        repetition = float(processor["penalty"])
    if passed.get("first_hitting") or passed.get("sampling_strategy", "predict_and_noise") != (
        "predict_and_noise"
    ):
        raise ValueError("only the predict_and_noise sampler without first_hitting is supported")
    prefix_only = passed.get("cache_full_infill_context") is False
    promotion = passed.get("setdlm_infill_cache_promotion_order", "l2r")
    if "infill_cache" in policy.knobs and prefix_only and promotion != "l2r":
        raise ValueError(
            f"prefix-only infilling is reproduced with l2r promotion only, not {promotion!r}"
        )
    knobs = {  # the official settings, by the names of our policies' knobs
        "block_size": passed.get("block_size"),
        "window": passed.get("max_window_size"),
        "fht_cache_order": bool(overrides.get("setdlm_fht_cache_order", False)),
        "infill_cache": "prefix" if prefix_only else "full",
        "fused_block_cache": passed.get("fused_block_cache") in (None, True),
    }
    config = DecodeConfig(
        max_new_tokens=int(run["max_new_tokens"]),
        confidence_threshold=float(passed.get("confidence_threshold", 1e6)),
        num_steps=passed.get("num_steps"),
        do_sample=bool(passed.get("do_sample", False)),
        top_p=float(passed.get("nucleus_p", 1.0)),
        repetition_penalty=repetition,
        repetition_context="visible",
        stop_cadence="official",
        official_compat=True,
    )
    config = with_knobs(config, family, **{k: v for k, v in knobs.items() if k in policy.knobs})
    options = {}
    if run.get("first_hitting_times") is not None:
        options["first_hitting_times"] = run["first_hitting_times"]
    return config, options


def _generation(case, model, run) -> list[Check]:
    name = f"generate {run['variant']}"
    try:
        config, options = decode_config_from_official(
            run, model.config.family, model.config.mask_token_id
        )
        left_to_right = family_info(model.config.family).left_to_right
        if left_to_right and model.config.backbone_kind == "qwen3":
            # The official AR runs transformers' generate, which stops at the backbone
            # config's EOS (it merges it into the generation config).
            eos = model.config.backbone["architecture"].get("eos_token_id")
            eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
            config = config.replace(eos_token_ids=tuple(eos))
        output = model.generate([run["prompt_ids"]], config, seeds=[0], **options)
    except Exception as error:  # an unsupported setting is a failed check, not a crash
        return [Check(case, f"{name}: could not run ({error})", math.inf, 0, False)]
    ours, theirs = output.output_ids[0], run["output_ids"]
    mismatches = sum(a != b for a, b in zip(ours, theirs, strict=False)) + abs(
        len(ours) - len(theirs)
    )
    checks = [
        Check(case, f"{name}: output ids (mismatches)", mismatches, 0, mismatches == 0),
        Check(
            case,
            f"{name}: backbone forwards",
            abs(output.nfe - run["num_backbone_forward_calls"]),
            0,
            output.nfe == run["num_backbone_forward_calls"],
        ),
    ]
    if run.get("parallelism_factor") is not None:
        difference = abs(output.parallelism[0] - run["parallelism_factor"])
        checks.append(
            Check(case, f"{name}: parallelism factor", difference, 1e-9, difference <= 1e-9)
        )
    return checks


# ------------------------------------------------------------------------------ schedules
SCHEDULE_RTOL = 1e-12  # float64 closed forms: room for another libm, far below any real error


def check_schedules(path: Path) -> list[Check]:
    """Every number of a ``noise_schedules.json`` (official StaggeredNoise and LinearNoise)."""
    checks = []
    with malformed(path):
        for name, recorded in read_fixture_json(path).items():
            checks += _staggered_checks(f"schedule {name}", recorded["staggered"])
            checks += _linear_checks(f"schedule {name}", recorded["linear"])
    return checks


def _staggered_checks(case: str, recorded: dict) -> list[Check]:
    args = recorded["args"]
    schedule = StaggeredSchedule.from_sizes(
        N=args["block_size"], d=args["desired_block_size"], M=args.get("max_block_size")
    )
    f64 = torch.float64
    quantities = [
        ("b", torch.tensor(schedule.b, dtype=f64), recorded["b"]),
        ("k", torch.tensor(schedule.k, dtype=f64), recorded["k"]),
        ("loc", schedule.loc(), recorded["loc"]),
    ]
    for t, expected in recorded["alpha_t_per_position"].items():
        time = torch.tensor([[float(t)]], dtype=f64)
        quantities.append((f"alpha(t={t})", schedule.alpha(time)[0], expected))
        quantities.append(
            (
                f"alpha'(t={t})",
                schedule.alpha_prime(time)[0],
                recorded["alpha_t_prime_per_position"][t],
            )
        )
    example = recorded.get("first_hitting_example")
    if example:
        draws = torch.tensor(example["E_exp1"], dtype=f64)[None]
        times = schedule.first_hitting_times(1, exp_draws=draws)[0]
        quantities.append(("first-hitting times from recorded Exp(1) draws", times, example["T"]))
    for key, value in recorded.items():  # official draws after torch.manual_seed(seed)
        if key.startswith("compute_first_hitting_times_seed"):
            seed = int(key.removeprefix("compute_first_hitting_times_seed"))
            generator = torch.Generator().manual_seed(seed)
            times = schedule.first_hitting_times(1, generator=generator, length=len(value))[0]
            quantities.append((f"first-hitting times, seed {seed}", times, value))
    checks = [_close(case, f"staggered {name}", ours, theirs) for name, ours, theirs in quantities]
    for key, value in recorded.items():
        if key.startswith("sample_permutation_order_seed"):
            seed, prompt = key.removeprefix("sample_permutation_order_seed").split("_prompt")
            flag = torch.ones(1, len(value), dtype=torch.bool)
            flag[0, : int(prompt)] = False
            order = schedule.sample_order(flag, torch.Generator().manual_seed(int(seed)))[0]
            mismatches = int((order != torch.tensor(value)).sum())
            checks.append(
                Check(
                    case,
                    f"staggered order, seed {seed}, prompt {prompt} (mismatches)",
                    mismatches,
                    0,
                    mismatches == 0,
                )
            )
    return checks


def _linear_checks(case: str, recorded: dict) -> list[Check]:
    plain = LinearSchedule(**recorded["plain"]["args"])
    blocked = LinearSchedule(**recorded["blocked"]["args"])
    quantities = [
        ("plain loc", plain.loc(), recorded["plain"]["loc"]),
        ("blocked loc", blocked.loc(), recorded["blocked"]["loc"]),
        ("blocked b", torch.tensor(blocked.b, dtype=torch.float64), recorded["blocked"]["b"]),
    ]
    for t, values in recorded["values"].items():
        time = torch.tensor([float(t)])  # float32, as the official call receives it
        quantities += [
            (f"plain alpha(t={t})", plain.alpha(time), values["plain_alpha"]),
            (f"plain alpha'(t={t})", plain.alpha_prime(time), values["plain_alpha_prime"]),
            (f"blocked alpha(t={t})", blocked.alpha(time), values["blocked_alpha_per_position"]),
            (
                f"blocked alpha'(t={t})",
                blocked.alpha_prime(time),
                values["blocked_alpha_prime_per_position"],
            ),
        ]
    return [_close(case, f"linear {name}", ours, theirs) for name, ours, theirs in quantities]


def _close(case: str, quantity: str, ours: torch.Tensor, theirs) -> Check:
    theirs = torch.as_tensor(theirs, dtype=torch.float64)
    ours = ours.double().reshape(theirs.shape)
    difference = ((ours - theirs).abs() / theirs.abs().clamp(min=1.0)).max().item()
    return Check(case, f"{quantity} (rel)", difference, SCHEDULE_RTOL, difference <= SCHEDULE_RTOL)


def run_parity(root: Path, strict: bool = False) -> list[Check]:
    checks = []
    schedules = Path(root) / "noise_schedules.json"
    if schedules.exists():
        checks += check_schedules(schedules)
    for folder in fixture_cases(root):
        checks += check_case(folder, strict=strict)
    return checks
