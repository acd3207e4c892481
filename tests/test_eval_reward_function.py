"""`scalerl eval RUN` on a run whose reward was a function (env reward_model has no verifier): scored with the
run's own reward pipeline instead of refused."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, run_cli, tiny_overrides


@pytest.mark.slow
def test_eval_scores_a_function_reward_run(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "length_reward.py").write_text("def score(prompts, completions, **kw):\n"
                                              "    return [min(len(c), 10) / 10 for c in completions]\n")
    overrides = tiny_overrides(tmp_path / "runs", "fn", **{"train.steps": 2, "eval.every": 0, "env.name": "reward_model",
                                                          "rollout.max_new_tokens": 4})
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    env = {"PYTHONPATH": f"{ROOT}:{plugins}"}
    trained = run_cli("-m", "scalerl.cli.main", "train", *sets, "--set", "reward.components=[{name: length, function: 'length_reward:score'}]",
                      env=env, timeout=300)
    assert trained.returncode == 0, trained.stderr[-2000:]
    out = tmp_path / "eval.json"
    proc = run_cli("-m", "scalerl.cli.main", "eval", str(tmp_path / "runs" / "fn"), "--max-tasks", "4", "--json", str(out),
                   env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["env"] == "reward_model" and result["tasks"] == 4 and result["scored_by"] == "the run's reward: length"
    assert 0 < result["pass_rate"] <= 1.0  # the length reward of real completions (4 new tokens: never empty)
    assert "scored by the run's reward: length" in proc.stdout and proc.stdout.startswith("mean reward ")
    assert result["interval"] == "normal"  # a reward's scores are no proportion, even when every one is 0 or 1


def test_eval_still_refuses_a_verifierless_env_without_a_reward():
    proc = run_cli("-m", "scalerl.cli.main", "eval", "builtin", "--env", "reward_model", "--max-tasks", "2", timeout=120)
    assert proc.returncode == 2 and "has no verifier and no run's reward" in proc.stderr
