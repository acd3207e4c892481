"""Where a step's metrics go: `metrics.jsonl` and TensorBoard event files, from rank 0 only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON-safe scalars: NaN/Inf become null (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLogger:
    """Appends one JSON object per step to `metrics.jsonl` and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, resume_after: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        if resume_after is not None:
            self._truncate_after(resume_after)
        self._file = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=None if resume_after is None else resume_after + 1)

    def _truncate_after(self, step: int) -> None:
        """Drop rows a crashed run wrote after its last checkpoint, so the resumed log has each step once."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and value is not None and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


class NullLogger:
    """What ranks other than 0 log to."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
