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
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, tiny_overrides
from stopping_rewards import stops_on
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


def _rank_pids(launcher: int) -> dict[int, int]:
    """{RANK: pid} of the torchrun workers below `launcher` (processes whose environment torchrun set)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
            pid = int(entry.name)
            while pid > 1 and pid != launcher:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if pid == launcher and "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
            found[int(env["RANK"])] = int(entry.name)
    return found


@pytest.mark.slow  # two torchrun ranks to a checkpoint, then the deadline: about 30 s on 2 cores
def test_a_stopped_torchrun_rank_is_reported_within_the_deadline(runs, tmp_path, fault):
    """`scalerl train --nproc 2` (gloo): rank 1 stopped after a checkpoint; rank 0's next collective times out at
    health.hang.deadline_s (torch's default: 30 minutes) and the run ends in one line naming the silent rank."""
    root = runs / "peer" / "checkpoints"
    log = tmp_path / "stderr.txt"
    overrides = tiny_overrides(runs, "peer", **{"train.steps": 400, "checkpoint.every": 2, "eval.every": 0,
                                                 "health.hang.deadline_s": DEADLINE_S})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "scalerl.cli.main", "train", "--nproc", "2", *_args(overrides)], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    ranks: dict[int, int] = {}
    try:
        _wait_for(lambda: ckpt.latest_checkpoint(root) is not None, proc, "the first checkpoint", timeout=240)
        ranks = _rank_pids(proc.pid)
        assert sorted(ranks) == [0, 1], ranks
        stopped = ranks[1]
        os.kill(stopped, signal.SIGSTOP)
        stopped_at = time.monotonic()
        kept = ckpt.latest_checkpoint(root)
        # without health.hang.deadline_s, rank 0 would wait torch's default 30 minutes and this wait would fail
        _wait_for(lambda: "did not answer" in log.read_text(), proc, "rank 0's line", timeout=DEADLINE_S + MARGIN_S + 60)
        elapsed = time.monotonic() - stopped_at
        # torchrun then sends the stopped rank SIGTERM and, 30 s later (torch 2.13's fixed wait when no restart is
        # left), SIGKILL: that wait is torch's, not what this test measures, so the SIGKILL comes at once
        _release(stopped)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        for pid in ranks.values():  # the stopped rank above all; the others if the launcher went first
            _release(pid)
    text = log.read_text()
    line = next((line for line in text.splitlines() if "did not answer" in line), text[-3000:])
    assert proc.returncode not in (0, None)
    assert line.startswith(f"error: rank 0 of 2 waited {DEADLINE_S} s in a collective and rank 1 did not answer "
                           f"(health.hang.deadline_s={DEADLINE_S})"), line
    assert elapsed < DEADLINE_S + MARGIN_S, elapsed
    newest = ckpt.latest_checkpoint(root)
    assert newest is not None and newest.name >= kept.name and str(newest) in line and ckpt.verify_checkpoint(newest) is None
    hangs = [e for e in read_events(runs / "peer") if e["rule"] == "hang"]
    assert len(hangs) == 1 and hangs[0]["part"] == "torchrun peer (rank 1)", hangs
    fault("hangs", f"SIGSTOP of rank 1 of `scalerl train --nproc 2` (gloo) after its checkpoint (health.hang.deadline_s={DEADLINE_S})",
          f"rank 0 reported it in one line naming rank 1 and the deadline, {elapsed:.0f} s after the stop; the launcher "
          "exited non-zero; the last checkpoint verified; a `hang` event in events.jsonl")


def test_a_stopped_reward_function_worker_is_replaced_and_reported(runs, tmp_path, fault, monkeypatch):
    """The function component's worker stops itself (SIGSTOP) in its second call: the call is given up at the
    component's timeout_s, the worker killed and replaced, the batch's completions get the fallback, a `hang` event
    names the component, and the run goes on. (One hung call fails every item of its step, which by default stops
    the run as a reward failing on every item does — `reward.failures`, tests/reliability/test_failing_rewards.py; here
    that rule is off, to see the hang handled alone.)"""
    marker = tmp_path / "stopped.pid"
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent))
    monkeypatch.setenv("SCALERL_TEST_STOPPED_PID", str(marker))
    component = {"name": "stops", "function": "stopping_rewards:stops_on_second_call", "timeout_s": 3}
    overrides = tiny_overrides(runs, "rw", **{"train.steps": 4, "eval.every": 0, "reward.failures.stop_when_all_fail": False,
                                              "reward.components": json.dumps([{"name": "env", "env": True}, component])})
    try:
        proc = subprocess.run([sys.executable, "-m", "scalerl.cli.main", "train", *_args(overrides)], cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180)
    finally:
        _release(int(marker.read_text()) if marker.exists() else None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()  # the worker did stop itself
    rows = read_metrics(runs / "rw")
    assert [r["reward/stops_hangs"] for r in rows] == [0.0, 1.0, 0.0, 0.0]
    assert [r["reward/stops_failures"] for r in rows] == [0.0, 16.0, 0.0, 0.0]  # the stopped call's 16 completions
    assert [r["reward/stops_mean"] for r in rows] == [1.0, 0.0, 1.0, 1.0]  # fallback 0, then a fresh worker answers
    assert rows[1]["reward/stops_restarts"] == 1.0
    hangs = [e for e in read_events(runs / "rw") if e["rule"] == "hang"]
    assert [(e["step"], e["part"]) for e in hangs] == [(2, "reward component stops")], hangs
    assert "reward component 'stops'" in hangs[0]["message"] and "replaced" in hangs[0]["action"]
    fault("hangs", "a reward function's worker process stops itself (SIGSTOP) in its second call (timeout_s=3, CLI, 4 steps)",
          "exit 0, all 4 steps; step 2's 16 completions got the fallback (reward/stops_failures 16, _hangs 1, _restarts 1); "
          "a fresh worker answered steps 3-4; a `hang` event naming the component")


def test_a_stopped_reward_pool_worker_is_given_up_and_the_pool_replaced(tmp_path, fault):
    """reward.num_workers: the pool worker that scores item "stop" stops itself (SIGSTOP) mid-call; its chunk is given
    up once nothing has come back for deadline_s (its items get fail_value, counted), the pool is killed and rebuilt,
    and the next call scores everything."""
    from scalerl.rewards.workers import RewardPool

    marker = tmp_path / "stopped.pid"
    items = [("stop" if i == 5 else "ok", str(marker)) for i in range(16)]
    pool = RewardPool(2, fail_value=-1.0, deadline_s=3)
    pool.start()
    try:
        start = time.monotonic()
        answer: dict = {}  # without a deadline the call waits forever: bounded here, it fails instead
        caller = threading.Thread(target=lambda: answer.update(first=pool.map_scores(stops_on, items)), daemon=True)
        caller.start()
        caller.join(timeout=3 + MARGIN_S + 30)
        assert "first" in answer, "the call never returned"
        first = answer["first"]
        elapsed = time.monotonic() - start
        metrics = pool.pop_metrics()
        second = pool.map_scores(stops_on, items)
    finally:
        _release(int(marker.read_text()) if marker.exists() else None)
        pool.close()
    lost = [i for i, score in enumerate(first) if score == -1.0]
    assert 5 in lost and set(first) == {1.0, -1.0} and len(lost) < 16, first  # the stopped chunk at the fallback, the rest scored
    assert metrics["reward_hung_workers"] == 1.0 and metrics["reward_failed_items"] == len(lost), metrics
    assert metrics["reward_pool_restarts"] == 1.0
    assert second == [1.0] * 16
    assert elapsed < 3 + MARGIN_S, elapsed
    fault("hangs", "a reward pool worker (reward.num_workers=2) SIGSTOPs itself mid-call, deadline_s=3 (unit)",
          f"the call returned after {elapsed:.0f} s with the {len(lost)} items of the stopped chunk at the fallback, the other "
          f"{16 - len(lost)} scored; counted (reward_hung_workers 1); the pool killed and rebuilt; the next call scored all 16")


def test_a_vllm_call_past_the_deadline_is_reported_once_and_a_prompt_one_never():
    """The vLLM engine runs in the trainer's process, so its generate call cannot be interrupted: the watchdog
    (`Overrun`, wrapped around VLLMSampler's generate and weight reload) says in one line that it overran."""
    from scalerl.distributed.watchdog import Overrun

    lines: list[str] = []
    reported = threading.Event()
    with Overrun("vLLM engine's generate call (8 requests)", 0.2, lambda line: (lines.append(line), reported.set())) as slow:
        assert reported.wait(30)  # the call "hangs" until the watchdog has spoken
    assert slow.overran and len(lines) == 1
    assert lines[0].startswith("the vLLM engine's generate call (8 requests) has not returned after 0.2 s (health.hang.deadline_s)")
    with Overrun("vLLM engine's generate call (8 requests)", 0.5, lines.append) as quick:
        pass
    time.sleep(1.0)  # past its deadline: a call that returned is never reported
    assert not quick.overran and len(lines) == 1
