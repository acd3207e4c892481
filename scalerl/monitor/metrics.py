"""Where a step's metrics go: `metrics.jsonl`, TensorBoard event files, and the optional sinks of
`sinks.py` (Prometheus, W&B, MLflow), from rank 0 only."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any, Sequence

from scalerl.files import writing
from scalerl.jsonl import read_log, write_log_atomically
from scalerl.monitor.sinks import Sink


def _clean(value: Any) -> Any:
    """JSON-safe scalars: NaN/Inf become null (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class EventsTail:
    """Reads the complete lines appended to `events.jsonl` (the health monitor's) since the last call;
    a line still being written (no newline yet) waits for the next call."""

    def __init__(self, path: Path):
        self.path, self._offset = path, 0

    def read_new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        if self.path.stat().st_size < self._offset:  # rewritten (a resumed run drops its crashed tail)
            self._offset = 0
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]


class MetricsLogger:
    """Appends one JSON object per step to `metrics.jsonl`, mirrors scalars to TensorBoard, and hands
    each step (and new rows of `events.jsonl`) to the sinks."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, resume_after: int | None = None,
                 sinks: Sequence[Sink] = ()):
        self.path = run_dir / "metrics.jsonl"
        self._sinks = list(sinks)
        self._events = EventsTail(run_dir / "events.jsonl")
        if resume_after is not None:
            self._truncate_after(resume_after)
        self._file = open(self.path, "a", buffering=1)
        self._tb = None
        self._tb_dir = run_dir / "tensorboard"
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_writer_threads()
            self._tb = SummaryWriter(log_dir=str(self._tb_dir), purge_step=None if resume_after is None else resume_after + 1)

    def _truncate_after(self, step: int) -> None:
        """Drop rows a crashed run wrote after its last checkpoint, so the resumed log has each step once."""
        if self.path.exists():  # atomically: a kill now leaves the old log or the new one, never an empty one
            write_log_atomically(self.path, [row for row in read_log(self.path) if row.get("step", 0) <= step])

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with writing(self.path):
            self._file.write(json.dumps(row) + "\n")
        if self._tb is not None:
            with writing(self._tb_dir):
                for key, value in metrics.items():
                    if isinstance(value, (int, float)) and value is not None and math.isfinite(value):
                        self._tb.add_scalar(key, value, step)
        for sink in self._sinks:
            sink.log(step, metrics)
        self._forward_events()

    def text(self, step: int, tag: str, text: str) -> None:
        """A text entry in TensorBoard (sample completions), when TensorBoard is on."""
        if self._tb is not None:
            self._tb.add_text(tag, text, step)

    def before(self, metrics: dict[str, float]) -> None:
        """Step 0's scalars (the untrained model's evaluation): to TensorBoard and the sinks, where the curves then start
        at the baseline; not to metrics.jsonl, whose rows are training steps (summary.json keeps pass_rate_before)."""
        if self._tb is not None:
            with writing(self._tb_dir):
                for key, value in metrics.items():
                    self._tb.add_scalar(key, value, 0)
        for sink in self._sinks:
            sink.log(0, metrics)

    def _forward_events(self) -> None:
        if self._sinks and (rows := self._events.read_new()):
            for sink in self._sinks:
                sink.events(rows)

    def close(self) -> None:
        try:
            with writing(self.path):
                self._file.close()
        finally:
            if self._tb is not None:
                with writing(self._tb_dir):
                    self._tb.close()
        try:
            self._forward_events()  # events the monitor wrote after the last step
        finally:
            for sink in self._sinks:
                sink.close()


def _quiet_writer_threads() -> None:
    """TensorBoard writes from a thread of its own; a failed write (a read-only or full disk) ends that thread,
    which prints its traceback, and the writer raises the same error at our next call, where `MetricsLogger`
    names the folder in the run's one line. So that thread's own traceback is left out; any other thread's stays."""
    previous = threading.excepthook
    if getattr(previous, "scalerl_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not (isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread"):
            previous(args)

    hook.scalerl_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class NullLogger:
    """What ranks other than 0 log to."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def text(self, step: int, tag: str, text: str) -> None:
        pass

    def before(self, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass
