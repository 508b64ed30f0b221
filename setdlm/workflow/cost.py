"""What a configuration's DAG costs before it is submitted: jobs, GPUs and GPU hours per rule.

``setdlm plan CONFIG... --cost`` builds the same ``Plan`` the Snakefile builds (the files merged
as ``snakemake --configfile A B`` merges them) and prices it with a stated model:

    GPU seconds of a decoding point = GPUs x (overhead + examples x tokens / (tokens per second))

- examples: the task's ``limit`` (or ``samples``), else its full test set (``FULL_SETS``);
- tokens: what one example decodes. The estimate uses a typical length (``TASK_TOKENS``: GSM8K
  stops at its first boxed answer, CNN/DM at its first EOS...); the bound uses the budget
  (``max_new_tokens``, the protocol's 1,024 for GSM8K, the model length for unconditional);
- tokens per second: batch 1, as the paper measures. GSM8K has published speeds (SPEC 6.1,
  setdlm/report/paper_numbers.py) for AR, SetDLM smax8/smax32 and BD3LM S=4/16 at each τ; a
  size without its own (SetDLM smax16, BD3LM S=8) takes the mean of its family's two published
  sizes at that τ; MDLM (no published speed) takes BD3LM S=4's τ = 1e6 speed (one token per
  step; it has no KV cache, so this flatters it). Every other task has no published speed and
  is priced at the GSM8K speed of the same family, size and τ (its models are smaller than the
  1.7 B GSM8K ones, so this errs towards more hours);
- likelihood points run forward passes only: sequences x model length / ``FORWARD_TOKENS_PER_S``;
- ``JOB_OVERHEAD_S`` per job: start-up, loading the checkpoint, the first CUDA kernels;
- jobs without a GPU (data, fetch, tables, MLflow) cost no GPU hours.

The numbers are for sizing a submission (which queue, how many GPUs, how long), not
measurements: measure a point with ``setdlm bench gpu`` and compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from setdlm.results.layout import LIKELIHOOD_POINT

JOB_OVERHEAD_S = 120.0
# The test sets' sizes (when a task sets no limit): GSM8K test, CNN/DailyMail 3.0.0 test, the
# Story Cloze spring-2016 validation stories.
FULL_SETS = {"gsm8k": 1319, "cnndm": 11490, "infill-1": 1871, "infill-3": 1871}
# Tokens one example typically decodes, and why.
TASK_TOKENS = {
    "gsm8k": (
        256,
        "stops at its first \\boxed{}; 256 Qwen3 tokens cover 98 % of the reference solutions",
    ),
    "cnndm": (180, "the paper's 180-token budget (the first EOS may stop it sooner)"),
    "infill-1": (20, "one masked Story Cloze sentence, about 20 GPT-2 tokens"),
    "infill-3": (60, "three masked sentences"),
}
BUDGETS = {"gsm8k": 1024, "cnndm": 180, "infill-1": 20, "infill-3": 60}
# Held-out likelihood: sequences of the model's length through one forward each (a 110 M DiT at
# batch 8-16 on one GPU), and how many sequences the full sets hold.
FORWARD_TOKENS_PER_S = 20_000.0
HELDOUT_SEQUENCES = {"likelihood-owt": 110_000, "likelihood-lm1b": 70_000}
NO_THRESHOLD = 1e6


@dataclass
class RuleCost:
    rule: str
    jobs: int = 0
    gpus: int = 0  # per job (the largest of the rule's)
    gpu_seconds: float = 0.0  # estimate
    bound_seconds: float = 0.0  # with every example decoding its whole budget
    # an evaluation rule's jobs by task: task -> [jobs, GPU seconds, bound seconds]
    tasks: dict[str, list] = field(default_factory=dict)


def decode_speed(family: str, size: int | None, tau: float | None) -> tuple[float, str]:
    """Tokens per second at batch 1 (the published GSM8K speed, or the stated stand-in)."""
    from setdlm.report.paper_numbers import match_gsm8k

    tau = NO_THRESHOLD if tau is None else tau
    point = match_gsm8k(family, size, tau)
    if point is not None:
        return point.tokens_per_second, "published"
    if family == "mdlm":
        return match_gsm8k("bd3lm", 4, NO_THRESHOLD).tokens_per_second, "MDLM as BD3LM S=4 τ=1e6"
    neighbours = {"setdlm": (8, 32), "bd3lm": (4, 16)}.get(family)
    if neighbours is not None:
        known = [match_gsm8k(family, s, tau) for s in neighbours]
        if all(known):
            mean = sum(p.tokens_per_second for p in known) / 2
            return mean, f"{family} size {size}: mean of sizes {neighbours}"
        first = match_gsm8k(family, neighbours[0], NO_THRESHOLD)
        return first.tokens_per_second, f"{family} τ {tau}: the τ = 1e6 speed"
    raise ValueError(f"no speed for family {family!r}")


def point_cost(plan, point) -> tuple[float, float]:
    """(estimate, bound) seconds of one point's work on its GPUs."""
    settings = plan.config["tasks"][point.task]
    entry = plan.config["models"][point.model]
    length = _model_length(plan, point.task, point.model)
    if point.point == LIKELIHOOD_POINT:
        sequences = settings.get("limit") or HELDOUT_SEQUENCES.get(point.task, 1000)
        seconds = sequences * length * settings.get("samples", 1) / FORWARD_TOKENS_PER_S
        return seconds, seconds
    examples, tokens, bound = _examples_and_tokens(point.task, settings, length)
    tau = _tau(point.point)
    family = entry["family"]
    size = entry.get("block_size") or (2 * entry["d"] if entry.get("d") else None)
    speed, _ = decode_speed(family, size, None if family == "ar" else tau)
    return examples * tokens / speed, examples * bound / speed


