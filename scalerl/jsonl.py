"""JSONL files: the ones users hand us (tasks, prompts, preference pairs), read with one-line
errors, and the logs the trainer appends to (metrics.jsonl, events.jsonl), read tolerating the torn
last line of a killed run and rewritten atomically on resume.

Each caller checks the fields it needs; this only turns a file into its JSON objects, naming the
config key (`where`), the file and the line when something is wrong.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError
from scalerl.files import write_atomically

log = logging.getLogger(__name__)


def read_objects(path: Path | str, *, expected: str, where: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of `path`.

    `expected` says what a line holds, for the messages (e.g. "'prompt' and 'answer'"); `where` is
    the config key that named the file. An empty file is an error too: nothing to train on.
    """
    path = Path(path)
    prefix = f"{where}: " if where else ""
    if os.path.isdir(path):
        raise ScaleRLError(f"{prefix}{path} is a directory; give a JSONL file with {expected} on each line")
    if not os.path.isfile(path):
        raise ScaleRLError(f"{prefix}{path} does not exist; give a JSONL file with {expected} on each line")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ScaleRLError(f"{prefix}{path}: cannot read it ({err.strerror}); give a readable JSONL file") from None
    rows = []
    for i, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8-sig" if i == 1 else "utf-8")  # a BOM may open the file
        except UnicodeDecodeError as err:
            raise ScaleRLError(f"{prefix}{path}:{i}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                               f"save the file as UTF-8 JSONL, one object with {expected} per line") from None
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


def read_log(path: Path | str) -> list[dict[str, Any]]:
    """The rows of a JSONL log the trainer appends to (metrics.jsonl, events.jsonl); [] when absent.

    A last line without its newline that is not valid JSON is what a kill mid-write leaves: it is
    dropped with a warning. A bad line anywhere else is damage, a one-line ScaleRLError naming it.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if i == len(lines):  # no newline after it: the torn last write of a killed run
                log.warning("%s: dropped a torn last line (%d bytes; the run was killed mid-write)", path, len(line))
                continue
            raise ScaleRLError(f"{path}:{i}: not valid JSON; the file is damaged (restore it, or delete the line)") from None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def write_log_atomically(path: Path | str, rows: list[dict[str, Any]]) -> None:
    """Replace a JSONL log with `rows`: written to a temporary file beside it, fsynced, then renamed
    over it (and the folder fsynced), so a kill at any moment leaves the old file or the new one."""
    write_atomically(path, "".join(json.dumps(row) + "\n" for row in rows))


def read_metrics(run_dir: Path | str) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl, one dict per logged step (the monitor writes it; the
    forecasts, the report and the health replay read it). A torn last line is dropped (`read_log`)."""
    return read_log(Path(run_dir) / "metrics.jsonl")
