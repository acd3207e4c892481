"""`scalerl auto-shard`: the interval rule on known profiles, and a real profile's YAML as a config."""

from __future__ import annotations

import pytest

from conftest import run_cli, tiny_overrides
from scalerl.jobs.auto_shard import TensorProfile, assign_intervals, communication_fraction


def _p(name: str, step: float, numel: int = 100) -> TensorProfile:
    return TensorProfile(name, numel, 4 * numel, step, 1.0)


def test_interval_rule_keeps_every_tensors_drift_between_syncs_within_the_fastests_two_steps():
    profiles = [_p("fast", 1e-2), _p("half", 5e-3), _p("fifth", 2e-3), _p("slow", 1e-4), _p("between", 3e-3, 300)]
    interval = assign_intervals(profiles)
    assert interval == {"fast": 2, "half": 2, "fifth": 10, "slow": 10, "between": 5}
    assert all(interval[p.name] * p.relative_step <= 2 * 1e-2 + 1e-15 for p in profiles)
    # bytes per step over a full sync: (100/2 + 100/2 + 100/10 + 100/10 + 300/5) / 700
    assert communication_fraction(profiles, interval) == pytest.approx(180 / 700)


def test_auto_shard_writes_param_groups_that_a_run_loads(tmp_path):
    from scalerl.config import load_config
    from scalerl.models.loading import load_model

    out = tmp_path / "shard.yaml"
    args = [a for k, v in tiny_overrides(tmp_path / "runs", "x").items() for a in ("--set", f"{k}={v}")]
    done = run_cli("-m", "scalerl.cli.main", "auto-shard", "--steps", "3", "--out", str(out), *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "communication per step:" in done.stdout and "of a full gradient sync" in done.stdout
    config = load_config(out)
    assert config.parallel.strategy == "dynamic" and {g.sync_interval for g in config.parallel.param_groups} <= {2, 5, 10}
    names = [n for g in config.parallel.param_groups for n in g.params]
    policy = load_model(config.model, __import__("torch").device("cpu"))
    assert sorted(names) == sorted(n for n, _ in policy.named_parameters())  # every tensor in exactly one group
    assert not (tmp_path / "runs" / "x").exists()  # the profile ran in a scratch folder
