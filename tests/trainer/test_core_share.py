"""Sharing the cores: torch's thread count follows what other processes leave free (scalerl/trainer/core_share.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.jsonl import read_metrics
from scalerl.trainer import bookkeeping, core_share, loop
from scalerl.trainer.core_share import CoreShare, _busy_jiffies, threads_for


@pytest.mark.parametrize("cores, others, max_threads, expected", [
    (2, 0.0, 2, 2), (2, 0.3, 2, 2), (2, 0.9, 2, 1), (2, 1.9, 2, 1), (8, 2.6, 8, 5), (8, 0.0, 4, 4), (4, -0.2, 4, 4),
])
def test_threads_for_leaves_the_busy_cores(cores, others, max_threads, expected):
    assert threads_for(cores, others, max_threads) == expected


def test_busy_ticks_count_only_this_process_cpus_and_not_idle_or_iowait():
    text = ("cpu  900 0 900 900 900 0 0 0 0 0\n"
            "cpu0 10 1 5 100 7 2 3 4 0 0\n"   # busy 10+1+5+2+3+4 = 25 of 132
            "cpu1 50 0 50 0 0 0 0 0 0 0\n"    # busy 100 of 100
            "cpu2 999 0 0 1 0 0 0 0 0 0\n"    # not ours
            "intr 12345\nctxt 99\n")
    assert _busy_jiffies({0, 1}, text) == (125, 232)


@pytest.mark.serial
@pytest.mark.skipif(not core_share.PROC_STAT.is_file() or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux /proc/stat and 2 or more cores")
def test_threads_drop_while_another_process_is_busy_and_come_back_after():
    before = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    share = CoreShare(max_threads=cores, window_s=0.5)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores - 1)]
    try:
        time.sleep(1.0)
        assert share.update() == 1, f"others busy {share.others_busy:.2f} of {cores} cores"
        assert torch.get_num_threads() == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()
    try:
        time.sleep(1.0)
        assert share.update() == cores, f"others busy {share.others_busy:.2f} of {cores} cores"
        assert torch.get_num_threads() == cores
    finally:
        torch.set_num_threads(before)


def test_the_loop_adapts_threads_between_steps_only_when_they_are_unset(runs, monkeypatch):
    calls = []

    class Recording(CoreShare):
        def update(self) -> int:
            calls.append(1)
            return 7  # what the loop logs is what the share decided

    monkeypatch.setattr(bookkeeping, "CoreShare", Recording)
    summary = loop.train(load_config(overrides=tiny_overrides(runs, "auto", **{"train.threads": None, "train.steps": 3,
                                                                                "eval.every": 0})))
    rows = read_metrics(runs / "auto")
    assert [r["threads"] for r in rows] == [7, 7, 7]
    assert len(calls) == 3  # before each step
    assert summary["steps"] == 3

    calls.clear()
    loop.train(load_config(overrides=tiny_overrides(runs, "fixed", **{"train.steps": 2, "eval.every": 0})))
    assert calls == [] and [r["threads"] for r in read_metrics(runs / "fixed")] == [1, 1]
