"""A GSM8K-shaped problem: a question and a worked solution ending in ``#### <answer>``.

Its own module so that the synthetic arithmetic generator (and the workflow schema, which lists
its versions) can name it without loading the GSM8K task and torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    id: str  # "<split>-<row index>": stable across sources and limits
    question: str
    answer: str  # the reference solution, ending with "#### <number>"

    @property
    def text(self) -> str:
        """The whole problem as a training document: the question, then its solution."""
        return f"{self.question}\n{self.answer}"
