"""Rewards that fail are never silent: a component that raises on every call, returns NaN for most items
for several steps, an environment whose score() is NaN or a word. Each failed item gets the fallback and
counts in `reward/<name>_failures` (`env` for the environment's score); past `reward.failures` the run
stops in one line naming the component and its first failure, after a checkpoint, with a critical
`reward_failures` event. A few NaN scores are counted and named, and the run trains on."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, tiny_overrides
from scalerl.config import load_config
from scalerl.errors import RewardsFailing
from scalerl.jsonl import read_metrics
from scalerl.monitor.events import read_events
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer import loop

HERE = Path(__file__).resolve().parent


def _config(runs, name, **extra):
    return load_config(overrides=tiny_overrides(runs, name, **{"train.steps": 6, "eval.every": 0, **extra}))


def test_a_reward_raising_on_every_call_stops_the_run_in_one_line(runs, fault):
    over = tiny_overrides(runs, "run", **{"train.steps": 4, "eval.every": 0, "reward.components": [
        {"name": "exact", "env": True}, {"name": "bad", "function": "bad_scores:raises"}]})
    args = [a for k, v in over.items() for a in ("--set", f"{k}={json.dumps(v) if isinstance(v, list) else v}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}"}
    got = subprocess.run([sys.executable, "-m", "scalerl.cli.main", "train", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    errors = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert got.returncode == 2 and len(errors) == 1, got.stderr
    line = errors[0]
    assert "reward component 'bad' failed on every item: 16 of 16 at step 1" in line and "ZeroDivisionError" in line, line
    assert line.endswith("no step had finished, nothing to save: fix the reward and start again"), line  # no --resume to offer
    events = [e for e in read_events(runs / "run") if e["rule"] == "reward_failures"]
    assert len(events) == 1 and events[0]["severity"] == "critical" and events[0]["component"] == "bad"
    assert events[0]["share"] == 1.0
    fault("reward components", "a function component that raises ZeroDivisionError on every call",
          f"exit 2 at step 1, one line: {line[:150]}...; a critical reward_failures event (share 1.0)")


def test_most_items_failing_for_steps_in_a_row_stops_after_a_checkpoint(runs, fault):
    config = _config(runs, "run", **{"checkpoint.every": 0, "reward.components": [
        {"name": "exact", "env": True}, {"name": "shaky", "function": "bad_scores:mostly_nan", "fallback": -1.0}]})
    with pytest.raises(RewardsFailing) as err:
        loop.train(config)
    message = str(err.value)
    assert "'shaky' failed on more than 50% of the items for 3 steps in a row" in message and "12 of 16 at step 3" in message
    assert "item 1" in message and "the checkpoint of step 2 is saved: fix the reward, then resume with --resume" in message, message
    rows = read_metrics(runs / "run")
    assert [r["reward/shaky_failures"] for r in rows] == [12.0, 12.0] and [r["reward/failed_share"] for r in rows] == [0.75, 0.75]
    newest = ckpt.latest_checkpoint(runs / "run" / "checkpoints")
    assert newest.name == "step_0000002" and ckpt.verify_checkpoint(newest) is None
    fault("reward components", "a function component returning NaN for 3 of 4 items every step (checkpoint.every 0)",
          "reward/shaky_failures 12 and reward/failed_share 0.75 per step; stopped at step 3 (3 steps above 50%) naming "
          "'shaky' and its first bad item; checkpoint of step 2 saved and verified")


@pytest.mark.parametrize("env_class, shown", [("NaNEnv", "nan"), ("WordEnv", "nan")])
def test_an_environment_scoring_nan_or_a_word_is_named(runs, fault, env_class, shown):
    config = _config(runs, "run", **{"env.name": f"bad_scores:{env_class}"})
    with pytest.raises(RewardsFailing) as err:
        loop.train(config)
    message = str(err.value)
    assert "reward component 'env' failed on every item: 16 of 16 at step 1" in message, message
    assert f"{env_class}.score returned {shown} (NaN, inf or not a number) for item 0" in message, message
    assert not (runs / "run" / "metrics.jsonl").exists() or read_metrics(runs / "run") == []
    fault("environments", f"an environment whose score() returns {'NaN' if env_class == 'NaNEnv' else 'a string'} for every item",
          f"stopped at step 1: {message[:140]}...")


def test_a_few_nan_scores_are_counted_and_the_run_trains_on(runs, fault):
    config = _config(runs, "run", **{"env.name": "bad_scores:QuarterNaNEnv"})
    summary = loop.train(config)
    rows = read_metrics(runs / "run")
    assert summary["steps"] == 6 and len(rows) == 6
    assert [r["reward/env_failures"] for r in rows] == [4.0] * 6 and [r["reward/failed_share"] for r in rows] == [0.25] * 6
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["reward_mean"]) for r in rows)
    fault("environments", "an environment whose score() is NaN for one item in four, 6 steps",
          "trained to the end with finite losses; reward/env_failures 4 of 16 each step, reward/failed_share 0.25")
