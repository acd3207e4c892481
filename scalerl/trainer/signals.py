"""SIGTERM and SIGINT stop a run cleanly: the step in progress finishes, a checkpoint is written,
and the run ends with `Stopped` (exit code 128 + the signal's number from the CLI); a second
signal aborts at once. Schedulers (Slurm, Kubernetes) send SIGTERM before they kill.

    with GracefulStop() as stop:
        for step in ...:
            if stop.requested(ctx): save; raise Stopped(...)

The handler only records the signal (and writes one line to stderr with os.write, which is safe in
a handler); the loop acts on it between steps, agreed across ranks so all stop after the same step.
"""

from __future__ import annotations

import os
import signal
import threading

import torch

from scalerl.distributed.context import DistContext
from scalerl.errors import Stopped

__all__ = ["GracefulStop", "Stopped"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """Installs the two handlers for the duration of a `with` block (main thread only; elsewhere,
    e.g. a run started from a worker thread, signals keep their default behaviour)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # the second one: abort now (the finally blocks still close workers)
            os.write(2, f"\n{name} again: aborting now, without a checkpoint\n".encode())
            raise KeyboardInterrupt
        self.signum = signum
        os.write(2, f"\n{name}: finishing the current step, then saving a checkpoint and stopping "
                    f"(send it again to abort at once)\n".encode())

    def requested(self, ctx: DistContext) -> int | None:
        """The signal that asks to stop, on any rank (every rank gets the same answer), or None."""
        if not ctx.active:
            return self.signum
        anyone = ctx.sum(torch.tensor([1.0 if self.signum else 0.0])).item() > 0
        return (self.signum or signal.SIGTERM) if anyone else None
