"""A rank killed with SIGKILL under `scalerl train --nproc 2` (torchrun, FSDP2 on gloo) stops every rank
within a bounded time with a one-line error naming the checkpoint to resume from; --resume then
continues from it, with two processes and with one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli, tiny_overrides
from scalerl.trainer.checkpoint import latest_checkpoint


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ranks_of(parent: int) -> dict[int, int]:
    """{RANK: pid} of the torchrun workers below `parent` (processes whose environment torchrun set)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit():
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
            pid = int(entry.name)
            while pid > 1 and pid != parent:
                pid = _parent(pid)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if pid == parent and "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
            found[int(env["RANK"])] = int(entry.name)
    return found


def _kill_rank1_after_checkpoint(proc: subprocess.Popen, root: Path, step: int = 4) -> dict[int, int]:
    """Wait until checkpoint `step` of the run under `proc` is complete, then SIGKILL its rank 1; returns {rank: pid}."""
    deadline = time.monotonic() + 240
    while (latest_checkpoint(root) is None or int(latest_checkpoint(root).name[5:]) < step) and time.monotonic() < deadline:
        assert proc.poll() is None, "".join(proc.communicate())[-3000:]
        time.sleep(0.2)
    ranks = _ranks_of(proc.pid)
    assert sorted(ranks) == [0, 1], ranks
    os.kill(ranks[1], signal.SIGKILL)
    return ranks


def _args(runs: Path, steps: int, **extra) -> list[str]:
    overrides = tiny_overrides(runs, "killed", **{"train.steps": steps, "checkpoint.every": 2, "eval.every": 0,
                                                  "parallel.strategy": "fsdp2", **extra})
    return [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]


@pytest.mark.slow
def test_sigkill_of_one_rank_stops_all_and_the_run_resumes(tmp_path):
    runs, env = tmp_path / "runs", {**os.environ, "OMP_NUM_THREADS": "1"}
    root = runs / "killed" / "checkpoints"
    cli = [sys.executable, "-m", "scalerl.cli.main", "train"]
    proc = subprocess.Popen([*cli, "--nproc", "2", *_args(runs, 400)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ranks = _kill_rank1_after_checkpoint(proc, root)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=120)
        stopped_s = time.monotonic() - killed_at
    finally:
        proc.kill()
    assert proc.returncode not in (0, None)
    assert stopped_s < 30, f"took {stopped_s:.1f} s to stop every rank"
    assert not any(_alive(pid) for pid in ranks.values())  # rank 0 did not linger
    newest = latest_checkpoint(root)
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: a process of the run stopped") and str(newest) in last and "--resume --name killed" in last, last
    saved = int(newest.name[5:])
    assert saved < 400

    # resume with two processes for two more steps, then with one for two more
    for nproc, steps in ((2, saved + 2), (1, saved + 4)):
        done = run_cli("-m", "scalerl.cli.main", "train", "--nproc", str(nproc), "--resume", "--name", "killed", *_args(runs, steps))
        assert done.returncode == 0, done.stderr[-3000:]
        state = json.loads((latest_checkpoint(root) / "trainer_state.json").read_text())
        assert state["step"] == steps and state["world_size"] == nproc and state["learner"]["updates"] == steps
    rows = [json.loads(line) for line in (runs / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, saved + 5))  # the killed run's steps after its checkpoint are dropped
    assert [r["completions"] for r in rows[-4:]] == [32, 32, 16, 16]  # rollout.prompts_per_step is per rank


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_max_restarts_resumes_the_run_after_a_rank_is_killed(tmp_path):
    """`--max-restarts 1`: torchrun restarts both processes after the kill, and they resume the run
    from its newest checkpoint (TORCHELASTIC_RESTART_COUNT > 0) and finish it."""
    runs, env = tmp_path / "runs", {**os.environ, "OMP_NUM_THREADS": "1"}
    root = runs / "killed" / "checkpoints"
    proc = subprocess.Popen([sys.executable, "-m", "scalerl.cli.main", "train", "--nproc", "2", "--max-restarts", "1",
                             *_args(runs, 40, **{"log.console": "plain"})], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _kill_rank1_after_checkpoint(proc, root)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    resumed = [int(line.rsplit("resumed from step ", 1)[1].split()[0]) for line in out.splitlines() if "resumed from step " in line]
    assert resumed and resumed[0] >= 4, out[-3000:]
    rows = [json.loads(line) for line in (runs / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert json.loads((latest_checkpoint(root) / "trainer_state.json").read_text())["learner"]["updates"] == 40
