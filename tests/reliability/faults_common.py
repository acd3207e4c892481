"""Shared by the fault tests: a tiny stateful run, its CLI arguments, and the comparisons that say
a run survived a fault (same metrics, same final weights as the run that had none)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, run_cli, tiny_overrides
from scalerl.config import load_config
from scalerl.jsonl import read_metrics
from scalerl.trainer import loop

TIMING = {"tokens_per_s", "step_time_s", "eval_time_s"}
# several epochs and micro-batches, a KL penalty, a decaying lr with warm-up, a checkpoint every 2 steps
STATEFUL = {"algorithm.kl.beta": 0.05, "train.epochs": 2, "train.mini_batch_size": 8, "train.micro_batch_size": 4,
            "optim.schedule": "linear", "optim.warmup_steps": 2, "checkpoint.every": 2, "checkpoint.keep_last": 4,
            "train.steps": 8}


def overrides(runs: Path, name: str, **extra) -> dict:
    return tiny_overrides(runs, name, **{**STATEFUL, **extra})


def train(runs: Path, name: str, resume: bool = False, **extra) -> dict:
    return loop.train(load_config(overrides=overrides(runs, name, **extra)), resume=resume)


def cli_args(runs: Path, name: str, **extra) -> list[str]:
    return [arg for key, value in overrides(runs, name, **extra).items() for arg in ("--set", f"{key}={value}")]


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING and not k.startswith("time/")} for row in rows]


def same_run(a: Path, b: Path, step: int) -> bool:
    """The two runs logged the same metrics (wall-clock figures aside) and hold the same weights at `step`."""
    weights = f"checkpoints/step_{step:07d}/model.safetensors"
    return (without_timing(read_metrics(a)) == without_timing(read_metrics(b))
            and (a / weights).read_bytes() == (b / weights).read_bytes())


def start_cli(*args: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "scalerl.cli.main", "train", *args], cwd=ROOT, env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True)


def run_cli_train(*args: str, timeout: float = 300, process: bool = False) -> subprocess.CompletedProcess:
    """`scalerl train ARGS` to its end: in this process (conftest.run_cli) unless `process`, where what the run does
    could harm the test process (a planted pickle, hostile reward code). The faults themselves (kills, signals, a
    full disk) are injected into the runs of `start_cli` and the tests' own processes."""
    return run_cli("-m", "scalerl.cli.main", "train", *args, timeout=timeout, process=process)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until metrics.jsonl holds a row for `step` (the run is past it)."""
    deadline = time.time() + timeout
    while True:
        rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        if rows and rows[-1]["step"] >= step:
            return
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, f"the run never reached step {step}"
        time.sleep(0.02)
