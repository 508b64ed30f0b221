"""Reading JSON-lines data files with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path

from setdlm.util.errors import DataError


def read_jsonl(
    path: str | Path, required: tuple[str, ...] = (), limit: int | None = None
) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line; every ``required`` key must be a string."""
    rows = []
    try:
        return _read(path, rows, required, limit)
    except UnicodeDecodeError as error:
        from setdlm.data.mirror import not_utf8

        raise not_utf8(path, error) from None


def _read(path, rows: list, required: tuple[str, ...], limit: int | None) -> list:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{number}: not valid JSON ({error})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {row!r:.80}")
            for key in required:
                if not isinstance(row.get(key), str):
                    raise DataError(f"{path}:{number}: key {key!r} is missing or not a string")
            rows.append((number, row))
    return rows
