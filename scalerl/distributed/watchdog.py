"""Deadlines for the parts of a run that answer from elsewhere (`health.hang.deadline_s`).

A part that stops answering (stopped with SIGSTOP, swapped out, deadlocked, on a lost host) never
closes its connection, so a blocking receive would wait forever. Each such wait here has a
deadline, and what went silent is said in one line naming the part:

- the async rollout producer: a thread of the producer process bumps a counter in the pair link's
  store every `beat_s` seconds (`Heartbeat`); the learner runs each blocking transfer (a batch, the
  weights) on a thread of its own and watches the counter meanwhile (`wait_answered`), so a slow
  batch is never mistaken for a hang, and a stopped producer (every thread stopped) is;
- torchrun peers: the process group's timeout is the deadline, so a collective waiting for a stopped
  rank raises on the others (`peer_silent` turns gloo's message into the line);
- a vLLM generate call runs in this process and cannot be interrupted: `Overrun` reports one that
  takes longer than the deadline, once, and the call goes on.

Reward workers have deadlines of their own (reward component `timeout_s`; the pool of
`reward.num_workers`: scalerl/rewards/workers.py).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from scalerl.errors import ScaleRLError

HEARTBEAT_KEY = "scalerl-async-heartbeat"
POLL_S = 0.1


class Hung(ScaleRLError):
    """A part stopped answering within its deadline; `part` names it (the `hang` event's field)."""

    def __init__(self, message: str, *, part: str):
        super().__init__(message)
        self.part = part


def beat_s(deadline_s: float) -> float:
    """A heartbeat's period: several beats per deadline, so one late beat is not a hang."""
    return min(deadline_s / 5, 2.0)


class Heartbeat:
    """A daemon thread of the watched process that bumps `HEARTBEAT_KEY` in the store at `host:port`
    every `period_s`; it ends quietly when the store goes away (the learner exited)."""

    def __init__(self, host: str, port: int, period_s: float):
        self.store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60))
        self.period_s = period_s
        self.store.add(HEARTBEAT_KEY, 1)
        threading.Thread(target=self._run, name="heartbeat", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self.period_s)
            try:
                self.store.add(HEARTBEAT_KEY, 1)
            except (RuntimeError, OSError):  # the learner and its store are gone: nobody listens
                return


class HeartbeatWatch:
    """The watching side: how long since the counter last moved (its own connection to the store)."""

    def __init__(self, port: int):
        self.store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
        self.count, self.changed = 0, time.monotonic()

    @property
    def started(self) -> bool:
        return self.count > 0

    def silent_s(self) -> float:
        count = self.store.add(HEARTBEAT_KEY, 0)
        if count != self.count:
            self.count, self.changed = count, time.monotonic()
        return time.monotonic() - self.changed


def wait_answered(fn: Callable[[], Any], *, alive: Callable[[], bool], silent_s: Callable[[], float], limit_s: Callable[[], float],
                  on_death: Callable[[], Any], on_silence: Callable[[float], Any]) -> Any:
    """`fn()`, run on a daemon thread while this one watches: `on_death()` when the other side is gone,
    `on_silence(seconds)` once it has been silent for `limit_s()` (both are expected to raise). An exception
    of `fn` is raised here. A thread left blocked after a silence ends when the other side is killed."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as err:  # handed to the watching thread
            result["error"] = err

    thread = threading.Thread(target=run, name="answer", daemon=True)
    thread.start()
    while True:
        thread.join(POLL_S)
        if not thread.is_alive():
            break
        if not alive():
            thread.join(POLL_S)  # an answer that raced the death still counts
            if thread.is_alive():
                on_death()
        if (silent := silent_s()) > limit_s():
            on_silence(silent)
    if "error" in result:
        raise result["error"]
    return result["value"]


def peer_silent(err: BaseException, rank: int, world_size: int, deadline_s: float) -> ScaleRLError | None:
    """The one-line error for a collective that timed out waiting for a stopped peer rank, or None when `err` is
    something else. gloo says "Timed out waiting Nms for recv operation" (torch 2.13); NCCL's watchdog "timed out"."""
    if world_size < 2 or not isinstance(err, RuntimeError) or "timed out" not in str(err).lower():
        return None
    peers = "rank 1" if world_size == 2 and rank == 0 else "rank 0" if world_size == 2 else f"one of the other {world_size - 1} ranks"
    return Hung(f"rank {rank} of {world_size} waited {deadline_s:g} s in a collective and {peers} did not answer "
                f"(health.hang.deadline_s={deadline_s:g}): that process is stopped, hung or on a lost host (raise the deadline if "
                "one rank legitimately works alone that long)", part=f"torchrun peer ({peers})")


class Overrun:
    """Reports a call in this process that runs past the deadline (one line, once per call); it cannot stop it.

        with Overrun("vLLM generate call", deadline_s, report):
            outputs = llm.generate(...)
    """

    def __init__(self, part: str, deadline_s: float, report: Callable[[str], None]):
        self.part, self.deadline_s, self.report = part, deadline_s, report
        self.done = threading.Event()
        self.overran = False

    def __enter__(self) -> "Overrun":
        def watch() -> None:
            if not self.done.wait(self.deadline_s):
                self.overran = True
                self.report(f"the {self.part} has not returned after {self.deadline_s:g} s (health.hang.deadline_s); it runs "
                            "in this process and cannot be interrupted: the run waits for it (stop it with Ctrl-C, which "
                            "checkpoints after the step, or raise the deadline if generation is only slow)")

        threading.Thread(target=watch, name="overrun-watch", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
