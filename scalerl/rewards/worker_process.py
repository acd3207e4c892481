"""What every reward worker process does first (`safe_call.FunctionWorker`, `workers.RewardPool`).

- It ignores SIGINT and SIGTERM. A Ctrl-C in a terminal goes to the whole foreground process group
  and Slurm's scancel sends SIGTERM to every process of the job; the trainer handles both itself
  (scalerl/trainer/signals.py: it finishes the step, checkpoints, then closes its workers). A worker
  that died of the signal instead would turn that last step's rewards into fallbacks.
  The handler is a Python function that does nothing, not SIG_IGN: an ignored signal stays ignored
  across exec, so every program a reward function starts (a sandbox, a compiler) would ignore
  SIGTERM too, while a handler is reset to the default by exec. Blocking calls interrupted by the
  signal are resumed (PEP 475), so a call in progress carries on.
- It exits when the trainer is gone, even if killed with SIGKILL (nothing can catch that): a thread
  waits on a handle that becomes ready only when the trainer process has ended, then ends the
  worker at once. Otherwise a worker busy in a long call, or a pool worker (whose task queue never
  reports end-of-file, since the worker holds a writer of it too), would outlive the run.
- The forkserver that starts the pool's workers is a process of the run too: a SIGTERM to every
  process would kill it, and the executor reads its death as the death of every worker (their
  exit statuses come through it), so the pool would break mid-step. `protect_forkserver` makes the
  forkserver import this module when it starts, and on that import (and only there) the module
  installs the same handlers. Multiprocessing's forkserver already ignores SIGINT itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from multiprocessing.connection import wait
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _carry_on(signum: int, frame: Any) -> None:
    """The trainer stops the run and then closes its workers; the worker itself ignores the signal."""


def ignore_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _carry_on)


def exit_with_parent(handle: Any) -> None:
    """Start a daemon thread that ends this process as soon as `handle` (a Connection or a file
    descriptor that nothing is ever written to) reports end-of-file, i.e. its writer, the trainer,
    has exited."""

    def watch() -> None:
        wait([handle])  # ready only at end-of-file: nothing is ever sent
        os._exit(0)  # the trainer is gone: nobody is left to answer

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def protect_forkserver() -> None:
    """Add this module to the forkserver's preload list, so that a forkserver started from now on
    ignores SIGTERM (one already running keeps what it has)."""
    from multiprocessing import forkserver

    modules = getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None)
    if modules is None or __name__ in modules:
        return
    forkserver.set_forkserver_preload([*modules, __name__])


def _imported_by_the_forkserver() -> bool:
    """Whether this import is the forkserver's preload (its `main` is on the stack)."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    main = getattr(forkserver, "main", None)
    frame = sys._getframe(1)
    while main is not None and frame is not None:
        if frame.f_code is main.__code__:
            return True
        frame = frame.f_back
    return False


if _imported_by_the_forkserver():
    ignore_stop_signals()
