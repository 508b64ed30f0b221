"""Evaluations: every task decodes with the shared engine and measures quality and speed in the
same run, writing ``samples.jsonl`` (one line per example, resumable) and ``metrics.json``."""