def _examples_and_tokens(task: str, settings: dict, length: int) -> tuple[int, int, int]:
    if task == "unconditional":
        budget = settings.get("max_new_tokens") or length - 1  # BOS, then fill the model
        return settings["samples"], budget, budget
    examples = settings.get("limit") or FULL_SETS[task]
    budget = settings.get("max_new_tokens") or BUDGETS[task]
    return examples, min(TASK_TOKENS[task][0], budget), budget


def _tau(point: str) -> float | None:
    name = point.rsplit("tau-", 1)
    return float(name[1]) if len(name) == 2 else None


def _model_length(plan, task: str, model: str) -> int:
    from setdlm.workflow.config import load_published, model_length

    return model_length(plan.config, load_published(), model, task)


def costs(plan) -> list[RuleCost]:
    """Jobs, GPUs and GPU seconds per rule of the plan (the Snakefile's rules; the evaluation
    jobs, one rule each, under "evaluate", and a point's shards under "evaluate_shard")."""
    from setdlm.workflow.jobs import evaluation_jobs, job_resources

    rules: dict[str, RuleCost] = {}

    def add(rule, gpus, jobs=1, seconds=0.0, bound=0.0, task=None):
        cost = rules.setdefault(rule, RuleCost(rule))
        cost.jobs += jobs
        cost.gpus = max(cost.gpus, gpus)
        used = gpus * (jobs * JOB_OVERHEAD_S + seconds) if gpus else 0.0
        bounded = gpus * (jobs * JOB_OVERHEAD_S + bound) if gpus else 0.0
        cost.gpu_seconds += used
        cost.bound_seconds += bounded
        if task is not None:
            part = cost.tasks.setdefault(task, [0, 0.0, 0.0])
            part[0], part[1], part[2] = part[0] + jobs, part[1] + used, part[2] + bounded

    def gpus(stage):
        return plan.resources(stage)["gpus"]

    for _ in plan.datasets_from("hub"):
        add("prepare_data", gpus("data"))
    for _ in plan.datasets_from("dir"):  # a data directory's file: a local rule
        add("copy_data", 0)
    if plan.data:
        add("data_manifest", 0)
    seeded = set(plan.seeded_models())
    for name in plan.trained:
        if name not in seeded:
            add("train_model", gpus("train"))
    for name, _ in plan.trained_seeds:
        if name not in plan.copied:
            add("train_model_seed", gpus("train"))
    for _ in plan.copied:
        add("copy_reference", 0)
    for _ in plan.fetched_domains():
        add("fetch", gpus("fetch"))
    for job in evaluation_jobs(plan).values():
        per_job = job_resources(plan, job)["gpus"]
        if job.shards > 1:  # its examples decoded by its shards, then merged and scored
            seconds, bound = point_cost(plan, job.points[0])
            task = job.points[0].task
            add("evaluate_shard", per_job, job.shards, seconds, bound, task)
            add("evaluate", per_job, 1, 0.0, 0.0, task)
            continue
        for index, point in enumerate(job.points):  # one job: its overhead counted once
            seconds, bound = point_cost(plan, point)
            add("evaluate", per_job, int(index == 0), seconds, bound, point.task)
    for _ in jobs_of_aggregation(plan):
        add("aggregate", 0)
    for table in plan.tables():
        add(f"table_{table}", 0)
    if plan.figure_files():
        add("figures", 0)
    if plan.curve_files():
        add("learning_curves", 0)
    add("sync_mlflow", 0)
    add("all_tables", 0)
    return list(rules.values())


def jobs_of_aggregation(plan) -> list:
    from setdlm.workflow.jobs import aggregations

    return list(aggregations(plan))


def render(rules: list[RuleCost]) -> str:
    """The bill as a table, the total, and the model it was priced with."""
    lines = [
        f"{'rule':22s} {'jobs':>6s} {'GPUs/job':>9s} {'GPU hours':>10s} {'bound':>10s}",
    ]
    for cost in rules:
        lines.append(
            f"{cost.rule:22s} {cost.jobs:6d} {cost.gpus:9d} {cost.gpu_seconds / 3600:10.1f} "
            f"{cost.bound_seconds / 3600:10.1f}"
        )
        for task, (jobs, used, bounded) in cost.tasks.items():
            lines.append(
                f"  {task:20s} {jobs:6d} {'':9s} {used / 3600:10.1f} {bounded / 3600:10.1f}"
            )
    jobs = sum(cost.jobs for cost in rules)
    estimate = sum(cost.gpu_seconds for cost in rules) / 3600
    bound = sum(cost.bound_seconds for cost in rules) / 3600
    lines.append(f"{'total':22s} {jobs:6d} {'':9s} {estimate:10.1f} {bound:10.1f}")
    lines += [
        "",
        "GPU hours = GPUs x (jobs x "
        f"{JOB_OVERHEAD_S:.0f} s overhead + examples x tokens / (tokens per second at batch 1)); "
        "every example is priced at batch 1, though only the timed ones decode one at a time "
        "(the others in batches: fewer hours); the bound decodes every example's whole budget. "
        "Speeds: SPEC 6.1's published GSM8K "
        "tok/s by family, size and τ (other sizes, MDLM and the other tasks as "
        "setdlm/workflow/cost.py states); likelihood: sequences x length / "
        f"{FORWARD_TOKENS_PER_S:.0f} tok/s.",
    ]
    for task, (tokens, why) in TASK_TOKENS.items():
        lines.append(f"  {task}: {tokens} tokens per example ({why})")
    return "\n".join(lines)
