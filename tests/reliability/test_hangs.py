"""Parts that stop answering (SIGSTOP: alive, connected, silent) are reported within `health.hang.deadline_s`
in one line naming the part, instead of leaving the run waiting forever: the async rollout producer, a reward
worker (a function component's, and one of the reward.num_workers pool), one rank of `scalerl train --nproc 2`.

Each test stops the part for real and bounds its own wait with a subprocess or call timeout, so a hang shows as a
failure rather than a stuck suite; the stopped process is always continued and killed afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, tiny_overrides
from scalerl.jsonl import read_metrics
from scalerl.monitor.events import read_events
from scalerl.trainer import checkpoint as ckpt

DEADLINE_S = 5
MARGIN_S = 25  # the learner's poll, the checkpoint, the process's exit, a loaded 2-core machine
ASYNC = {"rollout.mode": "async", "algorithm.tis_cap": 2.0, "rollout.producer_threads": 1}


def _release(pid: int | None) -> None:
    """Continue and kill a stopped process (it may be gone already)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            if pid:
                os.kill(pid, sig)
        except ProcessLookupError:
            return


def _args(overrides: dict) -> list[str]:
    return [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert proc.poll() is None, f"the run ended before {what}: {proc.stderr.read()[-3000:] if proc.stderr else ''}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.1)
    return found


def test_a_stopped_async_producer_is_reported_and_the_run_stops_with_a_checkpoint(runs, tmp_path, fault):
    run = runs / "hung"
    log = tmp_path / "stderr.txt"
    overrides = tiny_overrides(runs, "hung", **ASYNC, **{"train.steps": 500, "eval.every": 0, "checkpoint.every": 0,
                                                          "health.hang.deadline_s": DEADLINE_S})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "scalerl.cli.main", "train", *_args(overrides)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    producer = None
    try:
        said = _wait_for(lambda: re.search(r"async: the rollout producer is process (\d+)", log.read_text()), proc, "the producer's pid")
        producer = int(said.group(1))
        _wait_for(lambda: (run / "metrics.jsonl").exists() and len(read_metrics(run)) >= 2, proc, "step 2")
        os.kill(producer, signal.SIGSTOP)
        stopped_at = time.monotonic()
        proc.wait(timeout=DEADLINE_S + MARGIN_S + 30)  # today: waits forever, so this raises TimeoutExpired
        elapsed = time.monotonic() - stopped_at
    finally:
        proc.kill()
        _release(producer)
    last = log.read_text().strip().splitlines()[-1]
    assert proc.returncode == 2, last
    assert last.startswith(f"error: the async rollout producer (process {producer} beside the learner) sent no heartbeat for "), last
    assert f"(health.hang.deadline_s={DEADLINE_S})" in last and "it was killed" in last, last
    assert elapsed < DEADLINE_S + MARGIN_S, elapsed
    finished = read_metrics(run)[-1]["step"]
    newest = ckpt.latest_checkpoint(run / "checkpoints")
    assert newest is not None and newest.name == f"step_{finished:07d}" and str(newest) in last, (newest, finished, last)
    assert ckpt.verify_checkpoint(newest) is None
    assert json.loads((newest / "trainer_state.json").read_text())["step"] == finished
    hangs = [e for e in read_events(run) if e["rule"] == "hang"]
    assert len(hangs) == 1 and hangs[0]["part"] == "async rollout producer" and hangs[0]["severity"] == "critical", hangs
    fault("hangs", f"SIGSTOP of the async rollout producer process after step {finished} (health.hang.deadline_s={DEADLINE_S})",
          f"reported in {elapsed:.0f} s in one line naming the producer's pid; exit 2; a checkpoint of step {finished} "
          "written and verified; a `hang` event in events.jsonl")
