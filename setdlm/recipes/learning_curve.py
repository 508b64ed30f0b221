"""Learning curves of the arithmetic models: accuracy along training, not only at its end.

Every ``every`` steps the trainer hands the model, holding its EMA weights (what an evaluation
loads), to ``ArithmeticProbe``, which solves the first ``problems`` arithmetic test problems at
τ = 1e6 (one token per forward, greedy) in one static batch and scores them with the GSM8K
extraction, as the arithmetic-solve task does. The trainer restores every RNG afterwards, so a
curve changes no weight. Lines go to ``probes.jsonl`` beside ``losses.jsonl``; ``setdlm train``
copies both into the model folder (``learning_curve.jsonl``, ``losses.jsonl``), where the
report's learning-curve table and figure read them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

CURVE_FILE = "learning_curve.jsonl"
LOSSES_FILE = "losses.jsonl"
DEFAULT_PROBLEMS = 200


@dataclass
class ArithmeticProbe:
    every: int
    examples: list  # setdlm.eval.runner.Example, the task's own
    task: object  # setdlm.tasks.arithmetic_task.ArithmeticTask
    tokenizer: object

    @classmethod
    def for_model(
        cls, model, tokenizer, every: int, problems: int, generator: str, budget: int | None = None
    ):
        """The probe of ``problems`` test problems of ``generator``, decoded with ``budget``
        new tokens (None: the task's default); a budget too short for some solution under
        ``tokenizer`` is an error (ArithmeticTask.examples)."""
        from setdlm.tasks.arithmetic_task import ArithmeticSettings, ArithmeticTask

        settings = ArithmeticSettings(limit=problems, generator=generator)
        if budget is not None:
            settings = replace(settings, max_new_tokens=budget)
        task = ArithmeticTask(settings)
        return cls(every, task.examples(tokenizer, model), task, tokenizer)

    def measure(self, model: torch.nn.Module, step: int) -> dict:
        from setdlm.core.decoding import DecodeConfig
        from setdlm.tasks.arithmetic_task import arithmetic_decode_config

        started = time.perf_counter()
        base = arithmetic_decode_config(model, DecodeConfig())
        config = self.task.decode_config(base, self.tokenizer)
        output = model.generate([example.input_ids for example in self.examples], config)
        solved = [
            self.task.score(example, self.task.output_text(example, ids, self.tokenizer))
            for example, ids in zip(self.examples, output.new_token_ids, strict=True)
        ]
        return {
            "accuracy": sum(score["strict_match"] for score in solved) / len(solved),
            "problems": len(solved),
            "nfe": output.nfe,
            "probe_seconds": round(time.perf_counter() - started, 3),
        }
