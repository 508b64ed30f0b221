"""Finished results of one run, read from the shared layout.

    RUN_DIR/<task>/<model>/<point>/metrics.json
        task:  gsm8k | cnndm | infill-1 | infill-3 | unconditional | likelihood-<data>
               | arithmetic-solve | arithmetic-infill
        model: ar | mdlm | bd3lm-s<S> | setdlm-smax<M>, optionally -<tag> (ar-arith)
        point: [<policy>-]tau-<τ> | default

A point is finished when its ``metrics.json`` exists (the evaluations write it atomically, last).
Folder names are checked against what the file says it holds (task, family, S or smax, τ):
a misfiled result would otherwise land silently in the wrong row of a committed table.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from setdlm.errors import UserError
from setdlm.eval.records import BATCH_1, speed_protocol
from setdlm.families import FAMILY_NAMES, MODEL_NAME_HELP, config_size, parse_model_name
from setdlm.families import family as family_info
from setdlm.workflow.layout import POINT_NAME

# Folder task name -> the ``task`` field the evaluation writes into metrics.json.
TASK_FIELDS = {
    "gsm8k": "gsm8k",
    "cnndm": "cnndm",
    "infill-1": "rocstories-infill-1",
    "infill-3": "rocstories-infill-3",
    "unconditional": "unconditional",
    "arithmetic-solve": "arithmetic-solve",
    "arithmetic-infill": "arithmetic-infill",
}
LIKELIHOOD_PREFIX = "likelihood-"
# The quality each task is plotted and compared by (its figure's y axis, MLflow's `quality`).
HEADLINE_QUALITY = {
    "gsm8k": "paper_exact",
    "cnndm": "rougeL",
    "infill-1": "rougeL",
    "infill-3": "rougeL",
    "unconditional": "mauve",
    "arithmetic-solve": "strict_match",
    "arithmetic-infill": "step_exact",
}
LIKELIHOOD_HEADLINE = "nll"


class ResultLayoutError(UserError, ValueError):
    """A folder of the run does not follow the shared layout or contradicts its metrics.json."""


@dataclass(frozen=True)
class ResultPoint:
    task: str  # folder name: gsm8k, infill-1, likelihood-wikitext2, ...
    model: str  # folder name: ar, bd3lm-s4, setdlm-smax8, ...
    point: str  # folder name: default, tau-0.9, ...
    family: str
    size: int | None  # BD3LM S or SetDLM smax M; None for AR and MDLM
    tau: float | None  # the decoding's confidence threshold; None where it does not apply
    policy: str | None  # the decoding policy; None: the family's own (or no decoding)
    metrics: dict = field(repr=False, compare=False)
    # throughput.json: the paper's separate batch-1 protocol, when the point ran it
    throughput: dict | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.task}/{self.model}/{self.point}"

    @property
    def curve(self) -> str:
        """The speed-quality curve the point is on: its model, and its policy where that is
        not the family's own (one curve per model and policy)."""
        return self.model if self.policy is None else f"{self.model} {self.policy}"

    @property
    def policy_name(self) -> str | None:
        """The decoding policy's name, the family's own included (None: no decoding)."""
        if "decode" not in self.config:
            return None
        return self.policy or family_info(self.family).default_policy.name

    @property
    def config(self) -> dict:
        return self.metrics.get("config", {})

    def quality(self, name: str) -> float | None:
        entry = self.metrics.get("quality", {}).get(name)
        return None if entry is None else entry.get("value")

    def interval(self, name: str) -> tuple[float, float] | None:
        return quality_interval(self.metrics, name)

    def published_checkpoint(self):
        """The published model (setdlm/zoo.py) this point decoded, or None: a model folder,
        trained here or elsewhere."""
        from setdlm.zoo import resolve

        source = self.metrics.get("config", {}).get("model_source")
        return resolve(str(source)) if source else None

    def speed(self, name: str) -> float | None:
        return self.metrics.get("speed", {}).get(name)

    def batch1_speed(self) -> tuple[float, float | None] | None:
        """Mean (and std) per-example tok/s under the paper's batch-1 protocol: the run's own
        when it decoded at batch 1, else its separate paper-protocol timing (throughput.json),
        else None: a batched run's per-example tok/s are under load, not the paper's number."""
        if speed_protocol_of(self.metrics).startswith(BATCH_1):
            mean = self.speed("tokens_per_second_mean")
            return None if mean is None else (mean, self.speed("tokens_per_second_std"))
        if self.throughput and self.throughput.get("tokens_per_second_mean") is not None:
            paper = self.throughput
            return paper["tokens_per_second_mean"], paper.get("tokens_per_second_std")
        return None

    def sort_key(self) -> tuple:
        # τ from large to small: the sweep goes from one token per step to the fastest point.
        return (
            self.task,
            FAMILY_NAMES.index(self.family),
            self.size or 0,
            self.model,
            (self.policy is not None, self.policy or ""),  # the family's own policy first
            -(self.tau if self.tau is not None else math.inf),
            self.point,
        )


