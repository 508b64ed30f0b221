"""The result files of an evaluation run.

``samples.jsonl`` gets one JSON line per finished example, appended, flushed and fsynced, so a
killed run loses at most the example in flight. Reading it back drops a torn last line (a
partial write) and truncates the file to its last complete line, so the resumed run appends
cleanly. ``metrics.json`` is written atomically, and only when every example is present.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


class SampleLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[str, dict]:
        """Finished examples by id; a torn last line is removed from the file."""
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        records, good_bytes = {}, 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn write: the process died in the middle of this line
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break
            records[str(record["id"])] = record
            good_bytes += len(line)
        if good_bytes < len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(good_bytes)
                os.fsync(handle.fileno())
        return records

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def example_seed(base_seed: int, example_id: str) -> int:
    """A seed that depends only on (base seed, example id): not on batch, order or process."""
    digest = hashlib.blake2b(f"{base_seed}:{example_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def config_hash(values: dict) -> str:
    """Identity of a result: the hash of its resolved configuration."""
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
