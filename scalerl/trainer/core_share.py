"""Share the CPU cores with other processes: torch's thread count follows the cores they leave free.

Two jobs that each run torch with one thread per core fight over the cores: OpenMP's worker threads
spin while they wait for the next parallel region, so each job's threads keep the other's off the
cores (measured on 2 cores: two 30-step default jobs took 22–33 s each at once against 8 s alone,
while at one thread each they took 11 s). With `train.threads` unset, the loop keeps torch's own
choice while the job is alone and lowers it, between steps, to the cores that other processes leave
free, raising it back when they finish (`CoreShare`). Linux only (it reads /proc/stat); elsewhere, and
with `train.threads` set, the thread count stays fixed.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

__all__ = ["CoreShare", "threads_for"]

log = logging.getLogger(__name__)
PROC_STAT = Path("/proc/stat")


def threads_for(cores: int, others_busy: float, max_threads: int) -> int:
    """The thread count that leaves other processes their cores:

        threads = clamp(round(cores − others_busy), 1, max_threads)

    `cores`: the CPUs this process may run on; `others_busy`: how many of them other processes (ours
    not included) kept busy on average over the last window, in cores."""
    return max(1, min(max_threads, round(cores - max(others_busy, 0.0))))


def _busy_jiffies(cpus: set[int], text: str) -> tuple[int, int]:
    """(busy, total) clock ticks summed over the `cpuN` lines of /proc/stat for N in `cpus`."""
    busy = total = 0
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


class CoreShare:
    """Adapts `torch.set_num_threads` to the cores that other processes leave free (see `threads_for`).

    Call `update()` between steps; it measures at most once per `window_s` seconds: the busy ticks of
    this process's CPUs in /proc/stat over the window, less this process's own CPU time, are the other
    processes' load. A change of the thread count is logged at INFO."""

    def __init__(self, max_threads: int | None = None, window_s: float = 1.0):
        self.max_threads = max_threads or torch.get_num_threads()
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        self.window_s = window_s
        self.enabled = self.max_threads > 1 and PROC_STAT.is_file()
        self.threads = self.max_threads
        self.others_busy = 0.0
        self._last = self._sample() if self.enabled else None

    def _sample(self) -> tuple[float, float, int, int]:
        busy, total = _busy_jiffies(self.cpus, PROC_STAT.read_text())
        return time.monotonic(), time.process_time(), busy, total

    def update(self) -> int:
        """Re-measure when the window has passed and set torch's thread count; returns it."""
        if not self.enabled:
            return self.threads
        now = self._sample()
        wall, cpu, busy, total = (b - a for a, b in zip(self._last, now))
        if wall < self.window_s or total <= 0:
            return self.threads
        self._last = now
        # busy share of the window's ticks, in cores; our own CPU time taken out
        busy_cores = len(self.cpus) * busy / total
        self.others_busy = max(0.0, busy_cores - cpu / wall)
        threads = threads_for(len(self.cpus), self.others_busy, self.max_threads)
        if threads != self.threads:
            log.info("other processes keep %.1f of %d cores busy: torch threads %d -> %d",
                     self.others_busy, len(self.cpus), self.threads, threads)
            torch.set_num_threads(threads)
            self.threads = threads
        return self.threads
