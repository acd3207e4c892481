"""A reward function whose worker process stops itself (SIGSTOP) during its second call, once per test: importable
as `stopping_rewards:stops_on_second_call` (tests/reliability is on sys.path under pytest; the CLI tests put it on
PYTHONPATH). Its pid goes to the file named by SCALERL_TEST_STOPPED_PID, so the test can release it. No torch import."""

from __future__ import annotations

import os
import signal
from pathlib import Path

CALLS = 0


def stops_on_second_call(prompts, completions, **kwargs):
    global CALLS
    CALLS += 1
    marker = Path(os.environ["SCALERL_TEST_STOPPED_PID"])
    if CALLS == 2 and not marker.exists():  # a replaced worker starts counting again: stop only once
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return [1.0] * len(completions)


def stops_on(item, marker: str) -> float:
    """A pool scorer (reward.num_workers): 1.0, but the worker that gets the item "stop" stops itself (once)."""
    if item == "stop" and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return 1.0
