"""Reading the JSONL files users hand us (tasks, prompts, preference pairs), with one-line errors.

Each caller checks the fields it needs; this only turns a file into its JSON objects, naming the
config key (`where`), the file and the line when something is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError


def read_objects(path: Path | str, *, expected: str, where: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of `path`.

    `expected` says what a line holds, for the messages (e.g. "'prompt' and 'answer'"); `where` is
    the config key that named the file. An empty file is an error too: nothing to train on.
    """
    path = Path(path)
    prefix = f"{where}: " if where else ""
    if not path.is_file():
        raise ScaleRLError(f"{prefix}{path} does not exist; give a JSONL file with {expected} on each line")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ScaleRLError(f"{prefix}{path}:{i}: not valid JSON ({err.msg}); each line is one object with {expected}") from None
        if not isinstance(row, dict):
            raise ScaleRLError(f"{prefix}{path}:{i}: not a JSON object; each line is one object with {expected}")
        rows.append((i, row))
    if not rows:
        raise ScaleRLError(f"{prefix}{path} holds no rows; add JSONL lines with {expected}")
    return rows


def read_metrics(run_dir: Path | str) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl, one dict per logged step (the monitor writes it; the
    forecasts, the report and the health replay read it)."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
