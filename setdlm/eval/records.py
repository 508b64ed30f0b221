"""The result files of an evaluation run.

``samples.jsonl`` gets one JSON line per finished example, appended, flushed and fsynced, so a
killed run loses at most the example in flight. Reading it back keeps the first complete line
of each id and rewrites the file without torn, malformed or repeated lines, so the resumed run
appends cleanly and never writes an id twice. ``metrics.json`` is written atomically, and only
when every example is present.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from setdlm.util.files import atomic_write_bytes, naming_write_errors


class SampleLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[str, dict]:
        """Finished examples by id: the first complete line of each id.

        A torn line (a process killed mid-write, or two writers interleaved), a line that is
        not a JSON record with an id, and a repeat of an id already read are dropped, and the
        file is rewritten (atomically) with the kept lines only, so a resumed run appends to a
        clean log and never finds an id twice. Every complete line of a finished example is
        kept, wherever it stands in the file.
        """
        records, kept, dropped = self.scan()
        if dropped:
            atomic_write_bytes(self.path, b"".join(kept))
        return records

    def scan(self) -> tuple[dict[str, dict], list[bytes], bool]:
        """Read without repairing: (the first complete record of each id, their lines, whether
        any line was dropped as torn, malformed or repeated)."""
        records, kept, dropped = {}, [], False
        if not self.path.exists():
            return records, kept, dropped
        for line in self.path.read_bytes().splitlines(keepends=True):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("torn line")
                record = json.loads(line)
                example_id = str(record["id"])
            except (ValueError, KeyError, TypeError):
                dropped = True
                continue
            if example_id in records:
                dropped = True
                continue
            records[example_id] = record
            kept.append(line)
        return records, kept, dropped

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n"
        with naming_write_errors(self.path), open(self.path, "a", encoding="utf-8") as handle:
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


BATCH_1 = "batch 1"  # how the protocol of a batch-1 run starts


def speed_protocol(records: list[dict]) -> str:
    """How sample records were timed, in words that say what their tokens/s compares with
    (records without batching fields, written before they existed, were static batches)."""
    sizes = sorted({r.get("batch_size", 1) for r in records})
    kinds = sorted({r.get("batching", "static") for r in records})
    if sizes == [1]:
        return f"{BATCH_1}: per-example tok/s, the paper's speed protocol"
    largest = sizes[-1]
    if kinds == ["continuous"]:
        way = f"continuous batching, {largest} slots"
    else:
        way = f"static batches of up to {largest}"
    return (
        f"{way}: evaluation throughput (aggregate tok/s); per-example tok/s are under load, "
        "not comparable with the paper's batch-1 speed"
    )
