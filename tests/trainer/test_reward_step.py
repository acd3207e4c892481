"""The reward path of a real run: worker pool, dynamic cap, diversity penalty and sample dumps, wired
into the trainer (each piece's own numbers are tested in tests/rewards/)."""

from __future__ import annotations

import json
import math

import pytest

from scalerl.config import load_config
from scalerl.jsonl import read_metrics
from scalerl.trainer.loop import train
from conftest import tiny_overrides


def _run(runs, name, **extra):
    summary = train(load_config(overrides=tiny_overrides(runs, name, **{"train.steps": 4, "eval.every": 0, **extra})))
    return summary, read_metrics(summary["run_dir"])


def test_defaults_leave_the_reward_as_the_environment_score(runs):
    _, rows = _run(runs, "plain")
    for r in rows:
        assert r["reward_mean"] == pytest.approx(r["task_reward_mean"])
        assert "reward_cap" not in r and "diversity_similarity" not in r


@pytest.mark.slow
def test_workers_cap_diversity_and_dump_in_one_run(runs):
    """Two reward workers give the in-process run's rewards exactly (same seed, same samples, same
    scores); the cap switches on after its warm-up; the penalty lowers the mean reward by w times
    the mean similarity; every second step is dumped."""
    base, base_rows = _run(runs, "base", **{"reward.diversity.weight": 0.5})
    summary, rows = _run(runs, "all", **{"reward.num_workers": 2, "reward.diversity.weight": 0.5, "reward.dump_every": 2,
                                         "reward.cap.enabled": True, "reward.cap.window": 4, "reward.cap.warmup_steps": 2})
    for r, b in zip(rows[:2], base_rows[:2]):  # identical until the cap acts: same batches, scored in workers
        assert (r["task_reward_mean"], r["reward_mean"]) == pytest.approx((b["task_reward_mean"], b["reward_mean"]), abs=1e-6)
    assert rows[0]["reward_cap"] is None and rows[1]["reward_cap"] is None  # warm-up: 2 steps in the window first
    assert rows[2]["reward_cap"] is not None and 0.0 <= rows[2]["reward_cap"] <= 1.0
    for r in rows[:2]:  # no cap yet: reward = env score − 0.5 · similarity
        assert r["reward_mean"] == pytest.approx(r["task_reward_mean"] - 0.5 * r["diversity_similarity"], abs=1e-5)
        assert 0.0 < r["diversity_similarity"] <= 1.0
    assert all(r["reward/env_failures"] == 0 and r["reward/failed_share"] == 0 for r in rows)
    dumps = sorted(p.name for p in (runs / "all" / "samples").glob("step_*"))  # beside them: eval_step_*.jsonl, every evaluation's few
    assert dumps == ["step_000002.jsonl", "step_000004.jsonl"]
    lines = [json.loads(x) for x in (runs / "all" / "samples" / "step_000002.jsonl").read_text().splitlines()]
    assert len(lines) == 16 and {"prompt", "completion", "reward"} <= set(lines[0])
    assert all(math.isfinite(r["loss"]) for r in rows)
