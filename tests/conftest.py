"""Shared helpers: a tiny, fast training config on the built-in model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tiny_overrides(run_dir: Path, name: str, **extra) -> dict:
    """A few seconds of training: 4 prompts x 4 completions, 6 steps, 16 held-out tasks."""
    overrides = {
        "rollout.prompts_per_step": 4, "rollout.group_size": 4, "train.steps": 6, "train.threads": 1,
        "eval.every": 3, "eval.max_tasks": 16, "log.run_dir": str(run_dir), "log.name": name, "log.console": "none",
    }
    overrides.update(extra)
    return overrides


def run_cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a console entry point of this checkout (`python -m ...`), capturing its output."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)


def pytest_addoption(parser):
    parser.addoption("--reliability-doc", default=None, metavar="PATH",
                     help="write the fault-injection suite's table of faults and outcomes (tests/reliability/) to PATH")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"
