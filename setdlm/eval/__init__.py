"""What every evaluation task shares: each task (a module of setdlm/tasks/) decodes with the
shared engine and measures quality and speed in the same run, writing ``samples.jsonl`` (one line
per example, resumable) and ``metrics.json`` through the runner, timing and records here, with
the bootstrap intervals, the shared metrics and the ``setdlm eval`` command."""