@dataclass(frozen=True)
class Results:
    run_dir: Path
    points: tuple[ResultPoint, ...]  # sorted by task, family, size, τ
    unfinished: tuple[str, ...]  # point keys whose folder has no metrics.json yet

    @property
    def name(self) -> str:
        """The run's name (its configuration's): the folder name, never a machine's path."""
        return self.run_dir.resolve().name

    def for_task(self, task: str) -> list[ResultPoint]:
        return [p for p in self.points if p.task == task]

    def tasks(self) -> list[str]:
        return sorted({p.task for p in self.points})


def load_results(run_dir: str | Path) -> Results:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"results folder {run_dir} does not exist")
    points, unfinished = [], []
    for folder in sorted(run_dir.glob("*/*/*")):
        if not folder.is_dir() or any(part.startswith(".") for part in folder.parts[-3:]):
            continue  # files, and hidden folders (editors, temporary copies)
        metrics_path = folder / "metrics.json"
        if not metrics_path.exists():
            unfinished.append(folder.relative_to(run_dir).as_posix())
            continue
        points.append(read_point(folder, metrics_path))
    points.sort(key=ResultPoint.sort_key)
    return Results(run_dir, tuple(points), tuple(unfinished))


def read_point(folder: Path, metrics_path: Path) -> ResultPoint:
    task, model, point = folder.parts[-3:]
    try:
        metrics = json.loads(metrics_path.read_text())
    except ValueError as error:  # not JSON, or not even UTF-8 text
        raise ResultLayoutError(f"{metrics_path}: not valid JSON ({error})") from None
    if not isinstance(metrics, dict) or not isinstance(metrics.get("quality"), dict):
        raise ResultLayoutError(
            f"{metrics_path}: not an evaluation's metrics (expected a JSON object with a "
            "'quality' object, as `setdlm eval` writes)"
        )
    _check_task(metrics_path, task, metrics)
    family, size = _parse_model(metrics_path, model, metrics)
    tau, policy = _parse_point(metrics_path, point, family, metrics)
    throughput_path = folder / "throughput.json"
    throughput = None
    if throughput_path.exists():
        try:
            throughput = json.loads(throughput_path.read_text())
        except ValueError as error:
            raise ResultLayoutError(f"{throughput_path}: not valid JSON ({error})") from None
    return ResultPoint(task, model, point, family, size, tau, policy, metrics, throughput)


def _check_task(path: Path, task: str, metrics: dict) -> None:
    recorded = metrics.get("task")
    if task.startswith(LIKELIHOOD_PREFIX):
        data = metrics.get("config", {}).get("data")
        expected = ("likelihood", task.removeprefix(LIKELIHOOD_PREFIX))
        if (recorded, data) != expected:
            raise ResultLayoutError(
                f"{path}: folder {task!r} holds task {recorded!r} on data {data!r}"
            )
        return
    if task not in TASK_FIELDS:
        raise ResultLayoutError(
            f"{path}: task folder {task!r} is not one of {sorted(TASK_FIELDS)} "
            f"or {LIKELIHOOD_PREFIX}<data>"
        )
    if recorded != TASK_FIELDS[task]:
        raise ResultLayoutError(f"{path}: folder {task!r} holds task {recorded!r}")


def _parse_model(path: Path, model: str, metrics: dict) -> tuple[str, int | None]:
    parsed = parse_model_name(model)
    if parsed is None:
        raise ResultLayoutError(
            f"{path}: model folder {model!r} is not {MODEL_NAME_HELP} "
            "(each optionally followed by -<tag>)"
        )
    family, size = parsed
    config = metrics.get("config", {}).get("model_config", {})
    recorded = config.get("family")
    if recorded != family:
        raise ResultLayoutError(f"{path}: folder {model!r} holds a {recorded!r} model")
    info = family_info(family)
    if info.size is not None and config_size(info, config) != size:
        raise ResultLayoutError(
            f"{path}: folder {model!r} holds a {info.title} with {info.size.symbol} = "
            f"{config_size(info, config)}"
        )
    return family, size


def _parse_point(
    path: Path, point: str, family: str, metrics: dict
) -> tuple[float | None, str | None]:
    """(τ, policy) of a point folder, checked against what its metrics.json says: τ None where
    it does not apply, policy None for the family's own."""
    match = POINT_NAME.match(point)
    if not match:
        raise ResultLayoutError(
            f"{path}: point folder {point!r} is not 'default', 'tau-<τ>' or '<policy>-tau-<τ>'"
        )
    decode = metrics.get("config", {}).get("decode")
    if decode is None:  # likelihood: no decoding
        return None, None
    policy = decode.get("policy")  # recorded only for a policy other than the family's own
    if match["policy"] != policy:
        said = f"policy {match['policy']!r}" if match["policy"] else "the family's own policy"
        raise ResultLayoutError(
            f"{path}: folder {point!r} says {said}, but the run decoded with "
            f"{policy or family_info(family).default_policy.name!r}"
        )
    tau = float(decode["confidence_threshold"])
    if match["tau"] is not None:
        try:
            named = float(match["tau"])
        except ValueError:
            raise ResultLayoutError(f"{path}: point folder {point!r}: τ is not a number") from None
        if not math.isclose(named, tau, rel_tol=1e-9):
            raise ResultLayoutError(f"{path}: folder {point!r} holds a run at τ = {tau:g}")
    # AR commits one token per step whatever τ is: its τ is not a setting of the point.
    return (None if family_info(family).left_to_right else tau), policy


def quality_interval(metrics: dict, name: str) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of quality ``name`` in a metrics.json (None where none was
    recorded)."""
    entry = metrics.get("quality", {}).get(name) or {}
    interval = entry.get("bootstrap_95")
    if isinstance(interval, list) and len(interval) == 2 and all(map(is_number, interval)):
        return float(interval[0]), float(interval[1])
    return None


def is_number(value) -> bool:
    """A JSON number (not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def model_title(family: str, size: int | None) -> str:
    return family_info(family).model_title(size)


def format_tau(tau: float | None) -> str:
    """1e6 rather than 1e+06; "-" where τ does not apply."""
    if tau is None:
        return "-"
    return f"{tau:g}".replace("e+0", "e").replace("e+", "e")


def speed_protocol_of(metrics: dict) -> str:
    """How a result's speed was timed (results from before the protocol was recorded: from
    the batch size their run used)."""
    protocol = (metrics.get("speed") or {}).get("protocol")
    if protocol is None:
        protocol = speed_protocol([{"batch_size": (metrics.get("run") or {}).get("batch_size", 1)}])
    return protocol


def hardware_summary(metrics: dict) -> str:
    hardware = metrics.get("hardware") or {}
    device = hardware.get("device", "unknown device")
    threads = hardware.get("torch_threads")
    parts = [hardware.get("cpu"), hardware.get("cpu_capability")]
    if threads is not None:
        parts.append(f"{threads} torch thread{'s' if threads != 1 else ''}")
    details = ", ".join(str(p) for p in parts if p)
    return f"{device} ({details})" if details else device
