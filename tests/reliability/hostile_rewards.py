"""Reward functions that attack their own worker process, importable as `hostile_rewards:<name>`
(tests/reliability is on sys.path under pytest; the CLI tests put it on PYTHONPATH). Each scores
every completion 1.0, so a score that was lost shows as the fallback. No torch import: workers
start fast. `echo` and `ones` are the well-behaved controls."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def _once_idle(action) -> None:
    """Run `action` from a thread as soon as this worker's main thread is back waiting for the next
    request (inside `Connection.recv`): after the function returned and its scores were sent, and
    long before the trainer's next call (a training step takes tens of milliseconds)."""
    main = threading.main_thread().ident

    def watch() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main)
            while frame is not None and frame.f_code.co_name != "recv":
                frame = frame.f_back
            if frame is not None:
                break
            time.sleep(0.001)
        action()

    threading.Thread(target=watch, daemon=True).start()


def exits_after_returning(prompts, completions, **kwargs):
    """Returns its scores, then a thread it started ends the worker with os._exit(0)."""
    _once_idle(lambda: os._exit(0))
    return [1.0] * len(completions)


def sigkills_after_returning(prompts, completions, **kwargs):
    """Returns its scores, then a thread it started SIGKILLs the worker."""
    _once_idle(lambda: os.kill(os.getpid(), signal.SIGKILL))
    return [1.0] * len(completions)


_CALLS = 0


def _signals_group_on_call_2(sig: int, completions) -> list[float]:
    """On its second call, sends `sig` to its whole process group (the trainer and every worker),
    as a Ctrl-C in a terminal or Slurm's scancel does, then finishes the call."""
    global _CALLS
    _CALLS += 1
    if _CALLS == 2:
        os.killpg(os.getpgrp(), sig)
        time.sleep(0.3)  # the signal has reached every process of the group by now
    return [1.0] * len(completions)


def sigterm_group_on_call_2(prompts, completions, **kwargs):
    return _signals_group_on_call_2(signal.SIGTERM, completions)


def sigint_group_on_call_2(prompts, completions, **kwargs):
    return _signals_group_on_call_2(signal.SIGINT, completions)


def ones(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def sleeps(prompts, completions, **kwargs):
    """Busy for a minute: a call that is still running when the trainer is killed."""
    time.sleep(60)
    return [1.0] * len(completions)


def echo(x) -> float:
    """A pool scorer (`RewardPool`): the item itself."""
    return float(x)
